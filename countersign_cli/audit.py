"""The auditor's commands: ``export``, ``registry verify``, and the registry and time options that
``verify``, ``inspect --verify`` and ``report`` share (docs/audit.md).

Everything here works offline on exported evidence (``countersign demo --export DIR``, or ``registry
export``): the rules live in the core (:mod:`countersign.export`); this module reads files, picks the
registry and the time, and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path as FilePath
from typing import Final

from countersign.admission import AdmissionError
from countersign.errors import MalformedError
from countersign.export.registry_log import MAX_LOG_BYTES, LogAudit, LogRefused, audit_log, operator_key, parse_log
from countersign.keys import PublicKey
from countersign.records import MAX_INPUT_BYTES, Path
from countersign.registry import Registry
from countersign_cli.main import EXIT_OK, EXIT_REJECTED, UsageError
from countersign_cli.offline import MAX_OUTPUT_BYTES, iso, load_registry, now_ms, read_bytes, render_tree

EXPORT_FORMATS: Final = ("dsse", "in-toto", "prov-json", "prov-n", "prov-o")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from countersign_cli import report

    export = commands.add_parser("export", help="write a path as DSSE, an in-toto Statement or W3C PROV")
    export.add_argument(
        "--format", required=True, choices=EXPORT_FORMATS, help="the document to write (docs/spec.md section 15)"
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
    report.register(commands)


def register_registry_actions(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``registry verify`` beside ``registry export`` (services.py owns the ``registry`` group)."""
    verify = actions.add_parser(
        "verify", help="check an exported registry log against the operator key; print the registry as of --at"
    )
    verify.add_argument("--log", required=True, help="registry-log.json (registry export, demo --export)")
    verify.add_argument("--operator", required=True, help="operator.pub.json: the operator key you pin")
    verify.add_argument("--at", help="the registry as of this time: ms since the epoch or ISO 8601 with a zone")
    verify.set_defaults(handler=cmd_registry_verify)


def add_time_and_log_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``verify`` gains for audits: a registry log instead of a registry file, and evidence time."""
    parser.add_argument("--registry-log", help="registry-log.json instead of --registry: checked against --operator")
    parser.add_argument("--operator", help="with --registry-log: operator.pub.json, the operator key you pin")
    parser.add_argument(
        "--at-evidence-time",
        action="store_true",
        help="verify as of the leaf's creation time (keys valid then, every revocation applied); implies --audit",
    )


def add_registry_arguments(parser: argparse.ArgumentParser) -> None:
    """``--registry R`` or ``--registry-log L --operator K``, and the time to verify at."""
    parser.add_argument("--registry", help="registry.json")
    add_time_and_log_arguments(parser)
    parser.add_argument("--now-ms", type=int, help="verify as of this time (ms since the epoch; default now)")


def refuse_verify_options(args: argparse.Namespace) -> None:
    """Plain ``inspect`` checks nothing, so an option that only a check uses is a mistake, not a no-op."""
    given = [name for name in ("output", "registry", "registry_log", "operator", "now_ms") if getattr(args, name)]
    if given or args.at_evidence_time:
        names = ", ".join("--" + n.replace("_", "-") for n in given) or "--at-evidence-time"
        raise UsageError(f"{names} only make sense with --verify")


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--verify", action="store_true", help="check each signature against the registry, then print the verdict"
    )
    parser.add_argument("--output", help="with --verify: the exact output bytes, so the verdict covers them")
    add_registry_arguments(parser)


# --- shared loaders -----------------------------------------------------------------------------


def load_operator(location: str) -> PublicKey:
    try:
        return operator_key(read_bytes(location, "operator key", MAX_INPUT_BYTES))
    except MalformedError as exc:
        raise UsageError(f"{location} is not an operator public key: {exc}") from None


def load_log(log_location: str, operator_location: str, at_ms: int | None = None) -> LogAudit:
    """Read and verify a registry log. Raises LogRefused (the log does not verify) or UsageError."""
    operator = load_operator(operator_location)
    return audit_log(parse_log(read_bytes(log_location, "registry log", MAX_LOG_BYTES)), operator, at_ms)


def registry_from_args(args: argparse.Namespace) -> Registry:
    registry = optional_registry(args)
    if registry is None:
        raise UsageError("--registry (or --registry-log with --operator) is required")
    return registry


def optional_registry(args: argparse.Namespace) -> Registry | None:
    """The registry the command checks against: ``--registry``, or the verified ``--registry-log``."""
    if args.registry and args.registry_log:
        raise UsageError("give --registry or --registry-log, not both")
    if args.registry_log:
        if not args.operator:
            raise UsageError("--registry-log needs --operator (the operator public key you pin)")
        try:
            return load_log(args.registry_log, args.operator).registry
        except AdmissionError as exc:
            raise UsageError(f"{args.registry_log} does not verify: {exc.code}: {exc}") from None
    if args.operator:
        raise UsageError("--operator goes with --registry-log")
    if args.registry:
        return load_registry(args.registry)
    return None


def verification_time(args: argparse.Namespace, path: Path) -> int:
    """``--at-evidence-time``: when the evidence was made, the leaf record's ``created_ms`` (the output
    receipt's time); else ``--now-ms``; else the clock."""
    if args.at_evidence_time:
        if args.now_ms is not None:
            raise UsageError("give --now-ms or --at-evidence-time, not both")
        return path.leaf.record.created_ms
    return now_ms() if args.now_ms is None else args.now_ms


def parse_time(text: str) -> int:
    """Milliseconds since the epoch from an integer or an ISO 8601 time with a zone. Raises UsageError."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"not a time: {text!r} (ms since the epoch, or ISO 8601 such as 2026-01-01T00:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"{text!r} has no time zone; add one (Z for UTC)")
    ms = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if ms < 0:
        raise UsageError(f"{text!r} lies before 1970")
    return ms


def write_document(data: bytes, out: str | None) -> None:
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        FilePath(out).write_bytes(data)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror}") from None


def load_path(location: str) -> Path:
    try:
        return Path.from_bytes(read_bytes(location, "path", MAX_INPUT_BYTES))
    except MalformedError as exc:
        raise UsageError(f"{location} is not a valid path: {exc}") from None


# --- commands -----------------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    from countersign.export import ExportError, export_path

    path = load_path(args.path)
    output = None if args.output is None else read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
    name = args.subject_name or (FilePath(args.output).name if args.output else "output")
    try:
        data = export_path(path, args.format, output=output, subject_name=name)
    except (ExportError, MalformedError) as exc:
        raise UsageError(str(exc)) from None
    write_document(data, args.out)
    return EXIT_OK


def cmd_registry_verify(args: argparse.Namespace) -> int:
    at_ms = None if args.at is None else parse_time(args.at)
    try:
        audit = load_log(args.log, args.operator, at_ms)
    except LogRefused as exc:
        position = "file" if exc.position is None else f"statement {exc.position}"
        print(json.dumps({"verified": False, "code": exc.code.value, "at": position, "detail": str(exc)}))
        return EXIT_REJECTED
    print(json.dumps(audit.to_json(), indent=2))
    return EXIT_OK


def inspect_verified(args: argparse.Namespace, path: Path) -> int:
    """The tree, one mark per signature, then the verdict (audit mode: nothing is consumed)."""
    from countersign.export.marks import SignatureRole, signature_marks
    from countersign.state import InMemoryState
    from countersign.verify import Mode, verify_path, verify_structure

    registry = registry_from_args(args)
    at = verification_time(args, path)
    print(render_tree(path))
    print("\nsignatures, each checked on its own against the registry (keys resolved at the record's creation):")
    for mark in signature_marks(path, registry):
        what = "signature" if mark.role is SignatureRole.PRIMARY else f"{mark.role} co-signature"
        status = "verified" if mark.verified else "NOT verified"
        line = f"  [{mark.index}] {status:<12} {what} by {mark.deployer} ({mark.key_id})"
        print(line if mark.verified else f"{line}: {mark.problem}: {mark.detail}")
    if args.output:
        output = read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
        result = verify_path(path, output, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=at)
        scope = "the path for the output"
    else:
        result = verify_structure(path, registry=registry, now_ms=at)
        scope = "the path (output not checked: give --output)"
    verdict = "ACCEPT" if result else f"REJECT {result.reason} at record {result.index}: {result.detail}"
    print(f"\nverdict on {scope}, as of {iso(at)}, audit mode: {verdict}")
    return EXIT_OK if result else EXIT_REJECTED
