"""``countersign mcp-proxy -- COMMAND ARGS...``: run an existing MCP stdio server unchanged as a child
and sign each of its tool results through this deployer's signer (countersign.integrations.mcp).

An MCP client starts the proxy with an environment of its own choosing (the ``mcp`` SDK's
``stdio_client`` passes almost none by default), so the settings can come from a TOML file
(``--config``) or flags as well as from the ``COUNTERSIGN_*`` environment: flags win over the file,
the file over the environment."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

from countersign.errors import ConfigError
from countersign_cli.common import Commands, UsageError

# Each setting: its flag (dest), its key in the --config file, and the environment variable the
# runtime SDK reads it from (countersign.client.runtime).
SETTINGS = (
    ("signer", "signer", "COUNTERSIGN_SIGNER", "host:port of this deployer's signer"),
    ("deployer", "deployer", "COUNTERSIGN_DEPLOYER", "this deployer's id"),
    ("public_signer", "public_signer", "COUNTERSIGN_PUBLIC_SIGNER", "host:port other deployers reach the signer at"),
    ("ca", "ca", "COUNTERSIGN_CLIENT_CA", "CA certificate (mTLS)"),
    ("cert", "cert", "COUNTERSIGN_CLIENT_CERT", "this runtime's certificate (mTLS)"),
    ("tls_key", "key", "COUNTERSIGN_CLIENT_KEY", "its private key (mTLS)"),
    ("system", "system", "COUNTERSIGN_MCP_SYSTEM", "agent system of the session's root record (default mcp-tools)"),
)
LOOPBACK_ENV = "COUNTERSIGN_CLIENT_INSECURE_LOOPBACK"
MAX_CONFIG_BYTES = 64 << 10


def register(commands: Commands) -> None:
    proxy = commands.add_parser(
        "mcp-proxy",
        help="run an MCP stdio server as a child and sign each tool result it returns",
        description="Relay this process's stdio to the MCP server started by COMMAND, signing every "
        "tools/call result as a per_tool_call receipt (evidence in the result's _meta; evidence the server "
        "already put there is kept beside it). The client's tool calls form one session. Settings come from "
        "the flags, then --config FILE (TOML: signer, deployer, public_signer, ca, cert, key, system, "
        "insecure_loopback, max_pending), then COUNTERSIGN_SIGNER, COUNTERSIGN_DEPLOYER, "
        "COUNTERSIGN_CLIENT_{CA,CERT,KEY} (docs/quickstart-runtime.md).",
    )
    proxy.add_argument("--config", help="a TOML file of settings (an MCP client passes no environment of ours)")
    for dest, _, env, words in SETTINGS:
        flag = "--" + dest.replace("_", "-")
        proxy.add_argument(flag, dest=dest, help=f"{words} (default ${env})")
    proxy.add_argument("--insecure-loopback", action="store_true", default=None, help="plaintext, loopback only")
    proxy.add_argument("--name", default="mcp-proxy", help="agent instance prefix of the session (default mcp-proxy)")
    proxy.add_argument(
        "--max-pending",
        type=int,
        default=None,
        help="tool calls held open at once (default 1024; a cancelled one frees its slot)",
    )
    proxy.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND ARGS", help="the MCP server to run")
    proxy.set_defaults(handler=cmd_mcp_proxy)


def read_config(location: str) -> dict[str, Any]:
    """The --config file: a TOML table of known keys. Raises UsageError naming what is wrong."""
    known = {key for _, key, _, _ in SETTINGS} | {"insecure_loopback", "max_pending"}
    try:
        with open(location, "rb") as handle:
            body = tomllib.loads(handle.read(MAX_CONFIG_BYTES + 1).decode("utf-8"))
    except OSError as exc:
        raise UsageError(f"--config {location}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {location} is not TOML: {exc}") from None
    unknown = sorted(set(body) - known)
    if unknown:
        raise UsageError(
            f"--config {location}: unknown settings {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    for key, value in body.items():
        wanted = bool if key == "insecure_loopback" else int if key == "max_pending" else str
        if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
            raise UsageError(f"--config {location}: {key} must be a {wanted.__name__}")
    return body


def proxy_environment(args: argparse.Namespace, environ: dict[str, str]) -> tuple[dict[str, str], int]:
    """The runtime's settings as environment variables (flags over the file over ``environ``), and
    the bound on open calls. Relative paths in the file are read from the file's directory."""
    merged = dict(environ)
    config = read_config(args.config) if args.config else {}
    base = Path(args.config).parent if args.config else Path.cwd()
    for dest, key, env, _ in SETTINGS:
        if key in config:
            value = str(config[key])
            merged[env] = str(base / value) if key in ("ca", "cert", "key") and not Path(value).is_absolute() else value
        if getattr(args, dest) is not None:
            merged[env] = str(getattr(args, dest))
    loopback = args.insecure_loopback if args.insecure_loopback is not None else config.get("insecure_loopback")
    if loopback is not None:
        merged[LOOPBACK_ENV] = "1" if loopback else ""
    max_pending = args.max_pending if args.max_pending is not None else int(config.get("max_pending", 1024))
    if not 1 <= max_pending <= 65_536:
        raise UsageError("--max-pending must be between 1 and 65536")
    return merged, max_pending


def cmd_mcp_proxy(args: argparse.Namespace) -> int:
    command = list(args.server)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("give the MCP server's command after --: countersign mcp-proxy -- COMMAND ARGS...")
    from countersign_cli.mcp_relay import run_stdio_proxy  # the SDK's client side: only when it runs

    environ, max_pending = proxy_environment(args, dict(os.environ))
    try:
        return asyncio.run(run_stdio_proxy(command, name=args.name, environ=environ, max_pending=max_pending))
    except ConfigError as exc:
        raise UsageError(f"{exc} (give it in --config FILE, a flag, or the environment)") from None
    except OSError as exc:
        raise UsageError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    except ValueError as exc:  # the child wrote a line past the proxy's bound
        print(f"countersign mcp-proxy: {exc}", file=sys.stderr)
        return 1
