"""A small TCP delay proxy (asyncio): the harness's stand-in for netem on kernels without it.

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

Run: ``python -m zones.proxy SPEC.json READY.json``. SPEC is ``{"routes": [{"name", "listen_host",
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 64 * 1024
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


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (SO_LINGER 0), so the other side sees the connection fail, not end."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Direction:
    """One direction of one connection: read, stamp a release time, write when it is due."""

    def __init__(
        self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, not_before: float
    ) -> None:
        self.route = route
        self.reader = reader
        self.writer = writer
        self.queue: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.held = 0
        self.last_release = not_before
        self.ready = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()

    def _release_time(self, now: float) -> float:
        delay = self.route.delay_ms
        if self.route.jitter_ms:
            delay += random.uniform(-self.route.jitter_ms, self.route.jitter_ms)  # noqa: S311 - not crypto
        release = max(now + max(delay, 0.0) / 1000, self.last_release)
        self.last_release = release
        return release

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.drained.wait()
            data = await self.reader.read(CHUNK)
            self.queue.append((self._release_time(loop.time()), data or None))
            self.ready.set()
            if not data:
                return
            self.held += len(data)
            if self.held > HIGH_WATER:
                self.drained.clear()

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self.queue:
                self.ready.clear()
                await self.ready.wait()
            release, data = self.queue[0]
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.queue.popleft()
            if data is None:
                if self.writer.can_write_eof():
                    self.writer.write_eof()
                return
            self.writer.write(data)
            self.held -= len(data)
            if self.held <= HIGH_WATER // 2:
                self.drained.set()
            if not self.queue:
                await self.writer.drain()


class ProxyServer:
    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.routes: dict[str, Route] = {}
        self.servers: list[asyncio.base_events.Server] = []
        self.connections: set[asyncio.Task[None]] = set()

    def load(self) -> list[Route]:
        body = json.loads(self.spec_path.read_text())
        return [Route.from_json(r) for r in body["routes"]]

    def reload(self) -> None:
        """Apply new delays from the spec file (SIGHUP). Listeners and targets stay as they are."""
        try:
            routes = self.load()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"zones.proxy: cannot reload {self.spec_path}: {exc}", file=sys.stderr)
            return
        for route in routes:
            current = self.routes.get(route.name)
            if current is not None:
                current.delay_ms, current.jitter_ms = route.delay_ms, route.jitter_ms

    async def start(self) -> dict[str, int]:
        ports: dict[str, int] = {}
        for route in self.load():
            self.routes[route.name] = route
            handler = self._echo if route.echo else self._handler(route)
            server = await asyncio.start_server(handler, route.listen_host, route.listen_port, reuse_address=True)
            self.servers.append(server)
            ports[route.name] = server.sockets[0].getsockname()[1]
        return ports

    def _handler(self, route: Route) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self.connections.add(task)
            try:
                await self._forward(route, reader, writer)
            finally:
                self.connections.discard(task)

        return handle

    async def _forward(self, route: Route, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        loop = asyncio.get_running_loop()
        started = loop.time()
        # The first bytes reach the target no earlier than after the handshake's round trip plus the
        # one-way delay (3 × delay after connecting), as if the client had connected across the link.
        up_first = started + 3 * route.delay_ms / 1000
        upstream_in = Direction(route, reader, writer, up_first)  # placeholder writer, set below
        reading = asyncio.ensure_future(upstream_in.pump_in())  # read (and delay) while connecting
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(
                    route.target_host,
                    route.target_port,
                    local_addr=(route.source_host, 0) if route.source_host else None,
                ),
                route.connect_timeout_s,
            )
        except (OSError, TimeoutError):
            reading.cancel()
            _abort(writer)
            return
        _nodelay(target_writer)
        upstream_in.writer = target_writer
        downstream = Direction(route, target_reader, writer, loop.time())
        tasks = [
            reading,
            asyncio.ensure_future(upstream_in.pump_out()),
            asyncio.ensure_future(downstream.pump_in()),
            asyncio.ensure_future(downstream.pump_out()),
        ]
        failed = False
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(t.exception() is not None for t in done if not t.cancelled()):
                    failed = True
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for side in (writer, target_writer):
                if failed:
                    _abort(side)
                else:
                    side.close()

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _nodelay(writer)
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


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
        print("usage: python -m zones.proxy SPEC.json READY.json", file=sys.stderr)
        return 2
    loop = _precise_timers()
    try:
        loop.run_until_complete(_serve(Path(argv[0]), Path(argv[1])))
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
