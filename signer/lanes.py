"""Co-signing lanes: long-lived ``CoSignEdges`` streams from a child's signer to a parent's signer.

A unary call pays for a new HTTP/2 stream, its headers and a handler dispatch on every edge; a
message on an open stream pays for none of that (on a 2-vCPU machine about half the round trip;
docs/benchmarks.md). A lane carries one edge at a time, so answers need no matching and the
parent's handler decides each edge on the lane's own thread. Up to ``size`` lanes per parent run
side by side; a delegation that finds them all busy waits for one within its deadline.

Failure keeps the unary semantics: a refusal ends the lane with the parent's typed status; a lane
that does not answer within the deadline is cancelled (the parent sees the cancellation before it
spends the grant, or the retry under the same grant recovers the answer); either way the lane is
dropped and the next edge opens a new one. Lanes idle for ``idle_s`` are closed, so an idle peer
holds no thread of the parent's server and a stopping parent is not held for its grace period.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc

from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.service.errors import ServiceError, from_rpc_error

_CLOSE = object()  # ends a lane's request stream (a half-close: the parent ends the lane with OK)
_ENDED = object()  # the parent ended the lane


class _Lane:
    def __init__(self, stub: signer_pb2_grpc.SignerStub) -> None:
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._call = stub.CoSignEdges(self._outgoing())
        self.ended = False
        self.idle_since = time.monotonic()
        threading.Thread(target=self._read, name="countersign-cosign-lane", daemon=True).start()

    def _outgoing(self) -> Iterator[signer_pb2.CoSignEdgeRequest]:
        while (request := self._requests.get()) is not _CLOSE:
            assert isinstance(request, signer_pb2.CoSignEdgeRequest)
            yield request

    def _read(self) -> None:
        try:
            for answer in self._call:
                self._answers.put(answer)
            self._answers.put(_ENDED)
        except grpc.RpcError as exc:
            self._answers.put(exc)
        finally:
            self.ended = True

    def ask(self, request: signer_pb2.CoSignEdgeRequest, timeout_s: float) -> signer_pb2.CoSignEdgeResponse:
        self._requests.put(request)
        try:
            answer = self._answers.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            self.cancel()
            raise ServiceError(
                "DEADLINE_EXCEEDED", "no answer within the deadline", grpc.StatusCode.DEADLINE_EXCEEDED, retryable=True
            ) from None
        if isinstance(answer, grpc.RpcError):
            error = from_rpc_error(answer)
            if error.code != "CANCELLED":
                raise error
            answer = _ENDED  # not by us: the parent ended the lane (it is shutting down)
        if answer is _ENDED:
            raise ServiceError("UNAVAILABLE", "the parent closed the lane", grpc.StatusCode.UNAVAILABLE, retryable=True)
        assert isinstance(answer, signer_pb2.CoSignEdgeResponse)
        return answer

    def close(self) -> None:
        self._requests.put(_CLOSE)

    def cancel(self) -> None:
        self.ended = True
        self._call.cancel()
        self._requests.put(_CLOSE)  # frees gRPC's thread that sends from ``_outgoing``


class CoSignLanes:
    """Up to ``size`` lanes to one parent signer over one channel."""

    def __init__(self, stub: signer_pb2_grpc.SignerStub, size: int, idle_s: float) -> None:
        self._stub = stub
        self._size = size
        self._idle_s = idle_s
        self._free: list[_Lane] = []
        self._open = 0
        self._changed = threading.Condition()

    def ask(self, request: signer_pb2.CoSignEdgeRequest, timeout_s: float) -> signer_pb2.CoSignEdgeResponse:
        """The parent's answer to one edge; raises :class:`ServiceError` as a unary call would."""
        deadline = time.monotonic() + timeout_s
        lane = self._take(deadline)
        try:
            answer = lane.ask(request, deadline - time.monotonic())
        except BaseException:
            self._drop(lane)
            raise
        self._give_back(lane)
        return answer

    def _take(self, deadline: float) -> _Lane:
        with self._changed:
            while True:
                while self._free:
                    lane = self._free.pop()
                    if not lane.ended:
                        return lane
                    self._open -= 1  # ended while idle (the parent restarted): open another
                if self._open < self._size:
                    self._open += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._changed.wait(remaining):
                    raise ServiceError(
                        "DEADLINE_EXCEEDED", f"all {self._size} co-signing lanes stayed busy",
                        grpc.StatusCode.DEADLINE_EXCEEDED, retryable=True,
                    )  # fmt: skip
        try:
            return _Lane(self._stub)
        except BaseException:
            self._release_slot()
            raise

    def _give_back(self, lane: _Lane) -> None:
        lane.idle_since = time.monotonic()
        with self._changed:
            self._free.append(lane)
            self._changed.notify()

    def _drop(self, lane: _Lane) -> None:
        lane.cancel()
        self._release_slot()

    def _release_slot(self) -> None:
        with self._changed:
            self._open -= 1
            self._changed.notify()

    def close_idle(self) -> None:
        """Close lanes idle for longer than ``idle_s``."""
        cutoff = time.monotonic() - self._idle_s
        with self._changed:
            stale = [lane for lane in self._free if lane.idle_since < cutoff or lane.ended]
            self._free = [lane for lane in self._free if lane not in stale]
            self._open -= len(stale)
            self._changed.notify_all()
        for lane in stale:
            lane.close()

    def close(self) -> None:
        with self._changed:
            lanes, self._free = self._free, []
            self._open -= len(lanes)
        for lane in lanes:
            lane.cancel()
