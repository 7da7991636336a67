"""``countersign mcp-proxy -- COMMAND ARGS...``: run an existing MCP stdio server unchanged as a child
and sign each of its tool results through this deployer's signer (countersign.integrations.mcp)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from countersign.errors import ConfigError
from countersign_cli.common import Commands, UsageError


def register(commands: Commands) -> None:
    proxy = commands.add_parser(
        "mcp-proxy",
        help="run an MCP stdio server as a child and sign each tool result it returns",
        description="Relay this process's stdio to the MCP server started by COMMAND, signing every "
        "tools/call result as a per_tool_call receipt (evidence in the result's _meta). The client's "
        "tool calls form one session. Configured by COUNTERSIGN_SIGNER, COUNTERSIGN_DEPLOYER and "
        "COUNTERSIGN_CLIENT_{CA,CERT,KEY} (docs/quickstart-runtime.md).",
    )
    proxy.add_argument(
        "--system", help="agent system of the session's root record (default $COUNTERSIGN_MCP_SYSTEM, else mcp-tools)"
    )
    proxy.add_argument("--name", default="mcp-proxy", help="agent instance prefix of the session (default mcp-proxy)")
    proxy.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS", help="the MCP server to run")
    proxy.set_defaults(handler=cmd_mcp_proxy)


def cmd_mcp_proxy(args: argparse.Namespace) -> int:
    command = list(args.server)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("give the MCP server's command after --: countersign mcp-proxy -- COMMAND ARGS...")
    from countersign.integrations.mcp import run_stdio_proxy

    try:
        return asyncio.run(run_stdio_proxy(command, system=args.system, name=args.name))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    except ValueError as exc:  # the child wrote a line past the proxy's bound
        print(f"countersign mcp-proxy: {exc}", file=sys.stderr)
        return 1
