"""gRPC servers with health and reflection, metrics endpoints, ready files and graceful shutdown."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, Protocol

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from countersign._daemon.config import parse_address
from countersign._daemon.edge import abort
from countersign._daemon.limits import LimitsConfig, PeerLimits
from countersign._daemon.logs import setup_logging, stop_logging
from countersign._daemon.memory import MemoryTrimmer
from countersign._daemon.tls import server_credentials
from countersign.client.tls import CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, TlsConfig
from countersign.errors import ConfigError, ServiceError

log = logging.getLogger("countersign.service")
SMALL_MESSAGE_BYTES = 64 << 10  # health and reflection requests, and methods that take only names


class Daemon(Protocol):
    """What a daemon gives the shared runner."""

    def register(self, server: grpc.Server) -> Sequence[str]:
        """Add the servicers; return their full service names."""
        ...

    def start(self) -> None:
        """Start background work (watch streams, collectors) after the server is up."""
        ...

    def close(self) -> None:
        """Stop background work and release stores, after the server has drained."""
        ...

    # Optional: ``stopping()``, called when shutdown begins, before the server drains: end open
    # streams there, so that only in-flight unary calls use the grace period.


class _Undecodable:
    """A request whose bytes do not parse as the method's message type."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Refused:
    """A request refused before parsing: over its method's size limit, or over the receive budget."""

    def __init__(self, error: ServiceError) -> None:
        self.error = error


class ReceiveBudget:
    """The request bytes all handlers may hold at once (``[limits] receive_budget_bytes``).

    A sync gRPC server receives a whole message before its handler runs, on every thread of its pool
    (a verifier has about 200), and the handler's parsing takes several times the message's size
    again. A message of at least ``threshold`` bytes takes its size from the budget before it is
    parsed and gives it back when its call ends (a stream's: when the next message is asked for);
    beyond the budget it is refused ``RESOURCE_EXHAUSTED``, retryable, before parsing, so a burst of
    large requests costs at most the budget in parsed form (ADR 0027). Smaller messages are free.
    """

    def __init__(self, capacity: int, threshold: int = 64 << 10) -> None:
        self.capacity = capacity
        self.threshold = threshold
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        return self._held

    def take(self, size: int) -> Callable[[], None] | None:
        """Reserve ``size`` bytes; the release (call it once or more), or None when over budget."""
        if size < self.threshold:
            return _nothing
        with self._lock:
            if self._held + size > self.capacity:
                return None
            self._held += size
        done = threading.Lock()

        def release() -> None:
            if done.acquire(blocking=False):
                with self._lock:
                    self._held -= size

        return release


def _nothing() -> None:
    pass


class _Received:
    """A parsed request holding its share of the receive budget until its call is done with it."""

    __slots__ = ("message", "release")

    def __init__(self, message: Any, release: Callable[[], None]) -> None:
        self.message = message
        self.release = release

    def __del__(self) -> None:  # a backstop: a call refused before its handler ran still gives it back
        self.release()


def _tolerant(
    deserializer: Callable[[bytes], Any], limit: int, budget: ReceiveBudget | None, method: str
) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        if len(data) > limit:
            error = f"{method} takes requests of at most {limit} bytes"
            return _Refused(ServiceError("RESOURCE_EXHAUSTED", error))
        release = _nothing if budget is None else budget.take(len(data))
        if release is None:
            error = "too many large requests at once; retry"
            return _Refused(ServiceError("RESOURCE_EXHAUSTED", error, retryable=True))
        try:
            message = deserializer(data)
        except Exception as exc:  # protobuf's DecodeError, also for bad UTF-8 in a string field
            release()
            return _Undecodable(exc)
        return message if release is _nothing else _Received(message, release)

    return parse


def _refuse_undecodable(context: grpc.ServicerContext, what: str, request: _Undecodable) -> NoReturn:
    error = f"{what} is not a valid message: {request.error}"
    abort(context, ServiceError("INVALID_ARGUMENT", error))


def _unwrapped(request: Any, context: grpc.ServicerContext, what: str) -> tuple[Any, Callable[[], None]]:
    """The parsed message and its budget release, or the typed refusal of what could not be parsed."""
    if isinstance(request, _Received):
        return request.message, request.release
    if isinstance(request, _Undecodable):
        _refuse_undecodable(context, what, request)
    if isinstance(request, _Refused):
        abort(context, request.error)
    return request, _nothing


def _refusing(behaviour: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        message, release = _unwrapped(request, context, "the request")
        del request
        try:
            return behaviour(message, context)
        finally:  # a response stream has parsed its request by now; the answers hold no budget
            release()

    return handle


def _checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
    release = _nothing
    try:
        for request in requests:
            release()  # the previous message is answered: its bytes go back before the next is parsed
            message, release = _unwrapped(request, context, "a message on the stream")
            del request
            yield message
    finally:
        release()


Behaviour = Callable[[Any, grpc.ServicerContext], Any]


def _refusing_stream(behaviour: Behaviour) -> Behaviour:
    def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        return behaviour(_checked(requests, context), context)

    return handle


class DecodeGuard(grpc.ServerInterceptor):  # type: ignore[misc]
    """Answer a request (or a message on a request stream) that does not parse with INVALID_ARGUMENT.
    Left to gRPC it would be INTERNAL (which means a bug) and log an error with a traceback for what
    is only bad client input. Also holds each method to its own size limit (``limits``: full method
    name -> bytes; others ``default_limit``) and large messages to the receive budget."""

    def __init__(
        self,
        limits: Mapping[str, int] | None = None,
        default_limit: int = MAX_MESSAGE_BYTES,
        budget: ReceiveBudget | None = None,
    ) -> None:
        self._wrapped: dict[int, Any] = {}  # per handler object: wrap once, not on every call
        self._limits = dict(limits or {})
        self._default_limit = default_limit
        self._budget = budget

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or not hasattr(handler, "_replace") or handler.request_deserializer is None:
            return handler
        key = id(handler)
        cached = self._wrapped.get(key)
        if cached is not None and cached[0] is handler:
            return cached[1]
        if handler.request_streaming:
            method = "stream_stream" if handler.response_streaming else "stream_unary"
            refusing = _refusing_stream
        else:
            method = "unary_stream" if handler.response_streaming else "unary_unary"
            refusing = _refusing
        name = handler_call_details.method
        limit = self._limits.get(name, self._default_limit)
        wrapped = handler._replace(
            request_deserializer=_tolerant(handler.request_deserializer, limit, self._budget, name),
            **{method: refusing(getattr(handler, method))},
        )
        self._wrapped[key] = (handler, wrapped)
        return wrapped


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which container runtimes narrow)."""
    return len(os.sched_getaffinity(0))


def worker_count(configured: int) -> int:
    """Handler threads: ``configured``, or with 0 two per CPU this process may run on. Verification
    and signing are CPU-bound and hold the GIL; on one core more threads only add GIL hand-offs (each
    Ed25519 check releases it), while two keep a thread busy when the other waits on a store."""
    return configured if configured > 0 else 2 * usable_cpus()


def create_server(
    listen: str,
    tls: TlsConfig,
    register: Callable[[grpc.Server], Sequence[str]],
    *,
    max_workers: int = 0,
    limits: LimitsConfig | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    metrics_registry: prometheus_client.CollectorRegistry | None = None,
    method_limits: Mapping[str, int] | None = None,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """Build and start a server bound to ``listen`` (port 0 picks a free port); return it with its port.

    The pool holds ``max_workers`` threads for unary calls plus one per stream ``limits`` lets open
    (``countersign._daemon.limits``), so open streams never take the threads unary calls need.
    ``method_limits`` (full method name -> bytes) holds each listed method to what it needs, and every
    other method (health, reflection) to ``SMALL_MESSAGE_BYTES``; without it every method takes up to
    ``max_message_bytes``, which caps them all in either case.
    """
    parse_address(listen, "listen")
    limits = limits or LimitsConfig()
    workers = worker_count(max_workers)
    if method_limits is None:
        per_method: dict[str, int] = {}
        default_limit = max_message_bytes
    else:
        per_method = {name: min(size, max_message_bytes) for name, size in method_limits.items()}
        default_limit = min(SMALL_MESSAGE_BYTES, max_message_bytes)
    # gRPC refuses beyond this before a handler runs; the per-method limits are checked before parsing.
    receive_limit = max([default_limit, *per_method.values()])
    options = [
        *[(name, value) for name, value in CHANNEL_OPTIONS if name != "grpc.max_receive_message_length"],
        ("grpc.max_receive_message_length", receive_limit),
    ]
    configured = limits.receive_budget_bytes
    budget = ReceiveBudget(max(configured, receive_limit) if configured else 4 * receive_limit)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers + limits.streams_total),
        options=options,
        interceptors=[PeerLimits(limits, metrics_registry), DecodeGuard(per_method, default_limit, budget)],
        # A bound on calls queued for a thread, so a flood of unary calls cannot grow without limit.
        maximum_concurrent_rpcs=limits.streams_total + 16 * workers,
    )
    names = list(register(server))
    # Blocking, so that each health watch holds a stream slot like every other stream (a
    # non-blocking watch would hold no thread but could not be counted against its peer's limit).
    health_servicer = _HealthWithList(experimental_non_blocking=False)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    try:
        if tls.insecure_loopback:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, server_credentials(tls))
    except RuntimeError as exc:
        raise ConfigError(f"cannot listen on {listen}: {exc}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {listen}")
    server.start()
    for name in ("", *names):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, port, health_servicer


class _HealthWithList(health.HealthServicer):  # type: ignore[misc]
    """The standard health service, with ``List`` (advertised by the proto, but left unimplemented
    by the library: each call would log an error with a traceback)."""

    def List(self, request: health_pb2.HealthListRequest, context: grpc.ServicerContext) -> Any:  # noqa: N802 (the proto names it)
        with self._lock:
            statuses = {
                name: health_pb2.HealthCheckResponse(status=status) for name, status in self._server_status.items()
            }
        return health_pb2.HealthListResponse(statuses=statuses)


def start_metrics(listen: str, registry: prometheus_client.CollectorRegistry) -> tuple[Any, int]:
    host, port = parse_address(listen, "metrics_listen")
    try:
        httpd, _ = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {listen}: {exc.strerror}") from None
    return httpd, int(httpd.server_port)


def run_daemon(
    name: str,
    daemon: Daemon,
    *,
    listen: str,
    tls: TlsConfig,
    metrics_listen: str,
    metrics_registry: prometheus_client.CollectorRegistry,
    ready_file: str,
    log_level: str,
    grace_s: float = 5.0,
    lifeline_fd: int = -1,
    max_workers: int = 0,
    limits: LimitsConfig | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    method_limits: Mapping[str, int] | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT, then drain in-flight calls for ``grace_s`` and exit 0. With a
    ``lifeline_fd`` (a pipe's read end whose write end the starting process holds), that process's end
    stops the daemon the same way (:func:`watch_lifeline`)."""
    logging_thread = setup_logging(name, log_level)
    stop = StopSignals()
    if lifeline_fd >= 0:
        watch_lifeline(lifeline_fd)
    server, port, health_servicer = create_server(
        listen, tls, daemon.register, max_workers=max_workers, limits=limits,
        max_message_bytes=max_message_bytes, metrics_registry=metrics_registry, method_limits=method_limits,
    )  # fmt: skip
    httpd = None
    metrics_port = 0
    if metrics_listen:
        httpd, metrics_port = start_metrics(metrics_listen, metrics_registry)
    daemon.start()
    trimmer = MemoryTrimmer()
    trimmer.start()
    if ready_file:
        write_ready_file(ready_file, {"grpc_port": port, "metrics_port": metrics_port, "pid": os.getpid()})
    log.info(
        "serving",
        extra={"listen": listen, "port": port, "metrics_port": metrics_port, "tls": not tls.insecure_loopback},
    )
    signum = stop.wait()
    log.info("stopping", extra={"grace_s": grace_s, "signal": signal.Signals(signum).name})
    health_servicer.enter_graceful_shutdown()
    stopping = getattr(daemon, "stopping", None)
    if stopping is not None:
        stopping()
    server.stop(grace_s).wait()
    daemon.close()
    trimmer.stop()
    if httpd is not None:
        httpd.shutdown()
    log.info("stopped")
    stop_logging(logging_thread)
    return 0


class StopSignals:
    """SIGTERM and SIGINT, delivered through a pipe the main thread reads.

    The handler must not touch a lock: it runs in the main thread between two bytecodes, which may be
    inside ``threading.Event.wait`` holding the event's own lock, so a handler that called
    ``Event.set`` could deadlock and the daemon would ignore SIGTERM until killed. Python's C-level
    handler writes the signal number to the wakeup fd, from whichever thread the kernel chose, and a
    signal that arrives before ``wait`` stays in the pipe. Install before the daemon reports ready;
    a stop signal during the drain changes nothing.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in self.SIGNALS:
            signal.signal(signum, _noted)

    def wait(self) -> int:
        """Block until one of the signals arrives; return its number (each signal is returned once)."""
        while True:
            received = os.read(self._read, 1)
            if received and received[0] in self.SIGNALS:
                return received[0]


def watch_lifeline(fd: int) -> threading.Thread:
    """Stop this process as SIGTERM would once ``fd`` reads end of file: ``fd`` is a pipe's read end
    inherited from the process that started this one, which holds the write end and never writes, so
    the end of file means that process is gone, however it ended (SIGKILL included). A test run or a
    demo killed outright then leaves no daemon behind. (Linux's PR_SET_PDEATHSIG fires when the thread
    that started the child ends, not the process, and the mesh starts daemons from many threads.)
    Raises ConfigError when ``fd`` is not an open pipe."""
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        raise ConfigError(f"lifeline_fd {fd} is not an open pipe")

    def wait_for_the_end() -> None:
        try:
            while os.read(fd, 64):  # the starting process never writes; data would not mean it is gone
                pass
        except OSError:
            pass
        log.warning("the process that started this daemon is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=wait_for_the_end, name="lifeline", daemon=True)
    thread.start()
    return thread


def _noted(signum: int, frame: object) -> None:
    """The Python-level part of a stop signal does nothing: the wakeup fd already carries it."""


def write_ready_file(location: str, body: dict[str, int]) -> None:
    """Atomically publish the bound ports, so a supervisor never reads a half-written file."""
    path = Path(location)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(body))
    os.replace(temporary, path)
