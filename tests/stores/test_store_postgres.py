"""PostgreSQL-specific behaviour: URL handling, versioned migrations, bounded waits, error mapping."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg import sql

from countersign.errors import StateUnavailable
from countersign.state import ChildEdge, LeafNonce
from tests.stores.conftest import PostgresSchemas
from verifier.stores import StoreConfigError, open_store
from verifier.stores.postgres import SCHEMA_VERSION, PostgresState, parse_url

pytestmark = pytest.mark.postgres

RETAIN = 10**13


def test_url_parameters_are_read_and_stripped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COUNTERSIGN_STORE_PASSWORD", "s3cret")
    conninfo, schema, settings = parse_url(
        "postgresql://verifier@db.internal:6543/state?sslmode=require&schema=cs_a&pool_max_size=3&connect_timeout=4"
    )
    assert schema == "cs_a"
    assert settings["pool_max_size"] == 3 and settings["connect_timeout"] == 4
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    assert params["password"] == "s3cret" and params["sslmode"] == "require" and params["port"] == "6543"
    assert "schema" not in params and "pool_max_size" not in params
    _, from_options, _ = parse_url("postgresql://u@h/db?options=-csearch_path%3Dcs_b")
    assert from_options == "cs_b"
    assert parse_url("postgresql://u@h/db")[1] == "countersign"
    for bad in ("postgresql://u@h/db?schema=a;drop", "postgresql://u@h/db?pool_max_size=0"):
        with pytest.raises(StoreConfigError):
            parse_url(bad)


def test_search_path_option_selects_the_schema(pg_schemas: PostgresSchemas) -> None:
    schema = pg_schemas.new()
    store = open_store(f"{pg_schemas.base_url}?options=-csearch_path%3D{schema}")
    try:
        assert store.admit([], LeafNonce("n", RETAIN, 0), consume=True, now_ms=0) is None
    finally:
        store.close()
    with psycopg.connect(pg_schemas.base_url) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.consumed_nonces").format(sql.Identifier(schema))).fetchone()
    assert row == (1,)


def test_concurrent_starters_apply_each_migration_once(pg_schemas: PostgresSchemas) -> None:
    url = pg_schemas.url(pg_schemas.new())
    barrier = threading.Barrier(6)

    def start() -> PostgresState:
        barrier.wait()
        return PostgresState(url)

    with ThreadPoolExecutor(6) as pool:
        stores = list(pool.map(lambda _: start(), range(6)))
    try:
        assert {s.schema_version() for s in stores} == {SCHEMA_VERSION}
        assert stores[0].migrate() == SCHEMA_VERSION  # already there: a no-op
        with psycopg.connect(pg_schemas.base_url) as conn:
            rows = conn.execute(
                sql.SQL("SELECT version FROM {}.countersign_schema_version ORDER BY version").format(
                    sql.Identifier(stores[0].schema)
                )
            ).fetchall()
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    finally:
        for store in stores:
            store.close()


def test_schema_newer_than_the_software_is_refused(pg_schemas: PostgresSchemas) -> None:
    url = pg_schemas.url(pg_schemas.new())
    store = PostgresState(url)
    with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (99)").format(
                sql.Identifier(store.schema)
            )
        )
    store.close()
    with pytest.raises(StateUnavailable, match="newer than this software"):
        PostgresState(url)


def test_unreachable_server_fails_within_the_connect_timeout(pg_schemas: PostgresSchemas) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        started = time.monotonic()
        with pytest.raises(StateUnavailable, match="PostgreSQL"):
            open_store(f"postgresql://postgres@127.0.0.1:{port}/test?connect_timeout=2&schema=cs_unused")
    assert time.monotonic() - started < 8


def test_lock_wait_is_bounded_by_the_statement_timeout(pg_schemas: PostgresSchemas) -> None:
    url = pg_schemas.url(pg_schemas.new(), statement_timeout_ms=300)
    store = PostgresState(url)
    edge = ChildEdge("busy-parent", "c", 5, RETAIN, 1)
    try:
        assert store.admit([edge], LeafNonce("first", RETAIN, 1), consume=True, now_ms=0) is None
        with psycopg.connect(pg_schemas.base_url) as holder:
            holder.execute(
                sql.SQL("SELECT 1 FROM {}.child_sets WHERE parent = 'busy-parent' FOR UPDATE").format(
                    sql.Identifier(store.schema)
                )
            )
            started = time.monotonic()
            with pytest.raises(StateUnavailable, match="statement timeout"):
                store.admit([edge], LeafNonce("second", RETAIN, 1), consume=True, now_ms=0)
            assert time.monotonic() - started < 5
        # The timed-out admit was rolled back as a whole: its nonce is still free.
        assert store.admit([edge], LeafNonce("second", RETAIN, 1), consume=True, now_ms=0) is None
    finally:
        store.close()


def test_driver_errors_become_state_unavailable(pg_schemas: PostgresSchemas) -> None:
    store = PostgresState(pg_schemas.url(pg_schemas.new()))
    try:
        with psycopg.connect(pg_schemas.base_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}.consumed_nonces CASCADE").format(sql.Identifier(store.schema)))
        with pytest.raises(StateUnavailable, match=r"PostgreSQL \(admit\)"):
            store.admit([], LeafNonce("n", RETAIN, 0), consume=True, now_ms=0)
        with pytest.raises(StateUnavailable):
            store.entry_count()
    finally:
        store.close()
