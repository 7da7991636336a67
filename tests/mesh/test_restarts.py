"""Crashes and restarts: a parent signer killed mid-flow, a frozen parent, a restarted verifier.

Each test has its own mesh. A restarted daemon reuses its port; the test process opens new client
channels after each restart (a channel that saw the daemon die is in reconnect backoff).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import grpc
import pytest

from countersign.client import RetryPolicy, SignerClient
from countersign.errors import ServiceError
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import children_of, issued_digests, poll, service_error, sha256

pytestmark = pytest.mark.daemons
COSIGN_TIMEOUT_MS = 1_000
STALENESS_MS = 8_000  # wide enough for a verifier restart on a loaded machine


def one_attempt(mesh: LocalMesh, deployer: str) -> SignerClient:
    """A runtime client that does not retry: these tests watch the signer's own fail-closed answer."""
    return SignerClient(
        mesh.signer_addresses(deployer), mesh.tls_for(f"{deployer}-runtime"), deployer, retry=RetryPolicy(attempts=1)
    )


def parent_refused(error: object, code: str) -> bool:
    return getattr(error, "code", None) == "PARENT_REFUSED" and f"deployer-a: {code}:" in str(error)


def test_parent_killed_mid_flow_fails_closed_and_restart_keeps_grants(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"), cosign_timeout_ms=COSIGN_TIMEOUT_MS)
    parent_address = mesh.daemons["deployer-a"].address
    b = one_attempt(mesh, "deployer-b")
    a = mesh.runtime("deployer-a")
    root = a.root("planner", "crash", max_children=2)
    old_grant = a.open_grant(root, "deployer-b")
    a.close()
    before = issued_digests(mesh, "deployer-b")

    mesh.kill("deployer-a")
    started = time.monotonic()
    error = service_error(lambda: b.accept(root, old_grant, parent_address, "r0", timeout_s=10))
    elapsed = time.monotonic() - started
    assert (error.code, error.status) == ("PARENT_UNREACHABLE", grpc.StatusCode.UNAVAILABLE)
    assert error.retryable is True
    assert "parent signer deployer-a" in str(error)
    assert elapsed < COSIGN_TIMEOUT_MS / 1000 + 1.0
    assert issued_digests(mesh, "deployer-b") == before

    # Restarted on the same port: the grant opened before the crash was never spent, so it works
    # (at once: the child signer must not sit in reconnect backoff), exactly once.
    assert mesh.start("deployer-a").address == parent_address
    first = b.accept(root, old_grant, parent_address, "r1")
    assert first.leaf.record.deployer == "deployer-b"
    assert issued_digests(mesh, "deployer-b") == before | {first.leaf.digest()}
    # Asked again: the same record, not a second child.
    assert b.accept(root, old_grant, parent_address, "r1b").to_bytes() == first.to_bytes()

    # Another crash: the used grant stays used and the child count stays counted.
    mesh.kill("deployer-a")
    mesh.start("deployer-a")
    assert b.accept(root, old_grant, parent_address, "r1c").to_bytes() == first.to_bytes()
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1
    a = mesh.runtime("deployer-a")
    second = b.accept(root, a.open_grant(root, "deployer-b"), parent_address, "r2")
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 2

    mesh.stop("deployer-a")  # a graceful restart must not forget either
    mesh.start("deployer-a")
    a.close()
    a = mesh.runtime("deployer-a")
    third_grant = a.open_grant(root, "deployer-b")
    assert parent_refused(service_error(lambda: b.accept(root, third_grant, parent_address, "r3")), "FANOUT_EXCEEDED")
    assert issued_digests(mesh, "deployer-b") == before | {first.leaf.digest(), second.leaf.digest()}
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 2
    a.close()
    b.close()


def test_frozen_parent_times_out_within_cosign_deadline(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"), cosign_timeout_ms=COSIGN_TIMEOUT_MS)
    parent_address = mesh.daemons["deployer-a"].address
    a = mesh.runtime("deployer-a")
    b = one_attempt(mesh, "deployer-b")
    root = a.root("planner", "frozen")
    b.accept(root, a.open_grant(root, "deployer-b"), parent_address, "warm-up")  # b's channel to a is open
    grant = a.open_grant(root, "deployer-b")
    before = issued_digests(mesh, "deployer-b")
    process = mesh.daemons["deployer-a"].process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        error = service_error(lambda: b.accept(root, grant, parent_address, "r", timeout_s=10))
        elapsed = time.monotonic() - started
    finally:
        process.send_signal(signal.SIGCONT)
    assert (error.code, error.status) == ("PARENT_UNREACHABLE", grpc.StatusCode.UNAVAILABLE)
    assert error.retryable is True
    assert COSIGN_TIMEOUT_MS / 1000 * 0.9 <= elapsed < COSIGN_TIMEOUT_MS / 1000 + 1.5
    assert issued_digests(mesh, "deployer-b") == before
    # The thawed parent still answers the next delegation.
    assert b.accept(root, a.open_grant(root, "deployer-b"), parent_address, "after").leaf.record.depth == 1
    # And the interrupted delegation completes when retried under its grant: whether the thawed
    # parent spent the grant on the abandoned request or not, the retry re-sends the same edge, so the
    # result is exactly one child for that grant and no grant spent without a record.
    retried = b.accept(root, grant, parent_address, "r-again")
    assert retried.leaf.record.agent.instance == "r", "the edge first proposed under this grant"
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 3  # warm-up, after, and this one
    assert issued_digests(mesh, "deployer-b") >= before | {retried.leaf.digest()}
    a.close()
    b.close()


def receipt_path(mesh: LocalMesh, instance: str, output: bytes) -> Path:
    runtime = mesh.runtime("deployer-a")
    try:
        return runtime.receipt(runtime.root(instance, "restart"), sha256(output))
    finally:
        runtime.close()


def test_verifier_restart_keeps_nonces_and_registry_copy(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"), staleness_ms=STALENESS_MS, heartbeat_ms=250)
    output = b"an answer\n"
    accepted, unused = receipt_path(mesh, "p1", output), receipt_path(mesh, "p2", output)
    verifier = mesh.verifier_client()
    assert verifier.verify(accepted.to_bytes(), output).result
    verifier.close()

    # The consumed nonce survives a restart (SQLite store).
    mesh.stop("verifier-0")
    mesh.start("verifier-0")
    verifier = mesh.verifier_client()
    verdict = verifier.verify(accepted.to_bytes(), output)
    replay, sequence = verdict.result, verdict.registry_sequence
    assert (replay.reason, replay.index, sequence) == ("NONCE_REPLAYED", 1, 2)
    verifier.close()

    # The registry copy survives too: restarted while the coordinator is down, the verifier serves
    # from its persisted copy until the staleness bound, then fails closed.
    assert mesh.stop("coordinator") == 0
    coordinator_gone = time.monotonic()
    mesh.stop("verifier-0")
    mesh.start("verifier-0")
    restarted_after = time.monotonic() - coordinator_gone
    verifier = mesh.verifier_client()
    verdict = verifier.verify(unused.to_bytes(), output, audit=True)
    served, sequence = verdict.result, verdict.registry_sequence
    assert sequence == 2  # the copy came from disk: nothing else could have told it about 2 statements
    assert served, f"{served}: restarted {restarted_after:.2f} s after the coordinator stopped"

    def stale() -> bool:
        result = verifier.verify(unused.to_bytes(), output, audit=True).result
        return result.reason == "REGISTRY_STALE" and result.index is None

    poll(stale, timeout_s=STALENESS_MS / 1000 + 3, interval_s=0.1, what="REGISTRY_STALE")
    assert time.monotonic() - coordinator_gone < STALENESS_MS / 1000 + 3
    # A stale registry is never a verdict on the path: the replay is also answered REGISTRY_STALE.
    assert verifier.verify(accepted.to_bytes(), output).result.reason == "REGISTRY_STALE"
    verifier.close()

    # The signers fail closed too, with a retryable error. (A signer that kept running measures
    # staleness from its last heartbeat in memory, so it may go stale a little after the restarted
    # verifier, whose persisted freshness lags by up to a quarter of the bound.)
    runtime = mesh.runtime("deployer-a")

    def signer_stale() -> object:
        try:
            runtime.root("late", "restart")
        except ServiceError as exc:
            return exc
        return None

    error = poll(signer_stale, timeout_s=STALENESS_MS / 1000 + 3, interval_s=0.1, what="the signer to refuse")
    assert time.monotonic() - coordinator_gone < STALENESS_MS / 1000 + 3
    assert isinstance(error, ServiceError)
    assert (error.code, error.status, error.retryable) == ("REGISTRY_STALE", grpc.StatusCode.UNAVAILABLE, True)
    runtime.close()

    # The coordinator comes back: the copy is fresh again and the replay is still a replay.
    mesh.start("coordinator")
    verifier = mesh.verifier_client()
    poll(
        lambda: verifier.verify(unused.to_bytes(), output, audit=True).result.reason is None,
        timeout_s=15, what="a fresh registry after the coordinator restarted",
    )  # fmt: skip
    assert verifier.verify(accepted.to_bytes(), output).result.reason == "NONCE_REPLAYED"
    verifier.close()
