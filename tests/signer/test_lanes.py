"""Lanes (countersign/service/lanes.py): the client pool against an in-process gRPC server, and the
server side's slots.

The parent here is a scripted ``CoSignEdges`` servicer (not a signer): it answers each edge with its
grant id, refuses, stalls or ends the lane as the grant id says, and records how many lanes are open
at once. The real parent's decisions are tested with daemons in tests/mesh/test_lanes.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import prometheus_client
import pytest

from countersign._daemon.edge import STATUS_OF_CODE, abort
from countersign._daemon.lane_slots import LaneSlots
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.lanes import Lanes
from countersign.errors import ServiceError

pytestmark = pytest.mark.daemons  # an in-process gRPC server on loopback


class ScriptedParent(signer_pb2_grpc.SignerServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.most_open = 0
        self.opened = 0
        self.cancelled = threading.Event()

    def CoSignEdges(
        self, requests: Iterator[signer_pb2.CoSignEdgeRequest], context: grpc.ServicerContext
    ) -> Iterator[signer_pb2.CoSignEdgeResponse]:
        with self.lock:
            self.open += 1
            self.opened += 1
            self.most_open = max(self.most_open, self.open)
        try:
            for request in requests:
                if request.grant_id == "refuse":
                    abort(context, ServiceError("GRANT_USED", "scripted refusal"))
                if request.grant_id == "full":
                    abort(context, ServiceError("LANES_EXHAUSTED", "scripted"))
                if request.grant_id == "stall":
                    while context.is_active():
                        time.sleep(0.01)
                    self.cancelled.set()
                    return
                time.sleep(0.002)  # long enough for concurrent edges to need several lanes
                yield signer_pb2.CoSignEdgeResponse(parent_cosignature=request.grant_id)
                if request.grant_id.startswith("last"):
                    return  # the parent ends the lane after this edge
        finally:
            with self.lock:
                self.open -= 1


@pytest.fixture
def parent() -> Iterator[tuple[ScriptedParent, grpc.Channel]]:
    servicer = ScriptedParent()
    server = grpc.server(ThreadPoolExecutor(max_workers=32))
    signer_pb2_grpc.add_SignerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield servicer, channel
    channel.close()
    server.stop(0)


def edge(grant_id: str) -> signer_pb2.CoSignEdgeRequest:
    return signer_pb2.CoSignEdgeRequest(grant_id=grant_id)


def test_concurrent_edges_each_get_their_own_answer_and_never_more_than_size_lanes(
    parent: tuple[ScriptedParent, grpc.Channel],
) -> None:
    servicer, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=3, idle_s=60)
    asked = [f"g{n}" for n in range(120)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda g: lanes.ask(edge(g), 10).parent_cosignature, asked))
    lanes.close()
    assert answers == asked
    assert servicer.most_open == 3
    assert servicer.opened == 3  # lanes are kept and reused, not opened per edge


def test_no_answer_within_the_deadline_cancels_the_lane_and_the_next_edge_opens_a_new_one(
    parent: tuple[ScriptedParent, grpc.Channel],
) -> None:
    servicer, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=1, idle_s=60)
    assert lanes.ask(edge("first"), 10).parent_cosignature == "first"
    started = time.monotonic()
    with pytest.raises(ServiceError) as raised:
        lanes.ask(edge("stall"), 0.3)
    assert time.monotonic() - started < 2
    assert (raised.value.code, raised.value.retryable) == ("DEADLINE_EXCEEDED", True)
    assert servicer.cancelled.wait(5), "the parent never saw the cancellation"
    assert lanes.ask(edge("after"), 10).parent_cosignature == "after"  # the only slot was given back
    assert servicer.opened == 2
    lanes.close()


def test_a_refusal_keeps_its_typed_code_and_the_lane_is_replaced(parent: tuple[ScriptedParent, grpc.Channel]) -> None:
    servicer, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=1, idle_s=60)
    with pytest.raises(ServiceError) as raised:
        lanes.ask(edge("refuse"), 10)
    assert (raised.value.code, raised.value.status, raised.value.retryable) == (
        "GRANT_USED",
        grpc.StatusCode.FAILED_PRECONDITION,
        False,
    )
    assert lanes.ask(edge("next"), 10).parent_cosignature == "next"
    assert servicer.opened == 2
    lanes.close()


def test_a_server_without_a_free_lane_gets_the_unary_call_instead(parent: tuple[ScriptedParent, grpc.Channel]) -> None:
    _, channel = parent
    unary_calls: list[str] = []

    def fallback(request: signer_pb2.CoSignEdgeRequest, timeout_s: float) -> signer_pb2.CoSignEdgeResponse:
        assert timeout_s > 0
        unary_calls.append(request.grant_id)
        return signer_pb2.CoSignEdgeResponse(parent_cosignature="unary")

    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=1, idle_s=60, fallback=fallback)
    assert lanes.ask(edge("full"), 10).parent_cosignature == "unary"
    assert lanes.ask(edge("next"), 10).parent_cosignature == "next"  # lanes again once one is free
    with pytest.raises(ServiceError, match="scripted refusal"):  # other refusals are not retried
        lanes.ask(edge("refuse"), 10)
    assert unary_calls == ["full"]
    lanes.close()


def test_a_lane_the_parent_ended_while_idle_is_not_reused(parent: tuple[ScriptedParent, grpc.Channel]) -> None:
    servicer, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=1, idle_s=60)
    assert lanes.ask(edge("last-1"), 10).parent_cosignature == "last-1"
    deadline = time.monotonic() + 5
    while servicer.open and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the child's reader sees the end
    assert lanes.ask(edge("then"), 10).parent_cosignature == "then"
    assert servicer.opened == 2
    lanes.close()


def test_all_lanes_busy_past_the_deadline_is_a_retryable_deadline_error(
    parent: tuple[ScriptedParent, grpc.Channel],
) -> None:
    _, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=1, idle_s=60)
    stall_errors: list[ServiceError] = []

    def stall() -> None:
        try:
            lanes.ask(edge("stall"), 2)
        except ServiceError as exc:
            stall_errors.append(exc)

    stalled = threading.Thread(target=stall)
    stalled.start()
    time.sleep(0.2)
    with pytest.raises(ServiceError) as raised:
        lanes.ask(edge("waiting"), 0.3)
    assert (raised.value.code, raised.value.retryable) == ("DEADLINE_EXCEEDED", True)
    assert "busy" in str(raised.value)
    stalled.join()
    assert [e.code for e in stall_errors] == ["DEADLINE_EXCEEDED"]
    lanes.close()


def test_idle_lanes_are_closed(parent: tuple[ScriptedParent, grpc.Channel]) -> None:
    servicer, channel = parent
    lanes = Lanes(signer_pb2_grpc.SignerStub(channel).CoSignEdges, size=2, idle_s=1.0)
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda g: lanes.ask(edge(g), 10), ["a", "b", "c", "d"]))
    assert servicer.open >= 1  # kept open for the next call
    deadline = time.monotonic() + 10
    while servicer.open and time.monotonic() < deadline:  # the shared reaper closes them once idle
        time.sleep(0.02)
    assert servicer.open == 0
    assert lanes.ask(edge("again"), 10).parent_cosignature == "again"
    lanes.close()


# --- the server side: LaneSlots ---------------------------------------------------------------


class FakeContext:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def slots(per_key: int, total: int | None) -> LaneSlots:
    gauge = prometheus_client.Gauge("lanes_open", "test", ["kind"], registry=prometheus_client.CollectorRegistry())
    return LaneSlots(per_key, gauge, total=total)


def open_lane(lanes: LaneSlots, key: str, requests: Iterator[int]) -> tuple[Iterator[int], FakeContext]:
    context = FakeContext()
    answers = lanes.serve("test", key, requests, context, lambda n: n * 10)  # type: ignore[arg-type]
    return answers, context


def test_lane_slots_cap_each_key_and_the_total() -> None:
    lanes = slots(per_key=2, total=3)
    a1, _ = open_lane(lanes, "a", iter([1, 2]))
    a2, _ = open_lane(lanes, "a", iter([3]))
    assert next(a1) == 10 and next(a2) == 30  # a lane takes its slot when it starts
    a3, _ = open_lane(lanes, "a", iter([4]))
    with pytest.raises(ServiceError) as raised:
        next(a3)
    assert (raised.value.code, STATUS_OF_CODE[raised.value.code], raised.value.retryable) == (
        "LANES_EXHAUSTED",
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        True,
    )
    b1, _ = open_lane(lanes, "b", iter([5]))
    assert next(b1) == 50  # another key, within the total
    b2, _ = open_lane(lanes, "b", iter([6]))
    with pytest.raises(ServiceError, match="this server already has 3 lanes open"):
        next(b2)
    assert list(a2) == []  # a2's requests end: its slot is free again
    b3, _ = open_lane(lanes, "b", iter([7]))
    assert next(b3) == 70


def test_stopping_cancels_idle_lanes_and_ends_a_busy_one_after_its_answer() -> None:
    lanes = slots(per_key=4, total=None)
    release = threading.Event()

    def requests(first: int) -> Iterator[int]:
        yield first
        release.wait(5)  # the lane waits for its next call here (idle), until the test lets it go
        yield first + 1

    deciding = threading.Event()

    def slow(n: int) -> int:
        deciding.set()
        release.wait(5)
        return n * 10

    def run(decide: Callable[[int], int], first: int) -> tuple[FakeContext, list[int], threading.Thread]:
        context, answers = FakeContext(), []
        lane = lanes.serve("test", "k", requests(first), context, decide)  # type: ignore[arg-type]
        thread = threading.Thread(target=lambda: answers.extend(lane))  # as gRPC drains a handler
        thread.start()
        return context, answers, thread

    idle_context, idle_answers, idle_thread = run(lambda n: n * 10, 1)
    deadline = time.monotonic() + 5
    while not idle_answers and time.monotonic() < deadline:
        time.sleep(0.01)
    busy_context, busy_answers, busy_thread = run(slow, 5)
    assert deciding.wait(5)
    time.sleep(0.05)  # the idle lane is back waiting for its next call
    lanes.stop()
    assert idle_context.cancelled and not busy_context.cancelled
    with pytest.raises(ServiceError) as raised:  # no new lane while stopping
        next(lanes.serve("test", "other", iter([1]), FakeContext(), lambda n: n))  # type: ignore[arg-type]
    assert (raised.value.code, raised.value.retryable) == ("UNAVAILABLE", True)
    release.set()
    busy_thread.join(5)
    idle_thread.join(5)
    assert busy_answers == [50]  # the call in flight was answered, then the lane ended
