"""A small MCP tool server (the official ``mcp`` SDK), signing every tool result where it is emitted.

    python examples/mcp_server.py --sign     # the middleware in process: needs COUNTERSIGN_SIGNER,
                                             # COUNTERSIGN_DEPLOYER and COUNTERSIGN_CLIENT_{CA,CERT,KEY}
    countersign mcp-proxy -- python examples/mcp_server.py
                                             # the same server unchanged, signed by the proxy

Both speak MCP over stdio; ``examples/mcp_client.py`` runs both against a local mesh. Needs
``pip install 'countersign-mesh[mcp]'``.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

from countersign.integrations.mcp import SigningMiddleware

server = MCPServer("weather")


@server.tool()
def forecast(city: str) -> str:
    """Tomorrow's weather for ``city`` (deterministic: a stand-in for a real service)."""
    return f"{city}: sunny, {len(city) + 14} °C"


@server.tool()
def tide(port: str, day: int) -> dict[str, str | int]:
    """High tide at ``port`` on ``day`` (a structured result)."""
    return {"port": port, "day": day, "high": f"{6 + day % 6:02d}:15"}


if __name__ == "__main__":
    if "--sign" in sys.argv:
        server.middleware.append(SigningMiddleware(system="weather-tools", name="weather"))
    server.run("stdio")
