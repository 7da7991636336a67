"""An MCP client checking who emitted each tool result, and that none was dropped or changed.

Talks to ``examples/mcp_server.py`` over stdio twice as deployer-b's tool server: once signing in
process (``--sign``), once unchanged behind ``countersign mcp-proxy``. Each result's evidence is
verified offline against the mesh's registry, the session as a whole with ``check_session``, and a
dropped and a tampered result are shown rejected.

    python examples/mcp_client.py   # on the mesh COUNTERSIGN_MESH names, else a private local one

Needs ``pip install 'countersign-mesh[mcp]'``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from example_mesh import MeshSettings, the_mesh
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import CallToolResult

from countersign.client import Consumer
from countersign.integrations.mcp import EVIDENCE_KEY, check_session, verify_result
from countersign.registry import Registry

SERVER = str(Path(__file__).with_name("mcp_server.py"))


async def call_tools(params: StdioServerParameters) -> list[CallToolResult]:
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return [
            await session.call_tool("forecast", {"city": "Brest"}),
            await session.call_tool("tide", {"port": "Brest", "day": 3}),
            await session.call_tool("forecast", {"city": "Cork"}),
        ]


def check(label: str, results: list[CallToolResult], registry: Registry) -> bool:
    consumer = Consumer.offline(registry)  # in this process, against the registry file
    ok = True
    for result in results:
        verdict = verify_result(result, consumer, audit=True)  # audit: the session check below consumes them
        emitter = verdict.emitter
        who = f"emitted by {emitter.deployer} seq {emitter.seq}" if emitter else f"{verdict.reason}"
        print(f"{label}: {verdict.result.verdict} {who}")
        ok = ok and bool(verdict)
    session = check_session(results, consumer)
    print(f"{label} session: {session.result.verdict}")
    return ok and bool(session)


def main(mesh: MeshSettings) -> int:
    env = {**os.environ, **mesh.env("deployer-b")}  # the tool server's deployer
    registry = mesh.registry()
    signed = StdioServerParameters(command=sys.executable, args=[SERVER, "--sign"], env=env)
    proxy = ["-m", "countersign_cli", "mcp-proxy", "--", sys.executable, SERVER]
    proxied = StdioServerParameters(command=sys.executable, args=proxy, env=env)
    ok = check("middleware", asyncio.run(call_tools(signed)), registry)
    results = asyncio.run(call_tools(proxied))
    ok = check("mcp-proxy", results, registry) and ok
    evidence = json.dumps((results[0].meta or {})[EVIDENCE_KEY], separators=(",", ":")).encode()
    print(f"evidence: {len(evidence)} bytes per result (the path: the session's root record and the receipt)")
    print("dropped result:", check_session([results[0], results[2]], Consumer.offline(registry)).reason)
    first = results[0]
    forged = first.model_copy(update={"content": [first.content[0].model_copy(update={"text": "Brest: snow"})]})
    print("tampered result:", verify_result(forged, Consumer.offline(registry)).reason)
    return 0 if ok else 1


if __name__ == "__main__":
    with the_mesh() as mesh:
        code = main(mesh)
    sys.exit(code)
