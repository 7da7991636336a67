"""A store written before the verdict log existed opens, gains the log's tables, and keeps what it
remembered: SQLite from version 3, PostgreSQL from version 2, and a DynamoDB table holding items of
the previous release (the log adds item kinds to the same table, so there is nothing to migrate).

And a store holding the verdict log as it was before issue 29 (one row, or one DynamoDB item, per
signature per verdict) moves its verdicts, marks included, to the log that stores each path once."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import cast

import psycopg
import pytest
from psycopg import sql

from countersign.impact import ImpactQuery, collect_impact
from countersign.reasons import Reason
from countersign.state import ChildEdge, DependencyKind, LeafNonce, RecordUse, StateRejection, VerdictEntry
from tests.stores.conftest import PostgresSchemas, dynamodb_url
from verifier.stores import open_store
from verifier.stores import postgres as pg_store
from verifier.stores import sqlite as sqlite_store

NOW = 1_780_000_000_000
KEY = "ed25519:" + "1" * 32


def logged(n: int) -> VerdictEntry:
    record = RecordUse("sha256:" + f"{n:064x}", "deployer-a", KEY, NOW - 10)
    return VerdictEntry(
        f"v-{n}", NOW + n, "accept", "spiffe://countersign.local/client/c", "", 3, "ACCEPT", "", "signed-dag",
        (record,), NOW + 60_000,
    )  # fmt: skip


@pytest.mark.offline
def test_sqlite_version_3_gains_the_verdict_log_and_keeps_its_state(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path)
    for step in (1, 2, 3):
        for statement in sqlite_store._MIGRATIONS[step]:
            db.execute(statement)
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO consumed_nonces (nonce, retain_until_ms) VALUES ('d:old', ?)", (NOW + 60_000,))
    db.execute("INSERT INTO children (parent, child, retain_until_ms) VALUES ('p', 'c1', ?)", (NOW + 60_000,))
    db.commit()
    db.close()
    state = sqlite_store.SqliteState(path)
    try:
        tables = {
            row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        assert {"verdict_log", "verdict_paths", "verdict_path_uses", "consumed_nonces", "children"} <= tables
        assert not {"verdicts", "verdict_signatures"} & tables
        assert state.admit([], LeafNonce("d:old", NOW + 60_000, 0), consume=True, now_ms=NOW) == StateRejection(
            Reason.NONCE_REPLAYED, 0
        )
        full = [ChildEdge("p", "c2", 1, NOW + 60_000, 1)]
        assert state.admit(full, LeafNonce("d:x", NOW + 60_000, 1), consume=False, now_ms=NOW) == StateRejection(
            Reason.FANOUT_EXCEEDED, 1
        )
        state.record_verdict(logged(1))
        assert collect_impact(state, ImpactQuery(DependencyKind.KEY, KEY)).verdict_ids == {"v-1"}
    finally:
        state.close()
    # Opening it again changes nothing.
    again = sqlite_store.SqliteState(path)
    try:
        assert again.verdict_count() == 1
        (version,) = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()
        assert version == sqlite_store.SCHEMA_VERSION == 6
    finally:
        again.close()


@pytest.mark.postgres
def test_postgres_version_2_gains_the_verdict_log_and_keeps_its_state(pg_schemas: PostgresSchemas) -> None:
    schema = pg_schemas.new()
    ident = sql.Identifier(schema)
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.countersign_schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for step in (1, 2):
            for statement in pg_store._MIGRATIONS[step]:
                conn.execute(sql.SQL(statement).format(schema=ident))
            conn.execute(
                sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (%s)").format(ident), (step,)
            )
        conn.execute(
            sql.SQL("INSERT INTO {}.consumed_nonces (nonce, retain_until_ms) VALUES ('d:old', %s)").format(ident),
            (NOW + 60_000,),
        )
    state = pg_store.PostgresState(pg_schemas.url(schema))
    try:
        assert state.schema_version() == pg_store.SCHEMA_VERSION == 7
        assert state.admit([], LeafNonce("d:old", NOW + 60_000, 0), consume=True, now_ms=NOW) == StateRejection(
            Reason.NONCE_REPLAYED, 0
        )
        state.record_verdict(logged(1))
        state.record_verdict(logged(2))
        assert collect_impact(state, ImpactQuery(DependencyKind.KEY, KEY)).verdict_ids == {"v-1", "v-2"}
        assert state.migrate() == pg_store.SCHEMA_VERSION  # idempotent: found up to date
    finally:
        state.close()


@pytest.mark.dynamodb_emulator
def test_dynamodb_table_of_the_previous_release_takes_the_log_beside_its_items(dynamodb_emulator: str) -> None:
    from verifier.stores.dynamodb import ensure_table

    url = dynamodb_url(dynamodb_emulator, f"cs-test-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    earlier = open_store(url)
    edges = [ChildEdge("p", "c1", 4, NOW + 60_000, 1)]
    assert earlier.admit(edges, LeafNonce("d:old", NOW + 60_000, 1), consume=True, now_ms=NOW) is None
    earlier.close()
    state = open_store(url)
    try:
        state.record_verdict(logged(1))
        assert state.entry_count() == 2  # the log's items are not nonce or child-set entries
        assert state.admit(edges, LeafNonce("d:old", NOW + 60_000, 1), consume=True, now_ms=NOW) == StateRejection(
            Reason.NONCE_REPLAYED, 1
        )
        assert collect_impact(state, ImpactQuery(DependencyKind.KEY, KEY)).verdict_ids == {"v-1"}
        # Collection after everything expired takes the old entries and the log's items alike.
        while state.collect_expired(NOW + 120_000, limit=100):
            pass
        assert (state.entry_count(), state.verdict_count()) == (0, 0)
        assert state.accepts_relying_on(DependencyKind.KEY, [KEY]) == []
    finally:
        state.close()


# --- the log before issue 29 moves over ------------------------------------------------------------

CLIENT = "spiffe://countersign.local/client/c"
PARENT_KEY = "ed25519:" + "2" * 32


def two_records(n: int) -> tuple[RecordUse, ...]:
    from countersign.state import CoSigner

    root = RecordUse("sha256:" + "a" * 64, "deployer-p", PARENT_KEY, NOW - 20)
    child = RecordUse(
        "sha256:" + f"{n:064x}", "deployer-a", KEY, NOW - 10,
        (CoSigner("parent", "deployer-p", PARENT_KEY), CoSigner("child", "deployer-a", KEY)),
    )  # fmt: skip
    return root, child


LEGACY = [
    VerdictEntry("v-1", NOW + 1, "accept", CLIENT, "r-1", 3, "ACCEPT", "", "signed-dag", two_records(1), NOW + 60_000,
                 True, "revoke_key deployer-a (registry sequence 4)"),
    VerdictEntry("v-2", NOW + 2, "audit", CLIENT, "", 3, "ACCEPT", "", "signed-dag", two_records(2), NOW + 60_000),
    VerdictEntry("v-3", NOW + 3, "accept", CLIENT, "", 3, "REJECT", "NONCE_REPLAYED", "signed-dag", two_records(1),
                 NOW + 60_000),
]  # fmt: skip


def legacy_rows(entry: VerdictEntry) -> tuple[tuple[object, ...], list[tuple[object, ...]]]:
    """The ``verdicts`` row and ``verdict_signatures`` rows the release before issue 29 wrote."""
    verdict = (
        entry.verdict_id, entry.time_ms, entry.mode, entry.client, entry.request_id, entry.registry_sequence,
        entry.verdict, entry.reason, entry.construction, entry.retain_until_ms, entry.needs_revalidation,
        entry.revalidation_cause,
    )  # fmt: skip
    signatures = [
        (entry.verdict_id, position, role, record.digest, deployer, key_id, record.created_ms, entry.time_ms)
        for position, record in enumerate(entry.records)
        for role, deployer, key_id in record.signatures()
    ]
    return verdict, signatures


def assert_moved_over(state: object) -> None:
    from countersign.state import VerifierStore

    store = cast(VerifierStore, state)
    assert store.verdict_count() == 3
    found = store.accepts_relying_on(DependencyKind.KEY, [PARENT_KEY])
    assert found == LEGACY[:2]  # every field, the mark and the co-signers included; the reject is no use
    assert store.mark_needs_revalidation(found, "again", NOW) == 1  # v-1 was marked before the move
    assert store.verdict_usage()[CLIENT].rows == 3


@pytest.mark.offline
def test_sqlite_version_5_moves_its_verdicts_to_the_log_that_stores_each_path_once(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    db = sqlite3.connect(path)
    for step in (1, 2, 3, 4, 5):
        for statement in sqlite_store._MIGRATIONS[step]:
            db.execute(statement)
    db.execute("PRAGMA user_version = 5")
    for entry in LEGACY:
        verdict, signatures = legacy_rows(entry)
        db.execute(f"INSERT INTO verdicts VALUES ({','.join('?' * 12)}, NULL)", verdict)
        db.executemany(f"INSERT INTO verdict_signatures VALUES ({','.join('?' * 8)})", signatures)
    db.commit()
    db.close()
    state = sqlite_store.SqliteState(path)
    try:
        assert_moved_over(state)
        tables = {
            row[0] for row in sqlite3.connect(path).execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        assert "verdict_signatures" not in tables and "verdicts" not in tables
        (paths,) = sqlite3.connect(path).execute("SELECT count(*) FROM verdict_paths").fetchone()
        assert paths == 2  # v-1 and v-3 relied on the same path: stored once
    finally:
        state.close()


@pytest.mark.postgres
def test_postgres_version_6_moves_its_verdicts_to_the_log_that_stores_each_path_once(
    pg_schemas: PostgresSchemas,
) -> None:
    schema = pg_schemas.new()
    ident = sql.Identifier(schema)
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.countersign_schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for step in range(1, 7):
            for statement in pg_store._MIGRATIONS[step]:
                conn.execute(sql.SQL(statement).format(schema=ident))
            conn.execute(
                sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (%s)").format(ident), (step,)
            )
        for entry in LEGACY:
            verdict, signatures = legacy_rows(entry)
            conn.execute(
                sql.SQL("INSERT INTO {}.verdicts VALUES ({}, NULL)").format(ident, sql.SQL(", ".join(["%s"] * 12))),
                verdict,
            )
            for row in signatures:
                conn.execute(sql.SQL("INSERT INTO {}.verdict_signatures VALUES ({})").format(
                    ident, sql.SQL(", ".join(["%s"] * 8))), row)  # fmt: skip
    state = pg_store.PostgresState(pg_schemas.url(schema))
    try:
        assert state.schema_version() == 7
        assert_moved_over(state)
    finally:
        state.close()


@pytest.mark.dynamodb_emulator
def test_dynamodb_items_of_the_log_before_moves_over_once(dynamodb_emulator: str) -> None:
    from countersign.state import path_json, path_uses
    from verifier.stores.dynamodb import ensure_table, make_client, parse_url, verdict_shard

    url = dynamodb_url(dynamodb_emulator, f"cs-test-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    client = make_client(parse_url(url))
    table = parse_url(url).table
    for entry in LEGACY:  # as the release before issue 29 wrote them
        shard = verdict_shard(entry.verdict_id)
        sk = f"{entry.time_ms:013d}#{entry.verdict_id}"
        retain = {"retain_until_ms": {"N": str(entry.retain_until_ms)}, "expires_at": {"N": "2000000000"}}
        for kind, value in path_uses(entry.records) if entry.accepted else []:
            client.put_item(TableName=table, Item={"pk": {"S": f"uses#{kind.value}#{value}#{shard}"}, "sk": {"S": sk},
                                                   **retain})  # fmt: skip
        client.put_item(
            TableName=table,
            Item={
                "pk": {"S": f"verdict#{shard}"}, "sk": {"S": sk}, "verdict_id": {"S": entry.verdict_id},
                "time_ms": {"N": str(entry.time_ms)}, "mode": {"S": entry.mode}, "client": {"S": entry.client},
                "request_id": {"S": entry.request_id}, "registry_sequence": {"N": str(entry.registry_sequence)},
                "verdict": {"S": entry.verdict}, "reason": {"S": entry.reason},
                "construction": {"S": entry.construction}, "records": {"S": path_json(entry.records)},
                "needs_revalidation": {"BOOL": entry.needs_revalidation},
                **({"revalidation_cause": {"S": entry.revalidation_cause}} if entry.needs_revalidation else {}),
                **retain,
            },
        )  # fmt: skip
        client.update_item(TableName=table, Key={"pk": {"S": f"verdict#{shard}"}, "sk": {"S": "verdict-count"}},
                           UpdateExpression="ADD n :one", ExpressionAttributeValues={":one": {"N": "1"}})  # fmt: skip
    state = open_store(url)
    try:
        assert_moved_over(state)
        old = client.scan(
            TableName=table, FilterExpression="begins_with(pk, :v) OR begins_with(pk, :u)",
            ExpressionAttributeValues={":v": {"S": "verdict#"}, ":u": {"S": "uses#"}},
        )  # fmt: skip
        assert old["Items"] == []
    finally:
        state.close()
    assert open_store(url).verdict_count() == 3  # opened again: nothing moves twice
