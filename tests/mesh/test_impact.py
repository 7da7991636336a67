"""Revocation impact in a running mesh: the verifier logs its verdicts, marks those a revocation
reached when the revocation arrives on the registry stream (the metric moves), and the ``Impact``
RPC, the SDK's ``impact`` and ``countersign impact`` (``--state`` or ``--verifier``) all list exactly
them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable

import grpc
import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.admission import StatementKind
from countersign.client import AsyncVerifierClient, ImpactAnswer, SignerClient
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.coordinator.test_operator_cli import tls
from tests.mesh.helpers import channel_to, delegate, poll, scrape, service_error, sha256, verifier_stub

pytestmark = pytest.mark.daemons


def marked_by_revocations(mesh: LocalMesh) -> float:
    samples = scrape(mesh, "verifier-0").get("countersign_verdicts_needing_revalidation_total", [])
    return sum(value for labels, value in samples if labels.get("trigger") == "revoke_key")


def test_a_revocation_marks_the_verdicts_that_relied_on_the_key(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"))
    a, b = mesh.runtime("deployer-a"), mesh.runtime("deployer-b")
    verifier = mesh.verifier_client()
    b_key = mesh.deployer_keys["deployer-b"].key_id
    a_root = a.root("planner", "impact")
    via_b = delegate(mesh, a_root, "deployer-b", "worker")  # co-signed by b's key
    b_root = b.root("solo", "impact")
    relied_on_b: set[str] = set()
    records_of_b: set[str] = {via_b.leaf.digest(), b_root.leaf.digest()}

    def verify(
        parent: Path, runtime: SignerClient, request_id: str, *, audit: bool = False, wrong: bool = False
    ) -> bool:
        """Verify a new receipt under ``parent``; note it if it relied on deployer-b's key (every
        receipt deployer-b issues does, as does anything below the edge it co-signed)."""
        output = f"output {request_id}\n".encode()
        path = runtime.receipt(parent, sha256(output))
        result = verifier.verify(
            path.to_bytes(), b"other" if wrong else output, audit=audit, request_id=request_id
        ).result
        if result and path.leaf.record.deployer == "deployer-b":
            relied_on_b.add(request_id)
            records_of_b.add(path.leaf.digest())
        return bool(result)

    assert all(verify(via_b, b, f"via-b-{i}") for i in range(3))
    assert all(verify(b_root, b, f"b-{i}") for i in range(2))
    assert all(verify(a_root, a, f"a-{i}") for i in range(2))  # relied on deployer-a only
    assert verify(b_root, b, "b-audit", audit=True)
    assert not verify(b_root, b, "b-wrong-output", wrong=True)  # rejected: relied on nothing
    assert relied_on_b == {"via-b-0", "via-b-1", "via-b-2", "b-0", "b-1", "b-audit"}
    assert marked_by_revocations(mesh) == 0

    operator = mesh.operator_client()
    operator.submit(StatementKind.REVOKE_KEY, "deployer-b", b_key, note="stolen")
    operator.close()
    poll(lambda: marked_by_revocations(mesh) == len(relied_on_b), timeout_s=15, what="the verifier to mark them")
    assert not verify(b_root, b, "b-after")  # KEY_REVOKED now: not a verdict that relied on the key
    rows = scrape(mesh, "verifier-0")["countersign_verdict_log_rows"]
    assert rows == [({}, 10.0)]  # every verdict answered is logged, rejected ones too

    # The Impact RPC, for a client certificate (and the operator's), lists exactly them, flagged.
    channel = channel_to(mesh, "verifier-0", "client")
    answer = verifier_stub(channel).Impact(verifier_pb2.ImpactRequest(key_id=b_key), timeout=10)
    assert {v.request_id for v in answer.verdicts} == relied_on_b
    assert all(v.marked_in_log and v.cause.startswith(f"revoke_key deployer-b {b_key}") for v in answer.verdicts)
    assert {v.mode for v in answer.verdicts} == {"accept", "audit"}
    assert all(v.result == "ACCEPT" and v.status == verifier_pb2.NEEDS_REVALIDATION for v in answer.verdicts)
    assert {r.digest for r in answer.records} == records_of_b
    assert a_root.leaf.digest() not in {r.digest for r in answer.records}
    by_a = verifier_stub(channel).Impact(verifier_pb2.ImpactRequest(deployer="deployer-a"), timeout=10)
    assert {v.request_id for v in by_a.verdicts} == {"via-b-0", "via-b-1", "via-b-2", "a-0", "a-1"}
    since = max(v.time_ms for v in answer.verdicts)  # the last of them: b-audit's time
    late = verifier_stub(channel).Impact(verifier_pb2.ImpactRequest(key_id=b_key, since_ms=since), timeout=10)
    assert "b-audit" in {v.request_id for v in late.verdicts}
    assert {v.request_id for v in late.verdicts} == {v.request_id for v in answer.verdicts if v.time_ms >= since}
    assert len(late.verdicts) < len(answer.verdicts)
    stub = verifier_stub(channel)
    for bad in (verifier_pb2.ImpactRequest(), verifier_pb2.ImpactRequest(record_digest="sha256:nope")):
        error = service_error(lambda: stub.Impact(bad, timeout=10))  # noqa: B023 - called at once
        assert (error.code, error.status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT)
    channel.close()
    operator_channel = channel_to(mesh, "verifier-0", "operator")
    assert (
        len(verifier_stub(operator_channel).Impact(verifier_pb2.ImpactRequest(key_id=b_key), timeout=10).verdicts) == 6
    )
    operator_channel.close()
    runtime_channel = channel_to(mesh, "verifier-0", "deployer-a-runtime")
    error = service_error(lambda: verifier_stub(runtime_channel).Impact(verifier_pb2.ImpactRequest(key_id=b_key)))
    assert (error.code, error.status) == ("NOT_AUTHORISED", grpc.StatusCode.PERMISSION_DENIED)
    runtime_channel.close()

    # The command line reads the same log from the store, beside the running verifier.
    state = f"sqlite:///{mesh.workdir / 'state' / 'verifier-0.db'}"
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", "--key", b_key, "--state", state, "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {v["request_id"] for v in report["verdicts"]} == relied_on_b
    assert {v["verdict_id"] for v in report["verdicts"]} == {v.verdict_id for v in answer.verdicts}
    assert all(v["status"] == "NEEDS_REVALIDATION" and v["marked_in_log"] for v in report["verdicts"])
    assert {r["digest"] for r in report["records"]} == records_of_b
    text = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", "--deployer", "deployer-b", "--state", state],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert text.returncode == 0 and "6 verdict(s) NEEDS_REVALIDATION" in text.stdout, text.stdout + text.stderr
    # Or asks the running verifier over mTLS (an auditor with a client certificate, no store access):
    # the same report, JSON and text.
    remote = ["--verifier", mesh.daemons["verifier-0"].address, *tls(mesh, "client")]
    asked = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", "--key", b_key, *remote, "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == report
    asked_text = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", "--deployer", "deployer-b", *remote],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert asked_text.returncode == 0 and asked_text.stdout == text.stdout, asked_text.stdout + asked_text.stderr

    # The SDK asks the same RPC and answers typed values, sync and async.
    typed = verifier.impact(key_id=b_key)
    assert {v.request_id for v in typed.verdicts} == relied_on_b and not typed.truncated
    assert {v.verdict_id: v.path for v in typed.verdicts} == {v.verdict_id: tuple(v.path) for v in answer.verdicts}
    assert {r.digest for r in typed.records} == records_of_b
    assert all(r.key_id and r.deployer for r in typed.records)
    assert {r.digest for r in typed.records if r.seed} <= records_of_b
    assert {v.request_id for v in verifier.impact(deployer="deployer-a", since_ms=0).verdicts} == {
        v.request_id for v in by_a.verdicts
    }

    async def ask_async() -> ImpactAnswer:
        async with AsyncVerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client")) as client:
            return await client.impact(key_id=b_key, since_ms=since)

    assert {v.request_id for v in asyncio.run(ask_async()).verdicts} == {v.request_id for v in late.verdicts}
    for wrong in ({}, {"key_id": b_key, "deployer": "deployer-b"}):
        with pytest.raises(ValueError, match="exactly one"):
            verifier.impact(**wrong)
    for client in (a, b, verifier):
        client.close()


def test_a_verifier_started_after_a_revocation_marks_what_it_logged_before(
    make_mesh: Callable[..., LocalMesh],
) -> None:
    """The revocation arrives while the verifier is down: on start it sweeps every key its registry
    distrusts, so the verdicts it logged before are marked all the same."""
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"))
    b = mesh.runtime("deployer-b")
    verifier = mesh.verifier_client()
    output = b"before the revocation\n"
    path = b.receipt(b.root("solo", "restart"), sha256(output))
    assert verifier.verify(path.to_bytes(), output, request_id="logged-before")
    verifier.close()
    mesh.stop("verifier-0")
    operator = mesh.operator_client()
    operator.submit(StatementKind.REVOKE_KEY, "deployer-b", mesh.deployer_keys["deployer-b"].key_id)
    operator.close()
    mesh.start("verifier-0")
    poll(lambda: marked_by_revocations(mesh) == 1, timeout_s=15, what="the start-up sweep")
    b.close()
