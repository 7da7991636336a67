"""A signer replica killed under load costs the runtime nothing but a retry (ADR 0033, spec 21.3).

Real processes: two signer replicas per deployer on one SQLite state file each (replicas on one host
share it), a coordinator and a verifier, mTLS. The runtimes are the SDK's ``SignerClient`` naming both
replicas. While threads issue receipts and delegations, the replica they talk to is SIGKILLed:

* every call the runtimes made succeeds (the SDK retried it at the other replica, under its request id);
* every session's receipts still number 0, 1, ... without a gap or a repeat, and verify whole;
* a stream cut when its replica dies resumes at the other from its first unanswered chunk: its receipts
  cover every byte exactly once and form one session with the receipts before and after it.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path as FilePath

import pytest
from prometheus_client.parser import text_string_to_metric_families

from countersign.client import ServiceError, SignerClient
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

PARENT, CHILD = "deployer-a", "deployer-b"


@pytest.fixture
def mesh(tmp_path: FilePath) -> Iterator[LocalMesh]:
    made = LocalMesh(tmp_path / "mesh", deployers=(PARENT, CHILD), signer_replicas={PARENT: 2, CHILD: 2})
    with made:
        made.setup().start_all()
        made.enrol_all()
        yield made


def served_streams(mesh: LocalMesh, name: str) -> float:
    """Stream chunks a replica signed, from its metrics."""
    daemon = mesh.daemons[name]
    with urllib.request.urlopen(f"http://{daemon.host}:{daemon.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "countersign_signer_requests_total" and sample.labels.get("method") == "StreamReceipts"
    )


def test_a_replica_killed_under_load_fails_no_call(mesh: LocalMesh) -> None:
    parent, child = mesh.runtime(PARENT), mesh.runtime(CHILD)
    root = parent.root("planner", "failover", max_children=200)
    agent = child.root("writer", "failover")
    issued: dict[str, list[tuple[bytes, Path]]] = defaultdict(list)
    errors: list[ServiceError] = []
    lock = threading.Lock()
    killed = threading.Event()

    def work(worker: int) -> None:
        for turn in range(12):
            if worker == 0 and turn == 4:  # mid-load: the replica every runtime talks to first
                mesh.kill(PARENT)
                mesh.kill(CHILD)
                killed.set()
            try:
                output = f"worker {worker} turn {turn}".encode()
                receipt = child.receipt(agent, hashlib.sha256(output).digest(), session=f"w{worker}")
                grant = parent.open_grant(root, CHILD)
                child.accept(root, grant, mesh.signer_addresses(PARENT), f"r{worker}-{turn}")
            except ServiceError as error:
                with lock:
                    errors.append(error)
                continue
            with lock:
                issued[f"w{worker}"].append((output, receipt))

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(work, range(6)))
    assert killed.is_set()
    assert errors == [], [f"{e.code}: {e}" for e in errors]
    verifier = mesh.verifier_client()
    try:
        for session, receipts in issued.items():
            receipts.sort(key=lambda item: item[1].leaf.record.output.seq)  # type: ignore[union-attr]
            seqs = [r.leaf.record.output.seq for _, r in receipts]  # type: ignore[union-attr]
            assert seqs == list(range(12)), (session, seqs)
            evidence = SessionEvidence(agent, tuple(r.leaf for _, r in receipts))
            assert verifier.verify_session(evidence, [output for output, _ in receipts]), session
    finally:
        verifier.close()
        parent.close()
        child.close()


def test_a_stream_cut_by_its_replica_resumes_at_the_other(mesh: LocalMesh) -> None:
    runtime = mesh.runtime(CHILD)
    agent = runtime.root("streamer", "failover")
    first = runtime.receipt(agent, hashlib.sha256(b"before the stream").digest(), session="talk")
    pieces = [bytes([65 + i % 26]) * 100 for i in range(40)]  # 4,000 bytes, 16 chunks of 256

    def emitted() -> Iterator[bytes]:
        for index, piece in enumerate(pieces):
            if index == 15:  # the replica serving the stream dies with chunks signed and in flight
                mesh.daemons[CHILD].process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            yield piece

    receipts = runtime.stream_receipts(agent, emitted(), session="talk", n=256, close=True)
    data = b"".join(pieces)
    chunks = [r for r in receipts if not r.closed]
    assert sum(r.units for r in chunks) == len(data), "every byte covered exactly once"
    expected = [hashlib.sha256(data[i : i + 256]).hexdigest() for i in range(0, len(data), 256)]
    assert [r.path.leaf.record.output.sha256 for r in chunks] == [f"sha256:{h}" for h in expected]  # type: ignore[union-attr]
    assert [r.seq for r in receipts] == list(range(1, len(expected) + 2)), "one session: no gap, no repeat"
    assert receipts[-1].closed
    assert served_streams(mesh, f"{CHILD}-r1") > 0, "the other replica carried the stream on"
    verifier = mesh.verifier_client()
    try:
        evidence = SessionEvidence(agent, (first.leaf, *(r.path.leaf for r in receipts)))
        outputs = [b"before the stream", *(data[i : i + 256] for i in range(0, len(data), 256)), None]
        assert verifier.verify_session(evidence, outputs, require_closed=True)
    finally:
        verifier.close()
        runtime.close()


def test_one_target_with_several_addresses_fails_over_inside_grpc(tmp_path: FilePath) -> None:
    """What a DNS name resolving to several addresses gives a client: one channel, whose addresses gRPC
    moves between (here a gRPC target naming two loopback addresses, the resolver's output written out)."""
    mesh = LocalMesh(tmp_path / "mesh", deployers=(CHILD,), verifiers=0, signer_replicas={CHILD: 2})
    with mesh:
        mesh.setup()
        mesh.start("coordinator")
        first, second = mesh.signer_names(CHILD)
        port = mesh.start(first).port
        mesh.daemons[second].host, mesh.daemons[second].port = "127.0.0.2", port  # the same port, another address
        mesh.start(second)
        mesh.enrol_all()
        target = f"ipv4:127.0.0.1:{port},127.0.0.2:{port}"
        runtime = SignerClient(target, mesh.tls_for(f"{CHILD}-runtime"), CHILD)
        try:
            assert runtime.addresses == [target], "one entry: one channel over both addresses"
            agent = runtime.root("resolver", "failover")
            before = runtime.receipt(agent, hashlib.sha256(b"before").digest(), session="dns")
            mesh.kill(first)
            after = runtime.receipt(agent, hashlib.sha256(b"after").digest(), session="dns")
            assert after.leaf.record.output is not None and after.leaf.record.output.seq == 1
            assert after.leaf.record.output.prev == before.leaf.digest()
        finally:
            runtime.close()


def cosign_outcomes(mesh: LocalMesh, name: str) -> dict[str, float]:
    daemon = mesh.daemons[name]
    with urllib.request.urlopen(f"http://{daemon.host}:{daemon.metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "countersign_cosign_seconds_count"
    }


def test_a_parent_replica_that_cannot_be_reached_is_asked_last_afterwards(mesh: LocalMesh) -> None:
    """A delegation names the parent's replicas; one cannot be reached. The first delegation asks it and
    moves on; the next ones ask the reachable one first (spec 21.3), not paying for the lost one again."""
    parent, child = mesh.runtime(PARENT), mesh.runtime(CHILD)
    try:
        root = parent.root("planner", "parent-order", max_children=8)
        lost = "127.0.0.1:9"  # nothing listens: refused at once
        parent_signers = f"{lost},{mesh.signer_addresses(PARENT)}"
        for index in range(4):
            child.accept(root, parent.open_grant(root, CHILD), parent_signers, f"r{index}")
        # Every child replica that took a delegation asked the lost address at most once.
        unreachable = sum(cosign_outcomes(mesh, name).get("unreachable", 0.0) for name in mesh.signer_names(CHILD))
        served = sum(cosign_outcomes(mesh, name).get("ok", 0.0) for name in mesh.signer_names(CHILD))
        assert served == 4
        assert 1 <= unreachable <= len(mesh.signer_names(CHILD))
    finally:
        parent.close()
        child.close()
