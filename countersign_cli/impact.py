"""``countersign impact``: which logged verdicts, and which records below them, relied on a key, a
record or a deployer, read from a verifier's store (the verdict log; docs/operations.md)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from countersign.errors import MalformedError, VerificationError
from countersign.impact import ImpactReport, collect_impact, impact_query
from countersign.state import DependencyKind
from countersign_cli.main import EXIT_OK, UsageError


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    impact = commands.add_parser(
        "impact",
        help="list the logged verdicts and records that relied on a key, record or deployer",
        description="Read a verifier's verdict log and list every accepted verdict, and every record "
        "below, that relied on what the query names: each NEEDS_REVALIDATION. Nothing is deleted.",
    )
    what = impact.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", metavar="KEY_ID", help="records this key signed or co-signed")
    what.add_argument("--record", metavar="DIGEST", help="this record (sha256:...)")
    what.add_argument("--deployer", metavar="NAME", help="records this deployer issued or co-signed")
    impact.add_argument("--since", metavar="T", help="only verdicts from T on: ms since the epoch, or ISO 8601")
    impact.add_argument(
        "--state",
        required=True,
        help="the verifier's store URL: sqlite:///verifier.db (relative to here) or sqlite:////abs/verifier.db",
    )
    impact.add_argument("--json", action="store_true", help="print the report as JSON")
    impact.add_argument("--mark", action="store_true", help="also flag the verdicts in the log")
    impact.set_defaults(handler=cmd_impact)


def parse_since(text: str | None) -> int:
    """Milliseconds since the epoch from ``--since``. Raises UsageError."""
    if text is None:
        return 0
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since must be ms since the epoch or an ISO 8601 time, got {text!r}") from None
    if moment.tzinfo is None:
        raise UsageError(f"--since {text!r} needs a time zone (say Z for UTC)")
    return int(moment.timestamp() * 1000)


def cmd_impact(args: argparse.Namespace) -> int:
    from verifier.stores import StoreConfigError, open_store

    if args.key is not None:
        kind, value = DependencyKind.KEY, args.key
    elif args.record is not None:
        kind, value = DependencyKind.RECORD, args.record
    else:
        kind, value = DependencyKind.DEPLOYER, args.deployer
    try:
        query = impact_query(kind, value, parse_since(args.since))
    except MalformedError as exc:
        raise UsageError(str(exc)) from None
    try:
        store = open_store(args.state)
    except StoreConfigError as exc:
        raise UsageError(str(exc)) from None
    except VerificationError as exc:
        raise UsageError(f"state store unavailable: {exc}") from None
    try:
        report = collect_impact(store, query)
        if args.mark:
            cause = f"impact query {kind.value} {value} (command line)"
            store.mark_needs_revalidation([v.entry for v in report.verdicts], cause, _now_ms())
            report = collect_impact(store, query)
    except VerificationError as exc:
        raise UsageError(f"state store unavailable (retry): {exc}") from None
    finally:
        store.close()
    print(json.dumps(report.to_json(), indent=2) if args.json else describe(report))
    return EXIT_OK


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


def _time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe(report: ImpactReport) -> str:
    query = report.query
    since = f" since {_time(query.since_ms)}" if query.since_ms else ""
    lines = [
        f"impact of {query.kind.value} {query.value}{since}: {len(report.records)} record(s) and "
        f"{len(report.verdicts)} verdict(s) NEEDS_REVALIDATION"
    ]
    if report.truncated:
        lines.append("(incomplete: the log held more than one lookup returns; narrow it with --since)")
    if report.records:
        lines.append("records:")
    for record in report.records:
        below = f"  below {', '.join(record.depends_on)}" if record.depends_on else ""
        lines.append(
            f"  {record.digest}  {record.deployer} {record.key_id}{'  (matches)' if record.seed else ''}{below}"
        )
    if report.verdicts:
        lines.append("verdicts:")
    for verdict in report.verdicts:
        entry = verdict.entry
        flagged = f"  flagged: {entry.revalidation_cause}" if entry.needs_revalidation else ""
        request = f" request {entry.request_id}" if entry.request_id else ""
        lines.append(
            f"  {entry.verdict_id}  {_time(entry.time_ms)}  {entry.mode} {entry.verdict}{request}"
            f"  {entry.client or 'plaintext'}  records {', '.join(verdict.records)}{flagged}"
        )
    return "\n".join(lines)
