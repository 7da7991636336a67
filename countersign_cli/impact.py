"""``countersign impact``: which logged verdicts, and which records below them, relied on a key, a
record or a deployer, read from a verifier's store (the verdict log; docs/operations.md) or asked of
a running verifier (its ``Impact`` RPC, over mTLS): the same report either way."""

from __future__ import annotations

import argparse
import json
from typing import Any

from countersign._clock import now_ms
from countersign.errors import MalformedError, VerificationError
from countersign.impact import ImpactQuery, collect_impact, impact_query, report_json
from countersign.plugins import described
from countersign.state import DependencyKind
from countersign_cli.common import EXIT_OK, Commands, UsageError, client_tls, iso, parse_time, verifier_refused
from verifier.stores import STORE_FOR_SCHEME, StoreConfigError, open_store


def register(commands: Commands) -> None:
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
    where = impact.add_mutually_exclusive_group(required=True)
    where.add_argument("--state", help=f"the verifier's store URL (its store_url): {described(STORE_FOR_SCHEME)}")
    where.add_argument("--verifier", help="host:port of a running verifier: ask its Impact RPC instead (mTLS)")
    impact.add_argument("--ca", default="", help="with --verifier: CA certificate (mTLS)")
    impact.add_argument("--cert", default="", help="with --verifier: operator or client certificate (mTLS)")
    impact.add_argument("--tls-key", default="", help="with --verifier: its private key (mTLS)")
    impact.add_argument("--insecure-loopback", action="store_true", help="with --verifier: plaintext, loopback only")
    impact.add_argument("--json", action="store_true", help="print the report as JSON")
    impact.add_argument("--mark", action="store_true", help="also flag the verdicts in the log")
    impact.set_defaults(handler=cmd_impact)


def parse_since(text: str | None) -> int:
    """Milliseconds since the epoch from ``--since`` (0 when not given). Raises UsageError."""
    return 0 if text is None else parse_time(text, "--since")


def cmd_impact(args: argparse.Namespace) -> int:
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
    report = ask_verifier(args, query) if args.verifier else read_store(args, query)
    print(json.dumps(report, indent=2) if args.json else report_text(report))
    return EXIT_OK


def read_store(args: argparse.Namespace, query: ImpactQuery) -> dict[str, Any]:
    """The report from the verifier's store (``--mark`` flags there), as JSON."""
    try:
        refuse_a_missing_store(args.state)
        store = open_store(args.state)
    except StoreConfigError as exc:
        raise UsageError(str(exc)) from None
    except VerificationError as exc:
        raise UsageError(f"state store unavailable: {exc}") from None
    try:
        report = collect_impact(store, query)
        if args.mark:
            cause = f"impact query {query.kind.value} {query.value} (command line)"
            store.mark_needs_revalidation([v.entry for v in report.verdicts], cause, now_ms())
            report = collect_impact(store, query)
    except VerificationError as exc:
        raise UsageError(f"state store unavailable (retry): {exc}") from None
    finally:
        store.close()
    return report.to_json()


def refuse_a_missing_store(url: str) -> None:
    """A read command reads a store that is there: opening a new one would create it empty and report
    that nothing is affected (issue 29). ``memory:`` holds no log outside one process; a SQLite file
    must exist and hold a verifier's schema; a PostgreSQL schema must hold one (an unreachable server
    is left to :func:`open_store` to report). Raises UsageError."""
    from urllib.parse import urlsplit

    scheme = urlsplit(url).scheme
    if scheme == "memory":
        raise UsageError("--state memory: is empty in every new process: name the verifier's store (its store_url)")
    if scheme == "sqlite":
        _refuse_a_missing_sqlite_store(url)
    elif scheme in ("postgresql", "postgres"):
        _refuse_a_missing_postgres_schema(url)


def _refuse_a_missing_sqlite_store(url: str) -> None:
    import sqlite3
    from pathlib import Path

    from countersign._daemon.sqlite import sqlite_file
    from countersign.errors import ConfigError

    try:
        location = sqlite_file(url)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if location is None:
        return  # not a file URL: open_store says what is wrong with it
    if not Path(location).is_file():
        raise UsageError(f"no verifier store at {location} ({url}): impact reads a store and creates none")
    try:
        db = sqlite3.connect(f"{Path(location).as_uri()}?mode=ro", uri=True)
        try:
            (version,) = db.execute("PRAGMA user_version").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise UsageError(f"{location} is not a verifier store: {exc}") from None
    if version == 0:
        raise UsageError(f"{location} is not a verifier store (no verdict log in it)")


def _refuse_a_missing_postgres_schema(url: str) -> None:
    import psycopg

    from verifier.stores.postgres import parse_url

    conninfo, schema, _ = parse_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".countersign_schema_version',))
            (exists,) = row.fetchone() or (False,)
    except psycopg.Error:
        return  # unreachable or refused: open_store reports it in its own words
    if not exists:
        raise UsageError(
            f"no verifier store in PostgreSQL schema {schema} ({url}): impact reads a store and creates none"
        )


def ask_verifier(args: argparse.Namespace, query: ImpactQuery) -> dict[str, Any]:
    """The verifier's Impact answer (``--mark`` flags there), as the report JSON ``--state`` prints."""
    from countersign.client import ServiceError, VerifierClient

    client = VerifierClient(args.verifier, client_tls(args, args.verifier), lanes=0)
    try:
        answer = client.impact(
            key_id=query.value if query.kind is DependencyKind.KEY else None,
            record_digest=query.value if query.kind is DependencyKind.RECORD else None,
            deployer=query.value if query.kind is DependencyKind.DEPLOYER else None,
            since_ms=query.since_ms,
            mark=args.mark,
        )
    except ServiceError as exc:
        raise verifier_refused(args, exc) from None
    finally:
        client.close()
    return report_json(query, answer.records, answer.verdicts, answer.truncated)


def report_text(report: dict[str, Any]) -> str:
    """The report (its JSON, from the store or from a verifier) for people."""
    query, records, verdicts = report["query"], report["records"], report["verdicts"]
    since = f" since {iso(query['since_ms'])}" if query["since_ms"] else ""
    lines = [
        f"impact of {query['kind']} {query['value']}{since}: {len(records)} record(s) and "
        f"{len(verdicts)} verdict(s) NEEDS_REVALIDATION"
    ]
    if report["truncated"]:
        lines.append("(incomplete: the log held more than one lookup returns; narrow it with --since)")
    if records:
        lines.append("records:")
    for record in records:
        below = f"  below {', '.join(record['depends_on'])}" if record["depends_on"] else ""
        matches = "  (matches)" if record["seed"] else ""
        lines.append(f"  {record['digest']}  {record['deployer']} {record['key_id']}{matches}{below}")
    if verdicts:
        lines.append("verdicts:")
    for verdict in verdicts:
        flagged = f"  flagged: {verdict['cause']}" if verdict["marked_in_log"] else ""
        request = f" request {verdict['request_id']}" if verdict["request_id"] else ""
        lines.append(
            f"  {verdict['verdict_id']}  {iso(verdict['time_ms'])}  {verdict['mode']} {verdict['result']}{request}"
            f"  {verdict['client'] or 'plaintext'}  records {', '.join(verdict['records'])}{flagged}"
        )
    return "\n".join(lines)
