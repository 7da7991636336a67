"""Upgrading a store written by an older schema version keeps what it remembered."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from countersign.reasons import Reason
from countersign.state import ChildEdge, EarlierAcceptance, LeafNonce, StateRejection
from tests.stores.conftest import PostgresSchemas
from verifier.stores import postgres as pg_store
from verifier.stores import sqlite as sqlite_store

NOW = 1_000_000


@pytest.mark.offline
def test_sqlite_version_1_upgrades_and_keeps_consumed_nonces(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    for statement in sqlite_store._MIGRATIONS[1]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO consumed_nonces (nonce, retain_until_ms) VALUES ('d:old', ?)", (NOW + 60_000,))
    db.commit()
    db.close()
    state = sqlite_store.SqliteState(path)
    try:
        replay = state.admit([], LeafNonce("d:old", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW)
        assert replay == StateRejection(Reason.NONCE_REPLAYED, 0)
        assert state.admit([], LeafNonce("d:new", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW) is None
        (version,) = sqlite3.connect(path).execute("PRAGMA user_version").fetchone()
        assert version == sqlite_store.SCHEMA_VERSION == 5
    finally:
        state.close()


@pytest.mark.offline
def test_sqlite_version_4_keeps_keyed_nonces_and_retries_name_no_time(tmp_path: Path) -> None:
    """A nonce consumed under a request id before acceptance times were kept: a retry is still a
    retry (time 0: unknown), anything else still a replay."""
    path = tmp_path / "v4.db"
    db = sqlite3.connect(path)
    for step in range(1, 5):
        for statement in sqlite_store._MIGRATIONS[step]:
            db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    db.execute("INSERT INTO consumed_nonces VALUES ('d:old', ?, 'client|r')", (NOW + 60_000,))
    db.commit()
    db.close()
    state = sqlite_store.SqliteState(path)
    try:
        retry = state.admit([], LeafNonce("d:old", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW)
        assert retry == EarlierAcceptance(0)
        other = state.admit([], LeafNonce("d:old", NOW + 60_000, 0, "client|s"), consume=True, now_ms=NOW)
        assert other == StateRejection(Reason.NONCE_REPLAYED, 0)
    finally:
        state.close()


@pytest.mark.offline
def test_sqlite_version_2_counts_the_children_it_already_had(tmp_path: Path) -> None:
    """Version 3 reads a parent's child count from ``child_counts``: the upgrade must count the
    children recorded before it, or a parent would get its whole ``max_children`` again."""
    path = tmp_path / "v2.db"
    db = sqlite3.connect(path)
    for step in (1, 2):
        for statement in sqlite_store._MIGRATIONS[step]:
            db.execute(statement)
    db.execute("PRAGMA user_version = 2")
    retain = NOW + 60_000
    for child in ("c1", "c2", "c3"):
        db.execute("INSERT INTO children (parent, child, retain_until_ms) VALUES ('p:full', ?, ?)", (child, retain))
    db.execute("INSERT INTO children (parent, child, retain_until_ms) VALUES ('p:one', 'c1', ?)", (NOW + 10,))
    db.commit()
    db.close()

    def edge(parent: str, child: str, max_children: int) -> list[ChildEdge]:
        return [ChildEdge(parent, child, max_children, retain, 1)]

    state = sqlite_store.SqliteState(path)
    try:
        leaf = LeafNonce("d:leaf", retain, 1)
        assert state.admit(edge("p:full", "c4", 3), leaf, consume=False, now_ms=NOW) == StateRejection(
            Reason.FANOUT_EXCEEDED, 1
        )
        assert state.admit(edge("p:full", "c2", 3), leaf, consume=False, now_ms=NOW) is None  # already counted
        assert state.admit(edge("p:one", "c2", 1), leaf, consume=False, now_ms=NOW) == StateRejection(
            Reason.FANOUT_EXCEEDED, 1
        )
        # Collecting the expired child frees its slot: the count follows the rows it counts.
        assert state.collect_expired(NOW + 11, 10_000) == 1
        assert state.admit(edge("p:one", "c2", 1), leaf, consume=True, now_ms=NOW) is None
        counts = dict(sqlite3.connect(path).execute("SELECT parent, count FROM child_counts").fetchall())
        assert counts == {"p:full": 3, "p:one": 1}
    finally:
        state.close()


@pytest.mark.postgres
def test_postgres_version_1_upgrades_and_keeps_consumed_nonces(pg_schemas: PostgresSchemas) -> None:
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
        for statement in pg_store._MIGRATIONS[1]:
            conn.execute(sql.SQL(statement).format(schema=ident))
        conn.execute(sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (1)").format(ident))
        conn.execute(
            sql.SQL("INSERT INTO {}.consumed_nonces (nonce, retain_until_ms) VALUES ('d:old', %s)").format(ident),
            (NOW + 60_000,),
        )
    state = pg_store.PostgresState(pg_schemas.url(schema))
    try:
        assert state.schema_version() == pg_store.SCHEMA_VERSION == 6
        replay = state.admit([], LeafNonce("d:old", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW)
        assert replay == StateRejection(Reason.NONCE_REPLAYED, 0)
        assert state.admit([], LeafNonce("d:new", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW) is None
        retry = state.admit([], LeafNonce("d:new", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW + 1)
        assert retry == EarlierAcceptance(NOW)
    finally:
        state.close()
