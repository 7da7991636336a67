"""A receipt stream decides each chunk from the session as its replica last wrote it, without reading
the store again (signer/daemon.py ``StreamSession``). That is safe only because the write is
conditional: here another replica (a second service over the same store) moves the session between a
stream's chunks, and the stream's next receipt must still take the next ``seq`` after a conflict, never
fork the chain, and the whole session must verify as one."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path as FilePath
from typing import Any

import prometheus_client
import pytest

from bench.issuance import _Context, _Registry
from countersign._clock import now_ms
from countersign._proto.v1 import signer_pb2
from countersign.client.tls import TlsConfig
from countersign.records import Path
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, check_session_evidence
from countersign.signer_state import StateReads, StateView, StateWrite
from signer.config import SignerConfig
from signer.daemon import SignerMetrics, SignerService
from signer.stores import SignerStateStore, open_signer_state

pytestmark = pytest.mark.offline

CHUNK = 4


class CountingState:
    """The store, counting the reads of a session the signers make of it."""

    def __init__(self, state: SignerStateStore) -> None:
        self._state = state
        self.reads = 0

    def read(self, reads: StateReads) -> StateView:
        self.reads += reads.session is not None
        return self._state.read(reads)

    def apply(self, writes: list[StateWrite]) -> list[bool]:
        return self._state.apply(writes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


def replicas(state_url: str) -> tuple[SampleMesh, list[SignerService], CountingState]:
    mesh = SampleMesh.create(["deployer-a"], seed=b"stream-presumed")
    config = SignerConfig(
        deployer="deployer-a", signer_key="", operator_public_key="", coordinator="", registry_cache="",
        tls=TlsConfig(insecure_loopback=True),
    )  # fmt: skip
    state = CountingState(open_signer_state(state_url))
    services = []
    for _ in range(2):
        follower = _Registry(mesh.registry)
        metrics = SignerMetrics(prometheus_client.CollectorRegistry(), follower)  # type: ignore[arg-type]
        services.append(SignerService(config, mesh.signers["deployer-a"], state, follower, metrics))  # type: ignore[arg-type]
    return mesh, services, state


class StreamContext(_Context):
    """A context a stream's handler can register its end with."""

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return True


def conflicts(service: SignerService) -> float:
    return sum(sample.value for metric in service._metrics.conflicts.collect() for sample in metric.samples
               if sample.name.endswith("_total"))  # fmt: skip


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_stream_continues_a_session_another_replica_moved(store: str, tmp_path: FilePath) -> None:
    url = "memory:" if store == "memory" else f"sqlite:///{tmp_path / 'state.db'}"
    mesh, (a, b), state = replicas(url)
    context: Any = StreamContext()
    agent_fields = signer_pb2.AgentFields(instance="writer", system="streams", ttl_ms=3_600_000, max_children=0)
    root = a.IssueRoot(signer_pb2.IssueRootRequest(agent=agent_fields), context)
    unary: list[bytes] = []

    def moved_by_b() -> None:
        request = signer_pb2.IssueReceiptRequest(
            parent_path=root.path, output_sha256=hashlib.sha256(b"b%d" % len(unary)).digest(), session="s"
        )
        unary.append(b.IssueReceipt(request, context).path)

    def chunks(between: Callable[[int], None]) -> Iterator[signer_pb2.OutputChunk]:
        yield signer_pb2.OutputChunk(parent_path=root.path, session="s", unit="bytes", n=CHUNK, request_id="st")
        for index in range(6):
            between(index)
            yield signer_pb2.OutputChunk(data=b"%04d" % index)

    reads_before = state.reads
    streamed = []
    for answer in a.StreamReceipts(chunks(lambda index: moved_by_b() if index in (2, 4) else None), context):
        streamed.append(answer)
    # Without the other replica, the stream would read the store once (its first chunk). Each of
    # B's receipts costs B one read, and the stream one failed write and one fresh read.
    assert state.reads - reads_before == 1 + 2 * 2
    assert conflicts(a) == 2
    seqs = [answer.seq for answer in streamed]
    assert len(set(seqs)) == len(seqs) == 6

    receipts = sorted(
        [Path.from_bytes(answer.path).leaf for answer in streamed] + [Path.from_bytes(p).leaf for p in unary],
        key=lambda envelope: envelope.record.output.seq,  # type: ignore[union-attr]
    )
    assert [envelope.record.output.seq for envelope in receipts] == list(range(8))  # type: ignore[union-attr]
    session = SessionEvidence(Path.from_bytes(root.path), tuple(receipts))
    result = check_session_evidence(session, registry=mesh.registry, now_ms=now_ms()).result
    assert result, result

    # A stream resumed under the same request id answers its chunks as first issued.
    again = list(a.StreamReceipts(chunks(lambda index: None), context))
    assert [answer.path for answer in again] == [answer.path for answer in streamed]
