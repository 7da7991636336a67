"""Per-peer limits: how many streams one client identity may hold open, and how fast it may call.

A sync gRPC server runs each open stream on a handler thread for the stream's whole life, idle or
not, and that includes the reflection and health streams every server carries. Without a bound, a
peer holding any certificate of the mesh's CA could open streams until no thread is left for anyone
else's unary calls. So every streaming method of a daemon (its own, reflection's, health's) takes a
slot: at most ``streams_per_peer`` for one identity and ``streams_total`` in all, and the server's
thread pool holds ``streams_total`` threads on top of those its unary calls use, so streams can never
take the threads unary calls need. Every call and every message on a request stream also spends a
token of its identity's bucket (``requests_per_second_per_peer``, ``burst_per_peer``). Refusals are
``RESOURCE_EXHAUSTED`` with the typed code, retryable, and counted in
``countersign_limit_refusals_total{limit}``.

A peer's identity is its certificate's URI (``PeerIdentity.uri``); on an explicit plaintext loopback
set-up it is the connection's address.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import prometheus_client

from countersign._daemon.edge import abort
from countersign._daemon.tls import peer_identity
from countersign.errors import ConfigError, ErrorCode, ServiceError

MAX_TRACKED_PEERS = 10_000  # buckets kept; the least recently seen is forgotten beyond this


@dataclasses.dataclass
class LimitsConfig:
    """The ``[limits]`` table of every daemon's configuration (``COUNTERSIGN_LIMITS_*``)."""

    streams_per_peer: int = 32
    streams_total: int = 128
    requests_per_second_per_peer: int = 5_000
    burst_per_peer: int = 10_000
    # Largest request message accepted, in bytes; 0 takes the daemon's own default (what its parsers
    # accept at most, with room for the message's other fields).
    max_message_bytes: int = 0
    # Request bytes all handlers may hold parsed at once (countersign._daemon.server.ReceiveBudget);
    # 0: four of the daemon's largest messages. A large request beyond it is refused, retryable.
    receive_budget_bytes: int = 0

    def validate(self) -> None:
        if not 1 <= self.streams_per_peer <= self.streams_total:
            raise ConfigError("limits.streams_per_peer must be between 1 and limits.streams_total")
        if not 1 <= self.streams_total <= 4096:
            raise ConfigError("limits.streams_total must be between 1 and 4096")
        if self.requests_per_second_per_peer < 1 or self.burst_per_peer < 1:
            raise ConfigError("limits.requests_per_second_per_peer and limits.burst_per_peer must be positive")
        if not 0 <= self.max_message_bytes <= 64 << 20:
            raise ConfigError("limits.max_message_bytes must be between 0 and 64 MiB")
        if not 0 <= self.receive_budget_bytes <= 1 << 30:
            raise ConfigError("limits.receive_budget_bytes must be between 0 and 1 GiB")


class _Bucket:
    __slots__ = ("stamp", "streams", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.streams = 0


class PeerLimits(grpc.ServerInterceptor):  # type: ignore[misc]
    """Counts each identity's open streams and call rate; refuses beyond the configured limits."""

    def __init__(self, config: LimitsConfig, registry: prometheus_client.CollectorRegistry | None) -> None:
        self._config = config
        self._peers: OrderedDict[str, _Bucket] = OrderedDict()
        self._streams = 0
        self._lock = threading.Lock()
        self._wrapped: dict[int, tuple[Any, Any]] = {}
        registry = registry or prometheus_client.CollectorRegistry()
        self._refusals = prometheus_client.Counter(
            "countersign_limit_refusals", "Calls refused by a per-peer limit, by limit (streams, rate)", ["limit"],
            registry=registry,
        )  # fmt: skip
        self._open = prometheus_client.Gauge(
            "countersign_streams_open", "Streaming calls open (each holds a handler thread)", registry=registry
        )
        for limit in ("streams_per_peer", "streams_total", "rate"):
            self._refusals.labels(limit)

    # --- the decisions -------------------------------------------------------------------------

    def _bucket(self, peer: str, now: float) -> _Bucket:
        bucket = self._peers.get(peer)
        if bucket is None:
            bucket = self._peers[peer] = _Bucket(float(self._config.burst_per_peer), now)
            while len(self._peers) > MAX_TRACKED_PEERS:
                oldest, dropped = next(iter(self._peers.items()))
                if dropped.streams:  # never forget a peer that holds streams: its count must come back down
                    self._peers.move_to_end(oldest)
                    break
                del self._peers[oldest]
        else:
            self._peers.move_to_end(peer)
        return bucket

    def spend(self, peer: str) -> ServiceError | None:
        """Take one token of ``peer``'s bucket; the refusal if it is empty."""
        now = time.monotonic()
        with self._lock:
            bucket = self._bucket(peer, now)
            rate, burst = self._config.requests_per_second_per_peer, self._config.burst_per_peer
            bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
            if bucket.tokens < 1:
                self._refusals.labels("rate").inc()
                return _exhausted(f"{peer} exceeds {rate} calls per second")
            bucket.tokens -= 1
            return None

    def open_stream(self, peer: str) -> ServiceError | None:
        """Take a stream slot for ``peer``; the refusal if its share or the total is used up."""
        with self._lock:
            bucket = self._bucket(peer, time.monotonic())
            if bucket.streams >= self._config.streams_per_peer:
                self._refusals.labels("streams_per_peer").inc()
                return _exhausted(f"{peer} already holds {self._config.streams_per_peer} open streams")
            if self._streams >= self._config.streams_total:
                self._refusals.labels("streams_total").inc()
                return _exhausted(f"this server already holds {self._config.streams_total} open streams")
            bucket.streams += 1
            self._streams += 1
        self._open.inc()
        return None

    def close_stream(self, peer: str) -> None:
        with self._lock:
            bucket = self._peers.get(peer)
            if bucket is not None:
                bucket.streams -= 1
            self._streams -= 1
        self._open.dec()

    # --- the interceptor -----------------------------------------------------------------------

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not hasattr(handler, "_replace"):
            return handler
        cached = self._wrapped.get(id(handler))
        if cached is not None and cached[0] is handler:
            return cached[1]
        streaming = handler.request_streaming or handler.response_streaming
        kind = (
            ("stream" if handler.request_streaming else "unary")
            + "_"
            + ("stream" if handler.response_streaming else "unary")
        )
        behaviour = getattr(handler, kind)
        if getattr(behaviour, "experimental_non_blocking", False):
            # A non-blocking handler answers through callbacks after it returns, so it cannot be held
            # to a slot this way; the server sets health up blocking for that reason.
            raise ConfigError(f"{handler_call_details.method}: non-blocking handlers cannot be limited")
        wrapped = handler._replace(**{kind: self._guarded(behaviour, streaming, handler.request_streaming)})
        self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped

    def _guarded(self, behaviour: Callable[..., Any], streaming: bool, request_streaming: bool) -> Callable[..., Any]:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            peer = _peer_of(context)
            refusal = self.spend(peer) or (self.open_stream(peer) if streaming else None)
            if refusal is not None:
                abort(context, refusal)
            if not streaming:
                return behaviour(request, context)
            release = self._release_once(peer)
            # The slot comes back when the call ends, however it ends (answered, failed, cancelled),
            # even if gRPC never finishes iterating the handler's response stream.
            context.add_callback(release)
            if request_streaming:
                request = self._metered(request, peer, context)
            try:
                answer = behaviour(request, context)
            except BaseException:
                release()
                raise
            if isinstance(answer, Iterator):
                return self._held(answer, release)
            release()
            return answer

        return call

    def _release_once(self, peer: str) -> Callable[[], None]:
        done = threading.Lock()

        def release() -> None:
            if done.acquire(blocking=False):  # the first caller releases; later ones find it taken
                self.close_stream(peer)

        return release

    def _metered(self, requests: Iterator[Any], peer: str, context: grpc.ServicerContext) -> Iterator[Any]:
        """Every message on a request stream spends a token, as a unary call does."""
        for request in requests:
            refusal = self.spend(peer)
            if refusal is not None:
                abort(context, refusal)
            yield request

    def _held(self, answers: Iterator[Any], release: Callable[[], None]) -> Iterator[Any]:
        """The response stream, holding its slot until it ends, fails or is closed."""
        try:
            yield from answers
        finally:
            release()


def _peer_of(context: grpc.ServicerContext) -> str:
    identity = peer_identity(context)
    return identity.uri if identity is not None else str(context.peer())


def _exhausted(message: str) -> ServiceError:
    return ServiceError(ErrorCode.RESOURCE_EXHAUSTED, message, retryable=True)
