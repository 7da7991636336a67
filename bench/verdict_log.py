"""Verdict log size: the bytes each logged verdict adds to the store, per backend (issue 29).

Two workloads of depth-5 SIGNED-DAG verdicts with every edge cross-deployer, as a consumer logs them:
the same path again and again (``seen``: a retry, an audit, a second look), and a fresh receipt under
one depth-4 agent path (``fresh leaf``: a new output of the same agent each time). Bytes are what the
store holds after the verdicts minus what it held before, divided by their number: SQLite the file
(after a WAL checkpoint), PostgreSQL ``pg_total_relation_size`` of every table of its schema (rows,
indexes, TOAST), DynamoDB (emulator) the stored size of every item by AWS's rule (attribute names and
values plus 100 bytes an item). "Disk per million" is that times a million.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path as FilePath
from typing import Any

from countersign.state import CoSigner, RecordUse, VerdictEntry, VerifierStore

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
CLIENT = "spiffe://countersign.local/client/bench"
T0 = 1_780_000_000_000


def _hex(seed: str, n: int) -> str:
    import hashlib

    return hashlib.sha256(f"{seed}-{n}".encode()).hexdigest()


def depth5_path(leaf: int) -> tuple[RecordUse, ...]:
    """A depth-5 path's records as ``countersign.impact.path_dependencies`` gives them (digests, key
    ids of real length), deployers alternating so every edge is co-signed by both ends; the first four
    records are the same for every ``leaf``."""
    keys = {d: f"ed25519:{_hex(d, 0)[:32]}" for d in DEPLOYERS}
    records: list[RecordUse] = []
    for index in range(5):
        deployer = DEPLOYERS[index % 3]
        seed = f"record-{index}" if index < 4 else f"leaf-{leaf}"
        cosigners: tuple[CoSigner, ...] = ()
        if records:
            parent = records[-1]
            cosigners = (
                CoSigner("parent", parent.deployer, parent.key_id),
                CoSigner("child", deployer, keys[deployer]),
            )
        records.append(RecordUse(f"sha256:{_hex(seed, index)}", deployer, keys[deployer], T0 - 60_000, cosigners))
    return tuple(records)


def verdicts(count: int, *, fresh_leaf: bool, start: int = 0) -> Iterator[VerdictEntry]:
    for n in range(start, start + count):
        yield VerdictEntry(
            verdict_id=secrets.token_hex(16),
            time_ms=T0 + n,
            mode="accept",
            client=CLIENT,
            request_id=f"request-{n:012d}",
            registry_sequence=3,
            verdict="ACCEPT",
            reason="",
            construction="signed-dag",
            records=depth5_path(n if fresh_leaf else 0),
            retain_until_ms=T0 + 30 * 86_400_000,
        )


def record(store: VerifierStore, count: int, *, fresh_leaf: bool, start: int = 0, batch: int = 100) -> None:
    """Log ``count`` verdicts in group commits of ``batch`` (as the verifier's group commit does)."""
    pending: list[VerdictEntry] = []
    for entry in verdicts(count, fresh_leaf=fresh_leaf, start=start):
        pending.append(entry)
        if len(pending) == batch:
            store.record_verdicts(pending)
            pending = []
    if pending:
        store.record_verdicts(pending)


# --- what each backend holds ----------------------------------------------------------------------


def sqlite_bytes(path: FilePath) -> Callable[[VerifierStore], int]:
    def held(store: VerifierStore) -> int:
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # type: ignore[attr-defined]
        return sum(f.stat().st_size for f in path.parent.glob(path.name + "*"))

    return held


def postgres_bytes(base_url: str, schema: str) -> Callable[[VerifierStore], int]:
    import psycopg

    def held(store: VerifierStore) -> int:
        with psycopg.connect(base_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()
        return int(row[0]) if row else 0

    return held


def dynamodb_item_size(item: dict[str, Any]) -> int:
    """An item's stored size by AWS's rule: UTF-8 names and values (a number about one byte per two
    digits plus one), plus 100 bytes of overhead an item."""

    def size(value: dict[str, Any]) -> int:
        ((kind, body),) = value.items()
        if kind == "S":
            return len(body.encode())
        if kind == "N":
            digits = len(str(Decimal(body)).replace("-", "").replace(".", "").lstrip("0")) or 1
            return (digits + 1) // 2 + 1
        if kind == "B":
            return len(body)
        if kind in ("BOOL", "NULL"):
            return 1
        if kind == "L":
            return 3 + sum(size(v) + 1 for v in body)
        if kind == "M":
            return 3 + sum(len(k.encode()) + size(v) + 1 for k, v in body.items())
        raise ValueError(f"no size rule for {kind}")

    return 100 + sum(len(name.encode()) + size(value) for name, value in item.items())


def dynamodb_bytes() -> Callable[[VerifierStore], int]:
    def held(store: VerifierStore) -> int:
        client: Any = store._client  # type: ignore[attr-defined]
        request: dict[str, Any] = {"TableName": store.table, "ConsistentRead": True}  # type: ignore[attr-defined]
        total = 0
        while True:
            page = client.scan(**request)
            total += sum(dynamodb_item_size(item) for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return total
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    return held


def bytes_per_verdict(
    store: VerifierStore, held: Callable[[VerifierStore], int], count: int, *, fresh_leaf: bool
) -> float:
    """Bytes the store grows by per verdict, over ``count`` verdicts after a first ``count // 10``
    (which put the path, or the agent path, in the store)."""
    warm = max(1, count // 10)
    record(store, warm, fresh_leaf=fresh_leaf)
    before = held(store)
    record(store, count, fresh_leaf=fresh_leaf, start=warm)
    return (held(store) - before) / count


# --- the run ------------------------------------------------------------------------------------------


@contextmanager
def stores(work: FilePath) -> Iterator[dict[str, tuple[Callable[[], VerifierStore], Callable[[VerifierStore], int]]]]:
    """An opener and a size reader per backend (a fresh store per call of the opener)."""
    from bench.stores import POSTGRES, backends
    from verifier.stores import open_store

    with backends(work) as urls:
        made: dict[str, tuple[Callable[[], VerifierStore], Callable[[VerifierStore], int]]] = {}
        counter = iter(range(1_000))

        def sqlite() -> VerifierStore:
            path = work / f"log-{next(counter)}.db"
            store: Any = open_store(f"sqlite:///{path}")
            store._held = sqlite_bytes(path)
            return store  # type: ignore[no-any-return]

        made["sqlite"] = (sqlite, lambda s: s._held(s))  # type: ignore[attr-defined]
        base = urls["postgresql"].split("?")[0]
        schemas: list[str] = []

        def postgres() -> VerifierStore:
            schema = f"bench_log_{secrets.token_hex(4)}"
            schemas.append(schema)
            store: Any = open_store(f"{POSTGRES}?schema={schema}")
            store._held = postgres_bytes(base, schema)
            return store  # type: ignore[no-any-return]

        made["postgresql"] = (postgres, lambda s: s._held(s))  # type: ignore[attr-defined]
        if "dynamodb (emulator)" in urls:
            from verifier.stores.dynamodb import ensure_table

            endpoint = urls["dynamodb (emulator)"].split("endpoint_url=")[1]

            def dynamodb() -> VerifierStore:
                url = f"dynamodb://log-{secrets.token_hex(4)}?region=us-east-1&read_timeout=120&endpoint_url={endpoint}"
                ensure_table(url)
                return open_store(url)

            made["dynamodb (emulator)"] = (dynamodb, dynamodb_bytes())
        try:
            yield made
        finally:
            import psycopg

            with psycopg.connect(base, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def run(quick: bool = False) -> dict[str, Any]:
    count = 2_000 if quick else 20_000
    work = FilePath(tempfile.mkdtemp(prefix="countersign-verdict-log-"))
    results: dict[str, Any] = {"verdicts": count}
    try:
        with stores(work) as made:
            for name, (opener, held) in made.items():
                per = {}
                for workload, fresh in (("seen", False), ("fresh_leaf", True)):
                    n = count if name != "dynamodb (emulator)" else min(count, 2_000)
                    store = opener()
                    try:
                        per[workload] = bytes_per_verdict(store, held, n, fresh_leaf=fresh)
                        print(f"  {name} {workload}: {per[workload]:,.0f} bytes / verdict", file=sys.stderr, flush=True)
                    finally:
                        store.close()
                results[name] = per
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, Any]) -> str:
    lines = [
        "## Verdict log size (`python -m bench --only verdict_log`)",
        "",
        f"Depth-5 SIGNED-DAG verdicts, {results['verdicts']} per row (DynamoDB: at most 2,000), one client.",
        "",
        "| backend | seen path: bytes / verdict | per million verdicts | fresh leaf: bytes / verdict | per million |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, per in results.items():
        if not isinstance(per, dict):
            continue
        seen, fresh = per["seen"], per["fresh_leaf"]
        lines.append(
            f"| {name} | {seen:,.0f} | {seen * 1e6 / 2**30:.2f} GiB | {fresh:,.0f} | {fresh * 1e6 / 2**30:.2f} GiB |"
        )
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)


if __name__ == "__main__":  # pragma: no cover - a quick look without the bench runner
    print(report(run(quick=os.environ.get("QUICK") == "1")))
