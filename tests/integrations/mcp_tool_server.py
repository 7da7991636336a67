"""A tiny MCP server that knows nothing of Countersign: the server ``countersign mcp-proxy`` wraps in
the tests (stdio). ``--signed`` adds the signing middleware in process (configured by the runtime
SDK's environment variables); ``--http PORT`` serves Streamable HTTP on 127.0.0.1:PORT instead."""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("tiny-tools")
RAN: list[str] = []  # the tools that ran in this process, so a test can see a refused call ran nothing


@server.tool()
def ran() -> list[str]:
    """The tools that ran before this call."""
    return list(RAN)


@server.tool()
def echo(text: str) -> str:
    """Say ``text`` back."""
    RAN.append("echo")
    return text


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers (a structured result)."""
    RAN.append("add")
    return {"sum": a + b}


@server.tool()
async def hang() -> str:
    """Never answers: a call the client gives up on (and cancels)."""
    await asyncio.Event().wait()
    return "never"


@server.tool()
def fail(why: str) -> str:
    """Fail as a tool does: an isError result, which is signed like any other."""
    RAN.append("fail")
    raise ToolError(why)


if __name__ == "__main__":
    if "--signed" in sys.argv:
        from countersign.integrations.mcp import sign_server

        sign_server(server, system="tiny-tools", name="tiny")
    if "--http" in sys.argv:
        server.run("streamable-http", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run("stdio")
