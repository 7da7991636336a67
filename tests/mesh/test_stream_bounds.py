"""A runtime's streams are bounded like its lanes (signer/daemon.py ``StreamReceipts``, ``CloseSession``).

Reproduces what was unbounded: one connection could hold as many idle ``StreamReceipts`` calls as the
per-identity stream limit allows (each a handler thread), one stream could carry messages without end
and sign chunks without end; and ``CloseSession`` was a unary call outside the runtime's lanes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from countersign._daemon.limits import LimitsConfig
from countersign._proto.v1 import signer_pb2
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, poll, scrape, service_error, signer_stub

pytestmark = pytest.mark.daemons

LANES_PER_PEER = 4  # SignerConfig's default
STREAMS = 12  # more than a connection's lane slots, fewer than the identity's stream limit
assert LANES_PER_PEER < STREAMS < LimitsConfig().streams_per_peer


def _lanes_open(mesh: LocalMesh, kind: str) -> float:
    return sum(
        value for labels, value in scrape(mesh, "deployer-a")["countersign_lanes_open"] if labels["kind"] == kind
    )


def _opening(parent: Path, release: threading.Event, session: str) -> Iterator[signer_pb2.OutputChunk]:
    yield signer_pb2.OutputChunk(parent_path=parent.to_bytes(), session=session, unit="bytes", n=8)
    release.wait(30)


def test_one_connection_holds_at_most_its_lane_slots_of_streams(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",))
    runtime = mesh.runtime("deployer-a")
    agent = runtime.root("streamer", "bounds")
    runtime.close()
    channel = channel_to(mesh, "deployer-a", "deployer-a-runtime")  # one connection for every stream
    stub = signer_stub(channel)
    release = threading.Event()
    calls = [stub.StreamReceipts(_opening(agent, release, f"s{i}"), timeout=60) for i in range(STREAMS)]
    try:
        poll(lambda: sum(c.done() for c in calls) >= STREAMS - LANES_PER_PEER or None, timeout_s=20,
             what="the streams beyond the connection's slots to be refused")  # fmt: skip
        time.sleep(0.3)  # no late refusal changes the count
        refused = [c for c in calls if c.done()]
        assert len(refused) == STREAMS - LANES_PER_PEER
        for call in refused:
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "stream lanes open" in (call.details() or "")
        assert _lanes_open(mesh, "stream") == LANES_PER_PEER
        # Another runtime connection still gets its own slots, and unary calls still answer.
        other = mesh.runtime("deployer-a")
        chunks = other.stream_receipts(agent, [b"abcdefgh"], session="other", n=8)
        assert [c.seq for c in chunks] == [0]
        other.close()
    finally:
        release.set()
        for call in calls:
            call.cancel()
        channel.close()
    poll(lambda: _lanes_open(mesh, "stream") == 0 or None, timeout_s=15, what="the stream slots to come back")


def test_a_stream_reads_a_bounded_number_of_messages(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",), signer_options={"max_stream_messages": 50})
    runtime = mesh.runtime("deployer-a")
    agent = runtime.root("streamer", "bounds")
    endless = (b"" for _ in iter(int, 1))  # empty pieces, without end: nothing to sign, a thread held
    error = service_error(lambda: runtime.stream_receipts(agent, endless, session="idle", n=8, timeout_s=20))
    assert error.code == "RESOURCE_EXHAUSTED" and "50 messages" in str(error)
    runtime.close()


def test_a_stream_signs_a_bounded_number_of_chunks_and_the_session_goes_on(
    make_mesh: Callable[..., LocalMesh],
) -> None:
    mesh = make_mesh(deployers=("deployer-a",), signer_options={"max_stream_chunks": 3})
    runtime = mesh.runtime("deployer-a")
    agent = runtime.root("streamer", "bounds")
    error = service_error(lambda: runtime.stream_receipts(agent, [b"ab"] * 5, session="long", n=2))
    assert error.code == "RESOURCE_EXHAUSTED" and "3 chunks" in str(error)
    # The three chunks signed stay the session's; another stream continues it, then closes it.
    more = runtime.stream_receipts(agent, [b"ab", b"ab"], session="long", n=2, close=True)
    assert [(c.seq, c.closed) for c in more] == [(3, False), (4, False), (5, True)]
    close = more[-1].path.leaf.record.output
    assert close is not None and close.close is not None and close.close.count == 5
    runtime.close()


def test_close_session_travels_on_a_runtime_lane(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",))
    runtime = mesh.runtime("deployer-a")
    agent = runtime.root("writer", "bounds")
    receipt = runtime.receipt(agent, b"\x00" * 32, session="chat")
    runtime.close()
    channel = channel_to(mesh, "deployer-a", "deployer-a-runtime")
    request = signer_pb2.CloseSessionRequest(parent_path=agent.to_bytes(), session="chat")
    answers = list(signer_stub(channel).RuntimeCalls(iter([signer_pb2.RuntimeCall(close_session=request)]), timeout=10))
    channel.close()
    assert len(answers) == 1 and answers[0].WhichOneof("answer") == "issued"
    close = Path.from_bytes(answers[0].issued.path).leaf.record.output
    assert close is not None and close.close is not None
    assert (close.close.count, close.close.last) == (1, receipt.leaf.digest())
    # The client sends it on its lanes too: asked again there, the same close receipt.
    client = mesh.runtime("deployer-a")
    assert client.close_session(agent, session="chat").to_bytes() == answers[0].issued.path
    assert client.lanes > 0
    client.close()
