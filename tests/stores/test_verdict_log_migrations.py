"""A store written before the verdict log existed opens, gains the log's tables, and keeps what it
remembered: SQLite from version 3, PostgreSQL from version 2, and a DynamoDB table holding items of
the previous release (the log adds item kinds to the same table, so there is nothing to migrate)."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

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
        assert {"verdicts", "verdict_signatures", "consumed_nonces", "children", "child_counts"} <= tables
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
        assert version == sqlite_store.SCHEMA_VERSION == 5
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
        assert state.schema_version() == pg_store.SCHEMA_VERSION == 6
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
