"""The relay behind ``countersign mcp-proxy``: this process's stdio to a child MCP stdio server and back,
each tool result signed on its way to the client (countersign.integrations.mcp's SessionSigner). The
subprocess and stream plumbing lives here, with the command line; the integration keeps what signing
a result means."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from countersign.errors import ErrorCode, ServiceError
from countersign.integrations import kit, mcp

_log = logging.getLogger("countersign.mcp_proxy")


def _json_object(line: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _line(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _error_line(request_id: object, error: ServiceError) -> bytes:
    return _line(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": {"code": mcp.REFUSAL_CODE, "message": mcp.refusal_message(error), "data": mcp.refusal_data(error)},
        }
    )


Write = Callable[[bytes], Awaitable[None]]


@dataclass
class StdioProxy:
    """The relay of :func:`run_stdio_proxy` between one client's streams and one child server's.

    Client to child: every line as is; a ``tools/call`` request first obtains the session's agent
    record (a refusal is answered here and the call never reaches the child) and is remembered by
    id. Child to client: every line as is, except the answer to a remembered ``tools/call``, whose
    result is signed (in the order the answers arrive, so ``seq`` follows the client's reading order)
    and re-encoded with its evidence, or replaced by a refusal when signing fails."""

    session: mcp.SessionSigner
    max_pending: int = mcp.MAX_PENDING_CALLS
    pending: set[str] = field(default_factory=set)
    # Calls the client cancelled (``notifications/cancelled``), newest last: their slot is free, and
    # an answer the server sends anyway is dropped (the client ignores it, and a signed one would be
    # a receipt missing from the session the client holds). Bounded like ``pending``.
    cancelled: dict[str, None] = field(default_factory=dict)

    async def from_client(self, reader: asyncio.StreamReader, child_stdin: asyncio.StreamWriter, reply: Write) -> None:
        try:
            await self._relay_client(reader, child_stdin, reply)
        except ValueError:  # a line past the reader's limit: the stream cannot be framed any more
            _log.error("a client message exceeds %d bytes: closing the session", mcp.MAX_LINE_BYTES)
        finally:
            child_stdin.close()  # the child sees the end of its input and exits

    async def _relay_client(
        self, reader: asyncio.StreamReader, child_stdin: asyncio.StreamWriter, reply: Write
    ) -> None:
        while line := await reader.readline():
            message = _json_object(line)
            if message is not None and message.get("method") == "notifications/cancelled":
                self._cancel(message.get("params"))
            if message is not None and message.get("method") == "tools/call" and "id" in message:
                key = json.dumps(message["id"])
                params = message.get("params")
                try:
                    if len(self.pending) >= self.max_pending:
                        raise ServiceError(ErrorCode.RESOURCE_EXHAUSTED, f"{self.max_pending} tool calls already open")
                    await self.session.agent_for(params.get("_meta") if isinstance(params, dict) else None)
                except ServiceError as exc:
                    _log.info("tool call refused: %s", exc.code.value)
                    await reply(_error_line(message["id"], exc))
                    continue
                self.pending.add(key)
                self.cancelled.pop(key, None)  # an id used again is a new call
            child_stdin.write(line)
            await child_stdin.drain()

    def _cancel(self, params: object) -> None:
        """A cancellation of a tool call this proxy holds open frees its slot (relayed as any line)."""
        if not isinstance(params, dict) or "requestId" not in params:
            return
        key = json.dumps(params["requestId"])
        if key in self.pending:
            self.pending.discard(key)
            self.cancelled[key] = None
            while len(self.cancelled) > self.max_pending:
                del self.cancelled[next(iter(self.cancelled))]

    async def from_child(self, child_stdout: asyncio.StreamReader, reply: Write) -> None:
        while line := await child_stdout.readline():
            message = _json_object(line)
            if message is not None and "id" in message and "method" not in message:
                key = json.dumps(message["id"])
                if key in self.cancelled:
                    del self.cancelled[key]
                    _log.info("dropped the answer to a tool call the client cancelled")
                    continue
                if key in self.pending:
                    self.pending.discard(key)
                    line = await self._signed(message, line)
            await reply(line)

    async def _signed(self, message: dict[str, Any], line: bytes) -> bytes:
        result = message.get("result")
        if not isinstance(result, dict) or mcp.is_interim(result):
            return line  # a JSON-RPC error, or an input_required answer: not a tool result
        try:
            return _line({**message, "result": await self.session.sign(result)})
        except ServiceError as exc:
            _log.info("tool result not signed: %s", exc.code.value)
            return _error_line(message["id"], exc)


async def _stdio_streams(stdin: BinaryIO, stdout: BinaryIO) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=mcp.MAX_LINE_BYTES)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, stdout)
    return reader, asyncio.StreamWriter(transport, protocol, None, loop)


async def run_stdio_proxy(
    command: Sequence[str],
    runtime: mcp.RuntimeSource = None,
    *,
    system: str | None = None,
    name: str = "mcp-proxy",
    environ: Mapping[str, str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    max_pending: int = mcp.MAX_PENDING_CALLS,
) -> int:
    """Run ``command`` (an MCP stdio server) as a child and relay this process's stdio to it, signing
    every tool result (:class:`StdioProxy`): the whole run is one client session. Returns the child's
    exit code. ``system``: default ``COUNTERSIGN_MCP_SYSTEM``, else ``mcp-tools``. ``environ``: where
    the runtime's settings are read (default ``os.environ``; the command line merges a file and flags
    into it). ``max_pending``: tool calls held open at once (a cancelled one frees its slot).

    Raises ConfigError before starting the child when the runtime cannot be configured, OSError when
    the child cannot be started, ValueError when a line exceeds :data:`countersign.integrations.mcp.MAX_LINE_BYTES`."""
    env = os.environ if environ is None else environ
    holder = kit.LazyRuntime(runtime, environ)
    holder.get()  # a configuration error stops the proxy before the child starts
    session = mcp.SessionSigner(holder, system or env.get(mcp.ENV_SYSTEM) or mcp.DEFAULT_SYSTEM, mcp.instance_id(name))
    proxy = StdioProxy(session, max_pending)
    reader, writer = await _stdio_streams(stdin or sys.stdin.buffer, stdout or sys.stdout.buffer)
    lock = asyncio.Lock()

    async def reply(line: bytes) -> None:
        async with lock:
            writer.write(line)
            await writer.drain()

    child = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=mcp.MAX_LINE_BYTES
    )
    assert child.stdin is not None
    assert child.stdout is not None
    upstream = asyncio.create_task(proxy.from_client(reader, child.stdin, reply))
    try:
        await proxy.from_child(child.stdout, reply)  # until the child closes its stdout (it exits)
    finally:
        upstream.cancel()
        await asyncio.gather(upstream, return_exceptions=True)
        if child.returncode is None:
            try:
                await asyncio.wait_for(child.wait(), 5)
            except TimeoutError:
                child.kill()
                await child.wait()
        await holder.close()
    return child.returncode if child.returncode is not None else 1
