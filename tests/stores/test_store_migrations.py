"""Upgrading a store written by an older schema version keeps what it remembered.

PostgreSQL schemas are made as the release before issue 31 made them (its migrations were Python
strings: tests/stores/released_verifier_postgres.py keeps a copy), at every version it had, then
opened with the current code, whose migrations are ``.sql`` files: each is recognised at its version
and migrated on from there, nothing applied twice, and it ends as a schema made afresh does."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from countersign._daemon.postgres import load_migrations
from countersign.reasons import Reason
from countersign.state import ChildEdge, EarlierAcceptance, LeafNonce, StateRejection
from tests.stores.conftest import PostgresSchemas
from tests.stores.released_verifier_postgres import MIGRATIONS as RELEASED_MIGRATIONS
from tests.stores.released_verifier_postgres import create_as_released
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
        assert version == sqlite_store.SCHEMA_VERSION == 6
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
    create_as_released(pg_schemas.base_url, schema, 1)
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.consumed_nonces (nonce, retain_until_ms) VALUES ('d:old', %s)").format(
                sql.Identifier(schema)
            ),
            (NOW + 60_000,),
        )
    state = pg_store.PostgresState(pg_schemas.url(schema))
    try:
        assert state.schema_version() == pg_store.SCHEMA_VERSION == 7
        replay = state.admit([], LeafNonce("d:old", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW)
        assert replay == StateRejection(Reason.NONCE_REPLAYED, 0)
        assert state.admit([], LeafNonce("d:new", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW) is None
        retry = state.admit([], LeafNonce("d:new", NOW + 60_000, 0, "client|r"), consume=True, now_ms=NOW + 1)
        assert retry == EarlierAcceptance(NOW)
    finally:
        state.close()


@pytest.mark.offline
def test_the_migration_files_are_the_released_migrations_and_nothing_more() -> None:
    """One ``.sql`` file per migration the released code had, numbered as it numbered them: a
    deployment at version N needs exactly files N+1 onwards."""
    files = load_migrations(pg_store.MIGRATIONS)
    assert [n for n, _ in files] == sorted(RELEASED_MIGRATIONS) == list(range(1, pg_store.SCHEMA_VERSION + 1))
    for _, text in files:
        assert "{schema}" not in text and "countersign_schema_version" not in text


def schema_shape(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """What a schema holds, with its name taken out: every column (type, nullability, default), index,
    constraint, and function signature (name, arguments, result)."""
    columns = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns"
        " WHERE table_schema = %s ORDER BY 1, 2",
        (schema,),
    ).fetchall()
    indexes = conn.execute(
        "SELECT tablename, indexname, replace(indexdef, %s, 'S.') FROM pg_indexes WHERE schemaname = %s ORDER BY 1, 2",
        (f"{schema}.", schema),
    ).fetchall()
    constraints = conn.execute(
        "SELECT c.conrelid::regclass::text, c.contype, replace(pg_get_constraintdef(c.oid), %s, 'S.')"
        " FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = %s ORDER BY 1, 2, 3",
        (f"{schema}.", schema),
    ).fetchall()
    functions = conn.execute(
        "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1, 2",
        (schema,),
    ).fetchall()
    constraints = [(table.replace(f"{schema}.", "S."), kind, text) for table, kind, text in constraints]
    return {"columns": columns, "indexes": indexes, "constraints": constraints, "functions": functions}


@pytest.mark.postgres
@pytest.mark.parametrize("version", range(0, 8))
def test_a_schema_the_released_code_made_at_any_version_is_migrated_on_from_there(
    pg_schemas: PostgresSchemas, version: int
) -> None:
    """The released code's schema at ``version`` (0: its version table alone), opened by the current
    code: the versions it had keep their rows (nothing re-run), the rest are added, and it then holds
    exactly what the released code makes at its last version and what the current code makes afresh."""
    released, fresh, migrated = pg_schemas.new(), pg_schemas.new(), pg_schemas.new()
    create_as_released(pg_schemas.base_url, released, 7)
    create_as_released(pg_schemas.base_url, migrated, version)
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        before = conn.execute(
            sql.SQL("SELECT version, applied_at FROM {}.countersign_schema_version ORDER BY version").format(
                sql.Identifier(migrated)
            )
        ).fetchall()
    assert [v for v, _ in before] == list(range(1, version + 1))
    for schema in (fresh, migrated):
        store = pg_store.PostgresState(pg_schemas.url(schema))
        try:
            assert store.migrate() == pg_store.SCHEMA_VERSION  # found up to date the second time
            edges = [ChildEdge("p", "c1", 1, NOW + 60_000, 1)]
            assert store.admit(edges, LeafNonce("n1", NOW + 60_000, 1), consume=True, now_ms=NOW) is None
            session = [LeafNonce("s1", NOW + 60_000, 0, "c|r"), LeafNonce("s2", NOW + 60_000, 1, "c|r")]
            assert store.admit_session(edges, session, consume=True, now_ms=NOW) is None
            assert store.admit_session(edges, session, consume=True, now_ms=NOW + 5) == EarlierAcceptance(NOW)
            other = [ChildEdge("p", "c2", 1, NOW + 60_000, 1)]
            assert store.admit(other, LeafNonce("n2", NOW + 60_000, 1), consume=False, now_ms=NOW) == StateRejection(
                Reason.FANOUT_EXCEEDED, 1
            )
        finally:
            store.close()
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        after = conn.execute(
            sql.SQL("SELECT version, applied_at FROM {}.countersign_schema_version ORDER BY version").format(
                sql.Identifier(migrated)
            )
        ).fetchall()
        assert after[:version] == before  # the versions it had were not applied again
        assert [v for v, _ in after] == list(range(1, pg_store.SCHEMA_VERSION + 1))
        shapes = [schema_shape(conn, schema) for schema in (released, fresh, migrated)]
    assert shapes[0] == shapes[1] == shapes[2]
    assert shapes[0]["functions"] and shapes[0]["indexes"]


@pytest.mark.postgres
def test_starting_beside_a_replica_of_the_released_code_waits_for_its_migration(pg_schemas: PostgresSchemas) -> None:
    """The released code migrated under the advisory lock ``countersign-schema:<schema>``: the current
    code takes the same one, so a replica of each starting at once apply each migration once."""
    schema = pg_schemas.new()
    opened: list[pg_store.PostgresState] = []
    with psycopg.connect(pg_schemas.base_url) as holder:  # a transaction: the released code migrating
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"countersign-schema:{schema}",))
        starter = threading.Thread(target=lambda: opened.append(pg_store.PostgresState(pg_schemas.url(schema))))
        starter.start()
        with psycopg.connect(pg_schemas.base_url, autocommit=True) as watcher:
            deadline = time.monotonic() + 20
            while not watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid <> %s",
                (holder.info.backend_pid,),
            ).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the starter never queued on the released code's lock"
                assert not opened, "the starter migrated without waiting for the released code's lock"
                time.sleep(0.05)  # polling a server-side wait, bounded by the deadline
            # Queued before its first migration: nothing of the schema exists yet.
            made = watcher.execute("SELECT to_regclass(%s)", (f"{schema}.countersign_schema_version",)).fetchone()
            assert made == (None,), "the starter migrated while the released code held the lock"
        assert starter.is_alive() and not opened
    starter.join(timeout=30)
    assert len(opened) == 1
    try:
        assert opened[0].schema_version() == pg_store.SCHEMA_VERSION
    finally:
        opened[0].close()
