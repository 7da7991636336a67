"""Metrics every daemon serves, and logs that never carry secrets."""

from __future__ import annotations

import base64
import json
import re

import pytest

from countersign.client import Grant
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import delegate, scrape, service_error, sha256

pytestmark = pytest.mark.daemons


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The sample of ``name`` with exactly ``labels`` (0 when absent)."""
    return next((v for found, v in samples.get(name, []) if found == labels), 0.0)


def test_metrics(mesh: LocalMesh) -> None:
    runtime = mesh.runtime("deployer-a")
    root = runtime.root("metrics", "metrics")
    before = {name: scrape(mesh, name) for name in mesh.daemons}

    child = delegate(mesh, root, "deployer-b", "r")  # one co-signature asked by deployer-b
    refused = Grant("0" * 32, "", mesh.deployer_keys["deployer-a"].key_id, "deployer-b", 0)  # never opened
    b = mesh.runtime("deployer-b")
    assert service_error(lambda: b.accept(root, refused, mesh.daemons["deployer-a"].address, "x")).code == (
        "PARENT_REFUSED"
    )
    output = b"measured\n"
    receipt = b.receipt(child, sha256(output))
    verifier = mesh.verifier_client()
    assert verifier.verify(receipt.to_bytes(), output).result
    assert verifier.verify(receipt.to_bytes(), output).result.reason == "NONCE_REPLAYED"
    assert verifier.verify(receipt.to_bytes(), output, audit=True).result  # audit ignores consumed nonces (spec 6.7)
    after = {name: scrape(mesh, name) for name in mesh.daemons}

    for name, daemon in mesh.daemons.items():
        samples = after[name]
        assert value(samples, "countersign_registry_sequence") == 3, name
        if daemon.kind != "coordinator":
            staleness = value(samples, "countersign_registry_staleness_seconds")
            assert 0 <= staleness < mesh.staleness_ms / 1000, (name, staleness)

    v_before, v_after = before["verifier-0"], after["verifier-0"]
    for labels in (
        {"verdict": "ACCEPT", "reason": "", "mode": "accept"},
        {"verdict": "REJECT", "reason": "NONCE_REPLAYED", "mode": "accept"},
        {"verdict": "ACCEPT", "reason": "", "mode": "audit"},
    ):
        delta = value(v_after, "countersign_verifications_total", **labels) - value(
            v_before, "countersign_verifications_total", **labels
        )
        assert delta == 1, labels
    for mode, calls in (("accept", 2), ("audit", 1)):
        count = value(v_after, "countersign_verify_seconds_count", mode=mode)
        assert count - value(v_before, "countersign_verify_seconds_count", mode=mode) == calls
        assert value(v_after, "countersign_verify_seconds_bucket", mode=mode, le="+Inf") == count
        assert value(v_after, "countersign_verify_seconds_sum", mode=mode) > 0

    b_before, b_after = before["deployer-b"], after["deployer-b"]
    for outcome in ("ok", "refused"):
        count = value(b_after, "countersign_cosign_seconds_count", outcome=outcome)
        assert count - value(b_before, "countersign_cosign_seconds_count", outcome=outcome) == 1, outcome
        assert value(b_after, "countersign_cosign_seconds_bucket", outcome=outcome, le="+Inf") == count
    # Where an issuance's time goes: each signer times its half of both delegations (the accepted
    # one and the refused one) and its state commits (the parent's grant and spend are synced).
    a_before, a_after = before["deployer-a"], after["deployer-a"]
    for samples_before, samples_after, method in (
        (b_before, b_after, "AcceptDelegation"),
        (a_before, a_after, "CoSignEdge"),
    ):
        count = value(samples_after, "countersign_signer_seconds_count", method=method)
        assert count - value(samples_before, "countersign_signer_seconds_count", method=method) == 2, method
        assert value(samples_after, "countersign_signer_seconds_bucket", method=method, le="+Inf") == count
        assert value(samples_after, "countersign_signer_seconds_sum", method=method) > 0
    # Every write is durable, through the group commit: the parent's grant and spend, the child's
    # proposals and seal; each batch's size is counted.
    for samples_before, samples_after in ((a_before, a_after), (b_before, b_after)):
        count = value(samples_after, "countersign_signer_commit_seconds_count", sync="full")
        assert count - value(samples_before, "countersign_signer_commit_seconds_count", sync="full") >= 2
        assert value(samples_after, "countersign_signer_commit_seconds_sum", sync="full") > 0
        batches = value(samples_after, "countersign_signer_commit_batch_count")
        assert batches - value(samples_before, "countersign_signer_commit_batch_count") >= 2
        assert value(samples_after, "countersign_signer_commit_batch_sum") >= batches
    # The parent decides but never accepts a delegation here, the child never co-signs.
    assert value(a_after, "countersign_signer_seconds_count", method="AcceptDelegation") == value(
        a_before, "countersign_signer_seconds_count", method="AcceptDelegation"
    )
    assert value(b_after, "countersign_signer_seconds_count", method="CoSignEdge") == value(
        b_before, "countersign_signer_seconds_count", method="CoSignEdge"
    )
    # The parent side never asks anyone: it observes no co-signing round trip.
    assert value(after["deployer-a"], "countersign_cosign_seconds_count", outcome="ok") == value(
        before["deployer-a"], "countersign_cosign_seconds_count", outcome="ok"
    )
    runtime.close()
    b.close()
    verifier.close()


def secrets_of(mesh: LocalMesh) -> dict[str, str]:
    """Every private value in the mesh's work directory: JWK "d" values (also as hex and standard
    base64) and the base64 body of each TLS private key (whole, and line by line)."""
    found: dict[str, str] = {}
    for key_file in sorted((mesh.workdir / "keys").glob("*.jwk")):
        d = json.loads(key_file.read_text())["d"]
        seed = base64.urlsafe_b64decode(d + "=" * (-len(d) % 4))
        found[f"{key_file.name} d"] = d
        found[f"{key_file.name} d (hex)"] = seed.hex()
        found[f"{key_file.name} d (base64)"] = base64.b64encode(seed).decode().rstrip("=")
    for key_file in sorted((mesh.workdir / "pki").glob("*.key")):
        lines = [line for line in key_file.read_text().splitlines() if line and not line.startswith("-----")]
        assert lines, key_file
        found[f"{key_file.name} body"] = "".join(lines)
        for index, line in enumerate(lines):
            found[f"{key_file.name} line {index}"] = line
    return found


def test_logs_hold_no_secrets(mesh: LocalMesh) -> None:
    a, b = mesh.runtime("deployer-a"), mesh.runtime("deployer-b")
    planner = a.root("planner-logs", "logs")
    researcher = delegate(mesh, planner, "deployer-b", "researcher-logs")
    writer = delegate(mesh, researcher, "deployer-c", "writer-logs")
    output = b"the-secret-output-bytes-9f3c1e\n"
    c = mesh.runtime("deployer-c")
    receipt = c.receipt(writer, sha256(output))
    verifier = mesh.verifier_client()
    assert verifier.verify(receipt.to_bytes(), output).result
    wrong_child = a.open_grant(planner, "deployer-c")  # and a refusal, so error paths log too
    assert service_error(lambda: b.accept(planner, wrong_child, mesh.daemons["deployer-a"].address, "x")).code == (
        "PARENT_REFUSED"
    )

    logs = {name: daemon.log_file.read_text(errors="replace") for name, daemon in mesh.daemons.items()}
    assert "edge co-signed" in logs["deployer-a"] and "delegation accepted" in logs["deployer-c"]  # logs exist
    secrets = secrets_of(mesh)
    assert len(secrets) > 20
    for name, text in logs.items():
        for what, secret in secrets.items():
            assert secret not in text, f"{name} logs {what}"
        assert output.decode().strip() not in text, f"{name} logs output bytes"
        assert not re.search(r"PRIVATE KEY", text), name
    for client in (a, b, c, verifier):
        client.close()
