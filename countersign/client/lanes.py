"""Lanes: long-lived bidirectional streams that carry one call at a time, instead of unary calls.

:class:`Lanes` is the client side (a pool of lanes to one server); the server side is
``countersign._daemon.lane_slots.LaneSlots``.

A unary call pays for a new HTTP/2 stream, its headers and a handler dispatch every time; a message
on an open stream pays for none of that (on a 2-vCPU machine about half the round trip; ADR 0008).
A lane carries one call at a time, so answers need no matching and the server decides each call on
the lane's own handler thread. Up to ``size`` lanes to one server run side by side; a call that finds
them all busy waits for one within its deadline. Three kinds use them: a child's signer sends edges
to a parent's signer (``CoSignEdges``), a runtime sends its calls to its own signer
(``RuntimeCalls``), a consumer sends paths to a verifier (``VerifyPaths``).

Failure keeps the unary semantics: a refusal ends the lane with the server's typed status; a lane
that does not answer within the deadline is cancelled (the server sees the cancellation as it would
a unary call's); either way the lane is dropped and the next call opens a new one. Lanes idle for
``idle_s`` are closed, so an idle client holds no server thread.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc

from countersign.client.errors import ServiceError, from_rpc_error

Request = TypeVar("Request")
Answer = TypeVar("Answer")
OpenStream = Callable[[Iterator[Any]], Any]  # a stub's stream-stream method: requests -> call

_CLOSE = object()  # ends a lane's request stream (a half-close: the server ends the lane with OK)
_ENDED = object()  # the server ended the lane


class _Lane:
    def __init__(self, open_stream: OpenStream) -> None:
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._call = open_stream(self._outgoing())
        self.ended = False
        self.idle_since = time.monotonic()
        threading.Thread(target=self._read, name="countersign-lane", daemon=True).start()

    def _outgoing(self) -> Iterator[object]:
        while (request := self._requests.get()) is not _CLOSE:
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

    def ask(self, request: object, timeout_s: float) -> object:
        self._requests.put(request)
        try:
            answer = self._answers.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            self.cancel()
            raise ServiceError("DEADLINE_EXCEEDED", "no answer within the deadline", retryable=True) from None
        if isinstance(answer, grpc.RpcError):
            error = from_rpc_error(answer)
            if error.code != "CANCELLED":
                raise error
            answer = _ENDED  # not by us: the server ended the lane (it is shutting down)
        if answer is _ENDED:
            raise ServiceError("UNAVAILABLE", "the server closed the lane", retryable=True)
        return answer

    def close(self) -> None:
        self._requests.put(_CLOSE)

    def cancel(self) -> None:
        self.ended = True
        self._call.cancel()
        self._requests.put(_CLOSE)  # frees gRPC's thread that sends from ``_outgoing``


def unary(method: Callable[..., Any]) -> Callable[[Any, float], Any]:
    """A unary stub method as ``call(request, timeout_s)``, raising :class:`ServiceError`."""

    def call(request: Any, timeout_s: float) -> Any:
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    return call


def aio_unary(method: Callable[..., Any]) -> Callable[[Any, float], Awaitable[Any]]:
    """:func:`unary` for a ``grpc.aio`` stub method: ``await call(request, timeout_s)``."""

    async def call(request: Any, timeout_s: float) -> Any:
        try:
            return await method(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    return call


class Lanes(Generic[Request, Answer]):
    """Up to ``size`` lanes to one server, opened with ``open_stream`` (on one channel). Lanes idle
    for ``idle_s`` are closed by a reaper thread shared by every pool in the process. When the server
    has no lane to give (``LANES_EXHAUSTED``), the call is made with ``fallback`` (the unary form):
    lanes are a way to be faster, never a new way to fail."""

    def __init__(
        self,
        open_stream: OpenStream,
        size: int,
        idle_s: float,
        fallback: Callable[[Request, float], Answer] | None = None,
    ) -> None:
        self._open_stream = open_stream
        self._fallback = fallback
        self._size = size
        self._idle_s = idle_s
        self._free: list[_Lane] = []
        self._open = 0
        self._changed = threading.Condition()
        _reaper.watch(self)

    def ask(self, request: Request, timeout_s: float) -> Answer:
        """The server's answer to one call; raises :class:`ServiceError` as a unary call would."""
        deadline = time.monotonic() + timeout_s
        lane = self._take(deadline)
        try:
            answer = lane.ask(request, deadline - time.monotonic())
        except ServiceError as error:
            self._drop(lane)
            if error.code == "LANES_EXHAUSTED" and self._fallback is not None:
                return self._fallback(request, max(deadline - time.monotonic(), 0.0))
            raise
        except BaseException:
            self._drop(lane)
            raise
        self._give_back(lane)
        return answer  # type: ignore[return-value]

    def _take(self, deadline: float) -> _Lane:
        with self._changed:
            while True:
                while self._free:
                    lane = self._free.pop()
                    if not lane.ended:
                        return lane
                    self._open -= 1  # ended while idle (the server restarted): open another
                if self._open < self._size:
                    self._open += 1
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._changed.wait(remaining):
                    raise ServiceError(
                        "DEADLINE_EXCEEDED", f"all {self._size} lanes stayed busy", retryable=True,
                    )  # fmt: skip
        try:
            return _Lane(self._open_stream)
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


class _Reaper:
    """One thread that closes idle lanes of every live pool (pools are held weakly)."""

    INTERVAL_S = 0.1

    def __init__(self) -> None:
        self._pools: weakref.WeakSet[Lanes[Any, Any]] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, pool: Lanes[Any, Any]) -> None:
        with self._lock:
            self._pools.add(pool)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="countersign-lane-reaper", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.INTERVAL_S)
            with self._lock:
                pools = list(self._pools)
            for pool in pools:
                pool.close_idle()


_reaper = _Reaper()
