"""The ``countersign`` command line.

Exit codes: 0 success (for ``verify``: accepted), 1 rejected or a failed check, 2 usage error or
unreadable input, 141 the reader of standard output went away (``| head``), as for a tool that
SIGPIPE ends. Errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from countersign.extras import DISTRIBUTION
from countersign_cli import audit, demo, impact, mcp_proxy, offline, report, services
from countersign_cli.common import EXIT_BROKEN_PIPE, EXIT_USAGE, Command, UsageError, missing_extra


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The whole tree of commands; each command module adds its own."""
    parser = argparse.ArgumentParser(
        prog="countersign",
        description="Evidence for multi-agent delegation: output attestation and co-signed lineage.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    offline.register(commands)
    demo.register(commands)
    services.register(commands)
    registry = commands.add_parser("registry", help="the admission registry")
    registry_actions = registry.add_subparsers(dest="action", required=True, metavar="ACTION")
    services.register_registry_actions(registry_actions)  # export, custody: ask a coordinator
    audit.register_registry_actions(registry_actions)  # verify: an exported log, offline
    audit.register(commands)
    report.register(commands)
    impact.register(commands)
    mcp_proxy.register(commands)
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's own --help opens with the line its parent lists it with, unless it says more."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not sub.description:
                    sub.description = listed.get(name)
                _describe(sub)


def main(argv: Sequence[str] | None = None) -> int:
    # Libraries (psycopg's pool, botocore) log their retries; with no handler configured, Python prints
    # them to stderr beside our one-line error. Commands report failures themselves; a daemon's
    # ``serve`` installs its own JSON log handlers.
    logging.getLogger().addHandler(logging.NullHandler())
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "action", None) != "serve":
        # gRPC's C core logs to stderr on its own (a failed TLS handshake: "I... Handshake failed ..."),
        # beside the one line in which a command reports that failure itself. Read when gRPC is first
        # imported, which no command has done yet; a daemon keeps gRPC's default.
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    handler: Command = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()  # here, so that a reader that went away is noticed here
        return code
    except BrokenPipeError:
        # The reader of stdout closed it (`countersign verify ... | head -c 10`): what it wanted it has.
        # Point stdout at /dev/null so that the interpreter's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except UsageError as exc:
        print(f"countersign {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        needs = missing_extra(exc, args.command)
        if needs is None:
            raise  # not an optional package: a bug, not a missing extra
        print(f"countersign {args.command}: needs {needs}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
