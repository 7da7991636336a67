"""A small TCP delay proxy (asyncio protocols): the harness's stand-in for netem on kernels without it.

One process serves several *routes*. A route listens on ``listen`` and forwards every accepted
connection to ``target``, holding each chunk of bytes for a one-way ``delay_ms`` (plus optional
``jitter_ms``) in each direction before writing it on. Bytes are forwarded as they come (no framing,
no buffering beyond the delay) and in order: a chunk is never released before the one read before
it, so jitter can stretch gaps but never reorder.

The first payload byte towards the target is held until one extra round trip (``2 × delay``) after
the upstream connect started (so 3 × delay in all), so a new connection pays for its TCP handshake
as it would across the link; after that only the one-way delay applies.

It is a *payload* delay, not a packet delay: the client's own TCP connection ends at the proxy (local,
sub-millisecond) so TCP's RTT estimate, congestion window and retransmission timers on the client
side see no delay; ACKs are not delayed; loss is not modelled here (the harness drops real packets
with iptables, which this proxy's upstream connection then suffers). See docs/zones.md.

A route with ``"echo": true`` is an echo server instead (for calibrating the delay).

Run: ``python -m tools.zones.proxy SPEC.json READY.json``. SPEC is ``{"routes": [{"name", "listen_host",
"listen_port", "target_host", "target_port", "delay_ms", "jitter_ms", "connect_timeout_s",
"source_host", "echo"}...]}``;
once every route listens, READY gets ``{"pid": ..., "ports": {name: port}}``. SIGHUP re-reads SPEC
and applies new ``delay_ms`` / ``jitter_ms`` values to data read from then on (listeners stay).
SIGTERM / SIGINT stop the process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import json
import os
import random
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HIGH_WATER = 4 * 1024 * 1024  # bytes held in one direction before reading pauses (back-pressure)
PR_SET_TIMERSLACK = 29


@dataclass
class Route:
    name: str
    listen_host: str
    listen_port: int = 0
    target_host: str = ""
    target_port: int = 0
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    connect_timeout_s: float = 3.0
    source_host: str = ""  # bind upstream connections to this local address (empty: the kernel's choice)
    echo: bool = False

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Route:
        return cls(**body)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _abort(transport: asyncio.BaseTransport | None) -> None:
    """Close with a reset (SO_LINGER 0), so the other side sees the connection fail, not end."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()  # type: ignore[attr-defined]


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Direction:
    """One direction of one connection: stamp each chunk read with a release time, write it when due.

    Driven by transport callbacks and one timer at a time (no tasks, no streams): the proxy's own CPU
    per chunk is the stand-in's cost, not the link's, and it shares the CPUs with what it measures.
    """

    def __init__(self, route: Route, source: asyncio.Transport, not_before: float, on_end: Callable[[], None]) -> None:
        self.route = route
        self.source = source
        self.on_end = on_end
        self.target: asyncio.Transport | None = None  # None while the upstream connection is being made
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.held = 0
        self.last_release = not_before
        self.timer: asyncio.TimerHandle | None = None
        self.over_high_water = False
        self.target_full = False
        self.ended = False  # the end of stream was written on
        self.loop = asyncio.get_running_loop()

    def _release_time(self, now: float) -> float:
        delay = self.route.delay_ms
        if self.route.jitter_ms:
            delay += random.uniform(-self.route.jitter_ms, self.route.jitter_ms)  # noqa: S311 - not crypto
        release = max(now + max(delay, 0.0) / 1000, self.last_release)
        self.last_release = release
        return release

    def push(self, data: bytes | None) -> None:
        """Hold ``data`` (None: the end of the stream) for the delay."""
        self.queue.append((self._release_time(self.loop.time()), data))
        if data:
            self.held += len(data)
            if self.held > HIGH_WATER:
                self.over_high_water = True
                self._pace_reading()
        self.schedule()

    def schedule(self) -> None:
        if self.timer is None and self.queue and self.target is not None:
            self.timer = self.loop.call_at(self.queue[0][0], self._release)

    def _release(self) -> None:
        self.timer = None
        target = self.target
        assert target is not None
        now = self.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            if data is None:
                if target.can_write_eof():
                    target.write_eof()
                self.ended = True
                self.on_end()
                return
            target.write(data)
            self.held -= len(data)
        if self.over_high_water and self.held <= HIGH_WATER // 2:
            self.over_high_water = False
            self._pace_reading()
        self.schedule()

    def target_paused(self, paused: bool) -> None:
        self.target_full = paused
        self._pace_reading()

    def _pace_reading(self) -> None:
        """Back-pressure: stop reading while too much is held or the target's buffer is full."""
        if self.source.is_closing():
            return
        if self.over_high_water or self.target_full:
            self.source.pause_reading()
        else:
            self.source.resume_reading()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()


class Link:
    """One proxied connection: the client's socket, the upstream socket to the target, two directions."""

    def __init__(self, proxy: ProxyServer, route: Route, client: asyncio.Transport) -> None:
        self.proxy = proxy
        self.route = route
        self.client = client
        self.upstream: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        # The first bytes reach the target no earlier than after the handshake's round trip plus the
        # one-way delay (3 × delay after connecting), as if the client had connected across the link.
        self.up = Direction(route, client, loop.time() + 3 * route.delay_ms / 1000, self.direction_ended)
        self.down: Direction | None = None
        self.connecting = loop.create_task(self._connect())
        proxy.links.add(self)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _UpstreamSide(self),
                    self.route.target_host,
                    self.route.target_port,
                    local_addr=(self.route.source_host, 0) if self.route.source_host else None,
                ),
                self.route.connect_timeout_s,
            )
        except (OSError, TimeoutError):
            self.fail()
            return
        if self.client.is_closing():  # the client went away while we connected
            _abort(upstream)
            return
        self.upstream = upstream
        self.down = Direction(self.route, upstream, loop.time(), self.direction_ended)
        self.down.target = self.client
        self.up.target = upstream
        self.up.schedule()

    def received(self, upstream: bool, data: bytes | None) -> None:
        direction = self.down if upstream else self.up
        assert direction is not None
        direction.push(data)

    def paused(self, upstream: bool, paused: bool) -> None:
        """``upstream``'s socket buffer filled (or drained): pace the direction that writes to it."""
        direction = self.up if upstream else self.down
        if direction is not None:
            direction.target_paused(paused)

    def lost(self, exc: Exception | None) -> None:
        """Either socket closed: an error resets the other side; an orderly end closes both."""
        if exc is not None:
            self.fail()
        else:
            self.direction_ended()

    def direction_ended(self) -> None:
        """Close both sockets once the end of the stream has been written on in both directions."""
        if self.up.ended and self.down is not None and self.down.ended:
            self.close()

    def fail(self) -> None:
        self._stop()
        _abort(self.client)
        _abort(self.upstream)

    def close(self) -> None:
        self._stop()
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.close()

    def _stop(self) -> None:
        self.connecting.cancel()
        self.up.cancel()
        if self.down is not None:
            self.down.cancel()
        self.proxy.links.discard(self)


class _Side(asyncio.Protocol):
    """What one of a link's two sockets reports goes to its link."""

    upstream = False
    link: Link | None = None

    def data_received(self, data: bytes) -> None:
        assert self.link is not None
        self.link.received(self.upstream, data)

    def eof_received(self) -> bool:
        assert self.link is not None
        self.link.received(self.upstream, None)
        return True  # half-close: keep writing the other direction

    def pause_writing(self) -> None:
        assert self.link is not None
        self.link.paused(self.upstream, True)

    def resume_writing(self) -> None:
        assert self.link is not None
        self.link.paused(self.upstream, False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.link is not None:
            self.link.lost(exc)


class _ClientSide(_Side):
    """An accepted connection: it starts a link (and the connection to the route's target)."""

    def __init__(self, proxy: ProxyServer, route: Route) -> None:
        self.proxy = proxy
        self.route = route

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        _nodelay(transport)
        self.link = Link(self.proxy, self.route, transport)


class _UpstreamSide(_Side):
    upstream = True

    def __init__(self, link: Link) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _nodelay(transport)


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        _nodelay(transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class ProxyServer:
    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.routes: dict[str, Route] = {}
        self.servers: list[asyncio.base_events.Server] = []
        self.links: set[Link] = set()

    def load(self) -> list[Route]:
        body = json.loads(self.spec_path.read_text())
        return [Route.from_json(r) for r in body["routes"]]

    def reload(self) -> None:
        """Apply new delays from the spec file (SIGHUP). Listeners and targets stay as they are."""
        try:
            routes = self.load()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"tools.zones.proxy: cannot reload {self.spec_path}: {exc}", file=sys.stderr)
            return
        for route in routes:
            current = self.routes.get(route.name)
            if current is not None:
                current.delay_ms, current.jitter_ms = route.delay_ms, route.jitter_ms

    async def start(self) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        ports: dict[str, int] = {}
        for route in self.load():
            self.routes[route.name] = route

            def factory(route: Route = route) -> asyncio.Protocol:
                return _Echo() if route.echo else _ClientSide(self, route)

            server = await loop.create_server(factory, route.listen_host, route.listen_port, reuse_address=True)
            self.servers.append(server)
            ports[route.name] = server.sockets[0].getsockname()[1]
        return ports

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for link in list(self.links):
            link.fail()


def _precise_timers() -> asyncio.AbstractEventLoop:
    """An event loop whose timers are precise to tens of microseconds.

    The default epoll selector rounds every timeout up to a whole millisecond, which would turn a
    0.5 ms delay into about 1.1 ms; ``select()`` takes microseconds. The timer slack of this process
    is lowered to 1 µs (Linux prctl) for the same reason. A proxy has few sockets, so select's
    descriptor limit does not matter.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


async def _serve(spec: Path, ready: Path) -> None:
    proxy = ProxyServer(spec)
    ports = await proxy.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGHUP, proxy.reload)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    temporary = ready.with_name(ready.name + ".tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), "ports": ports}))
    os.replace(temporary, ready)
    await stop.wait()
    await proxy.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tools.zones.proxy SPEC.json READY.json", file=sys.stderr)
        return 2
    loop = _precise_timers()
    try:
        loop.run_until_complete(_serve(Path(argv[0]), Path(argv[1])))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
