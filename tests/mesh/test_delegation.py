"""A full delegation across three deployers, verified by the service, in-process and from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path as FilePath

import pytest

from countersign.records import CoSignerRole, Path
from countersign.state import InMemoryState
from countersign.verify import DEFAULT_POLICY, Mode, verify_path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import now_ms, sha256

pytestmark = pytest.mark.daemons


VERDICT_FIELDS = ("verdict", "reason", "index", "detail")


def verdict_fields(verdict: dict[str, object]) -> dict[str, object]:
    """The four verdict fields. (The SDK client does not map the attribution yet; the verifier sends
    it, tests/mesh/test_policy_remote.py checks it on the wire.)"""
    return {key: verdict[key] for key in VERDICT_FIELDS}


def cli_verify(mesh: LocalMesh, path_file: FilePath, output_file: FilePath) -> tuple[int, dict[str, object], str]:
    tls = mesh.tls_for("client")
    argv = [sys.executable, "-m", "countersign_cli", "verify", "--path", str(path_file), "--output", str(output_file)]
    argv += ["--verifier", mesh.daemons["verifier-0"].address, "--ca", tls.ca, "--cert", tls.cert]
    argv += ["--tls-key", tls.key]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout + done.stderr
    return done.returncode, json.loads(lines[0]), done.stderr


def test_planner_researcher_writer_with_receipts(mesh: LocalMesh, tmp_path: FilePath) -> None:
    a, b, c = (mesh.runtime(d) for d in ("deployer-a", "deployer-b", "deployer-c"))
    verifier = mesh.verifier_client()
    keys = {d: k.key_id for d, k in mesh.deployer_keys.items()}

    planner = a.root("planner-1", "trip-planning")
    plan = b"plan: research flights, then write the summary\n"
    planner_receipt = a.receipt(planner, sha256(plan), session="planner-1")

    researcher = b.accept(planner, a.open_grant(planner, "deployer-b"), mesh.daemons["deployer-a"].address, "res-1")
    notes = b"notes: three direct flights found\n"
    researcher_receipt = b.receipt(researcher, sha256(notes), session="res-1")

    writer = c.accept(researcher, b.open_grant(researcher, "deployer-c"), mesh.daemons["deployer-b"].address, "wr-1")
    report = b"final report: take the 09:10 flight\n"
    final = c.receipt(writer, sha256(report), session="wr-1")

    # The final path: planner -> researcher -> writer -> the writer's output receipt.
    records = [e.record for e in final.envelopes]
    assert [r.deployer for r in records] == ["deployer-a", "deployer-b", "deployer-c", "deployer-c"]
    assert [r.depth for r in records] == [0, 1, 2, 3]
    assert [r.agent.instance for r in records[:3]] == ["planner-1", "res-1", "wr-1"]
    assert {r.agent.system for r in records} == {"trip-planning"}
    assert final.envelopes[:3] == writer.envelopes
    assert records[3].output is not None
    assert records[3].output.sha256 == "sha256:" + sha256(report).hex()
    for index in range(1, 4):
        assert records[index].parent == final.envelopes[index - 1].digest()

    # Exactly two cross-deployer edges, each co-signed by the parent and the child deployer.
    cross = [i for i in range(1, 4) if records[i - 1].deployer != records[i].deployer]
    assert cross == [1, 2]
    for index in cross:
        parent, child = records[index - 1], records[index]
        assert [(s.role, s.deployer, s.key_id) for s in child.cosigs] == [
            (CoSignerRole.PARENT, parent.deployer, keys[parent.deployer]),
            (CoSignerRole.CHILD, child.deployer, keys[child.deployer]),
        ]
    assert records[0].cosigs == ()
    assert records[3].cosigs == ()

    # The intermediate receipts verify too (audit: nothing consumed).
    for receipt, output in ((planner_receipt, plan), (researcher_receipt, notes)):
        verdict = verifier.verify(receipt.to_bytes(), output, audit=True)
        result, sequence = verdict.result, verdict.registry_sequence
        assert result, result
        assert sequence == 3

    # In-process: the library's verdict against the registry the coordinator serves.
    operator = mesh.operator_client()
    registry = operator.log().registry
    operator.close()
    offline = verify_path(
        Path.from_bytes(final.to_bytes()), report, registry=registry, state=InMemoryState(), mode=Mode.ACCEPT,
        now_ms=now_ms(), policy=DEFAULT_POLICY,
    )  # fmt: skip
    assert verdict_fields(offline.to_json()) == {"verdict": "ACCEPT", "reason": None, "index": None, "detail": ""}
    assert offline.attribution is not None
    assert (offline.attribution.emitter.deployer, offline.attribution.emitter.session) == ("deployer-c", "wr-1")
    audited = verifier.verify(final.to_bytes(), report, audit=True).result
    assert audited.to_json() == offline.to_json()  # the client maps the service's attribution back

    # The CLI against the service: the same verdict object, exit 0; then the replay, exit 1.
    path_file, output_file = tmp_path / "path.json", tmp_path / "output.bin"
    path_file.write_bytes(final.to_bytes())
    output_file.write_bytes(report)
    code, verdict, stderr = cli_verify(mesh, path_file, output_file)
    assert (code, verdict_fields(verdict)) == (0, verdict_fields(offline.to_json())), stderr
    code, replayed, stderr = cli_verify(mesh, path_file, output_file)
    assert code == 1, stderr
    assert replayed["verdict"] == "REJECT"
    assert replayed["reason"] == "NONCE_REPLAYED"
    assert replayed["index"] == 3
    in_process = verifier.verify(final.to_bytes(), report).result
    assert in_process.to_json() == replayed

    # The same path with other output bytes is a mismatch (checked before the nonce).
    mismatch = verifier.verify(final.to_bytes(), report + b"!", audit=True).result
    assert (mismatch.reason, mismatch.index) == ("OUTPUT_MISMATCH", 3)
    for client in (a, b, c, verifier):
        client.close()


def test_plaintext_loopback_mesh(make_mesh: Callable[..., LocalMesh]) -> None:
    """``tls.insecure_loopback``: the same flow works without certificates, on loopback only."""
    mesh = make_mesh(tls=False, deployers=("deployer-a", "deployer-b"))
    a, b = mesh.runtime("deployer-a"), mesh.runtime("deployer-b")
    root = a.root("planner", "plaintext")
    child = b.accept(root, a.open_grant(root, "deployer-b"), mesh.daemons["deployer-a"].address, "researcher")
    assert len(child.leaf.record.cosigs) == 2
    output = b"plaintext answer\n"
    receipt = b.receipt(child, sha256(output))
    verifier = mesh.verifier_client()
    assert verifier.verify(receipt.to_bytes(), output).result
    assert verifier.verify(receipt.to_bytes(), output).result.reason == "NONCE_REPLAYED"
    for config in (mesh.workdir / "config").glob("*.toml"):
        assert "insecure_loopback = true" in config.read_text()
    for client in (a, b, verifier):
        client.close()
