"""The ``countersign`` command line.

Exit codes: 0 success (for ``verify``: accepted), 1 rejected or a failed check, 2 usage error or
unreadable input. Errors are one clear line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from countersign.errors import CountersignError

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2


class UsageError(CountersignError):
    """Bad arguments or unreadable input: exit 2 with this message."""


Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    from countersign_cli import demo, impact, offline, services

    parser = argparse.ArgumentParser(
        prog="countersign",
        description="Evidence for multi-agent delegation: output attestation and co-signed lineage.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    offline.register(commands)
    demo.register(commands)
    services.register(commands)
    impact.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Command = args.handler
    try:
        return handler(args)
    except UsageError as exc:
        print(f"countersign {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
