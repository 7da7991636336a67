"""The auditor's commands: ``export`` and ``registry verify`` (docs/audit.md).

Both work offline on exported evidence (``countersign demo --export DIR``, or ``registry export``): the
rules live in the core (:mod:`countersign.export`); this module reads files and prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path as FilePath

from countersign.errors import MalformedError
from countersign.export import EXPORTER_FOR_FORMAT, ExportError, export_path
from countersign.export.registry_log import LogRefused
from countersign.plugins import described
from countersign_cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    MAX_OUTPUT_BYTES,
    Commands,
    UsageError,
    parse_time,
    read_bytes,
    read_log,
    read_path,
    write_document,
)


def register(commands: Commands) -> None:
    export = commands.add_parser("export", help="write a path as DSSE, an in-toto Statement or W3C PROV")
    export.add_argument(
        "--format",
        required=True,
        choices=tuple(EXPORTER_FOR_FORMAT),
        help=f"the document to write: {described(EXPORTER_FOR_FORMAT)}",
    )
    export.add_argument("--path", required=True, help="path.json")
    export.add_argument(
        "--output", help="the exact output bytes: checked against the leaf's signed hash (in-toto names them)"
    )
    export.add_argument(
        "--subject-name", help="in-toto: the subject's name (default: the --output file's name, else 'output')"
    )
    export.add_argument("--out", help="write the document here (default: standard output)")
    export.set_defaults(handler=cmd_export)


def register_registry_actions(actions: Commands) -> None:
    """``registry verify`` (main puts it beside ``registry export`` and ``custody``)."""
    verify = actions.add_parser(
        "verify", help="check an exported registry log against the operator key; print the registry as of --at"
    )
    verify.add_argument("--log", required=True, help="registry-log.json (registry export, demo --export)")
    verify.add_argument("--operator", required=True, help="operator.pub.json: the operator key you pin")
    verify.add_argument("--at", help="the registry as of this time: ms since the epoch or ISO 8601 with a zone")
    verify.set_defaults(handler=cmd_registry_verify)


def cmd_export(args: argparse.Namespace) -> int:
    path = read_path(args.path)
    output = None if args.output is None else read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
    name = args.subject_name or (FilePath(args.output).name if args.output else "output")
    try:
        data = export_path(path, args.format, output=output, subject_name=name)
    except (ExportError, MalformedError) as exc:
        raise UsageError(str(exc)) from None
    write_document(data, args.out)
    return EXIT_OK


def cmd_registry_verify(args: argparse.Namespace) -> int:
    at_ms = None if args.at is None else parse_time(args.at, "--at")
    try:
        audit = read_log(args.log, args.operator, at_ms)
    except LogRefused as exc:
        position = "file" if exc.position is None else f"statement {exc.position}"
        print(json.dumps({"verified": False, "code": exc.code.value, "at": position, "detail": str(exc)}))
        return EXIT_REJECTED
    print(json.dumps(audit.to_json(), indent=2))
    return EXIT_OK
