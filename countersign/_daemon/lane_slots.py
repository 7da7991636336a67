"""The server side of lanes (``countersign/client/lanes.py`` is the client side, ADR 0008)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import prometheus_client

from countersign.errors import ServiceError

Request = TypeVar("Request")
Answer = TypeVar("Answer")


class LaneSlots:
    """The server side: answers each lane's calls in order on the lane's own handler thread, holding
    one of ``per_key`` slots of the lane's key (a peer deployer, a connection) and, with ``total``, one
    of that many slots overall, since each open lane holds a handler thread. :meth:`stop` ends the
    idle lanes (a busy one once its call is answered)."""

    def __init__(self, per_key: int, gauge: prometheus_client.Gauge, total: int | None = None) -> None:
        self._per_key = per_key
        self._total = total
        self._gauge = gauge
        self._open: dict[str, int] = {}
        self._busy: dict[grpc.ServicerContext, bool] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def serve(
        self,
        kind: str,
        key: str,
        requests: Iterator[Request],
        context: grpc.ServicerContext,
        decide: Callable[[Request], Answer],
    ) -> Iterator[Answer]:
        release = self._take(kind, key, context)
        try:
            for request in requests:
                with self._lock:
                    self._busy[context] = True
                yield decide(request)  # resumed once gRPC has sent the answer
                if self._idle_again(context):  # shutting down: the call in flight was answered; end the lane
                    return
        finally:
            release()

    def hold(self, kind: str, key: str, context: grpc.ServicerContext) -> Callable[[], None]:
        """Take a slot for a stream that is not a lane of calls (one request stream, many answers):
        counted with the lanes of ``kind`` and ``key``, busy from the start (``stop`` lets it finish).
        The slot comes back by the returned function or when the call ends, whichever is first."""
        release = self._take(kind, key, context)
        with self._lock:
            self._busy[context] = True
        context.add_callback(release)  # the call ended (answered, failed, cancelled) even if never iterated to its end
        return release

    def _take(self, kind: str, key: str, context: grpc.ServicerContext) -> Callable[[], None]:
        slot = f"{kind}:{key}"
        with self._lock:
            if self._stopping:  # a lane opened now would hold the server for its whole grace period
                raise ServiceError("UNAVAILABLE", "shutting down", retryable=True)
            if self._open.get(slot, 0) >= self._per_key:
                raise ServiceError(
                    "LANES_EXHAUSTED", f"{key} already has {self._per_key} {kind} lanes open", retryable=True,
                )  # fmt: skip
            if self._total is not None and len(self._busy) >= self._total:
                raise ServiceError(
                    "LANES_EXHAUSTED", f"this server already has {self._total} lanes open", retryable=True,
                )  # fmt: skip
            self._open[slot] = self._open.get(slot, 0) + 1
            self._busy[context] = False
        gauge = self._gauge.labels(kind)
        gauge.inc()
        once = threading.Lock()

        def release() -> None:
            if not once.acquire(blocking=False):  # released already (by the call's end, or the stream's)
                return
            with self._lock:
                del self._busy[context]
                self._open[slot] -= 1
                if not self._open[slot]:
                    del self._open[slot]
            gauge.dec()

        return release

    def _idle_again(self, context: grpc.ServicerContext) -> bool:
        """Mark the lane idle; True when the server is stopping (the lane should end)."""
        with self._lock:
            self._busy[context] = False
            return self._stopping

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            idle = [context for context, busy in self._busy.items() if not busy]
        for context in idle:
            context.cancel()
