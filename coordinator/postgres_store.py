"""The registry log in PostgreSQL, so a coordinator can restart on another host without losing statements.

``postgresql://user@host/db?schema=name`` (the schema is created if missing). One table, appended
inside a transaction; the primary key on ``sequence`` makes a racing second coordinator fail with
:class:`coordinator.store.LogConflict` rather than fork the log.

The password, when the URL has none, comes from ``COUNTERSIGN_LOG_STORE_PASSWORD`` (then libpq's own
``PGPASSWORD`` / ``.pgpass``), mirroring the verifier store's ``COUNTERSIGN_STORE_PASSWORD``; it is
handed to libpq only and never logged or put into an error message.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from coordinator.store import LogConflict
from countersign.errors import ConfigError, StateUnavailable

PASSWORD_ENV = "COUNTERSIGN_LOG_STORE_PASSWORD"  # noqa: S105 - the NAME of the variable, not a password


class PostgresLogStore:
    def __init__(self, url: str, *, connect_timeout_s: int = 5) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        self._schema = query.pop("schema", "public")
        # libpq decodes %XX only: a space must go back as %20, not as urlencode's default "+".
        self._url = urlunsplit(parts._replace(scheme="postgresql", query=urlencode(query, quote_via=quote)))
        try:
            has_password = "password" in conninfo_to_dict(self._url)
        except psycopg.ProgrammingError:
            raise ConfigError("log_store is not a valid PostgreSQL URL") from None
        # Only when the URL carries none: a password in the URL always wins.
        self._extra: dict[str, Any] = {}
        if not has_password and os.environ.get(PASSWORD_ENV):
            self._extra["password"] = os.environ[PASSWORD_ENV]
        self._timeout = connect_timeout_s
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        try:
            conn = self._connection()
            with conn.transaction():
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema)))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {}.registry_log"
                        " (sequence BIGINT PRIMARY KEY, digest TEXT NOT NULL, statement BYTEA NOT NULL)"
                    ).format(sql.Identifier(self._schema))
                )
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {}.registry_checkpoint"
                        " (only_row INTEGER PRIMARY KEY CHECK (only_row = 1), checkpoint BYTEA NOT NULL)"
                    ).format(sql.Identifier(self._schema))
                )
        except StateUnavailable as exc:
            raise ConfigError(f"cannot open the registry log in PostgreSQL: {exc}") from None

    def _connection(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self._url, connect_timeout=self._timeout, autocommit=True, **self._extra)
            except psycopg.Error as exc:
                raise StateUnavailable(f"PostgreSQL unreachable: {exc}") from None
        return self._conn

    def load(self) -> list[bytes]:
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    rows = conn.execute(
                        sql.SQL("SELECT sequence, statement FROM {}.registry_log ORDER BY sequence").format(
                            sql.Identifier(self._schema)
                        )
                    ).fetchall()
            except psycopg.Error as exc:
                raise ConfigError(f"cannot read the registry log: {exc}") from None
        for expected, (sequence, _) in enumerate(rows):
            if sequence != expected:
                raise ConfigError(f"registry log has a gap at sequence {expected}")
        return [bytes(statement) for _, statement in rows]  # type: ignore[call-overload]

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: bytes | None = None) -> None:
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    conn.execute(
                        sql.SQL("INSERT INTO {}.registry_log (sequence, digest, statement) VALUES (%s, %s, %s)").format(
                            sql.Identifier(self._schema)
                        ),
                        (sequence, digest, statement),
                    )
                    if checkpoint is not None:
                        self._put_checkpoint(conn, checkpoint)
            except psycopg.errors.UniqueViolation:
                raise LogConflict(f"sequence {sequence} is already stored") from None
            except psycopg.Error as exc:
                self._conn = None
                raise StateUnavailable(f"PostgreSQL: {exc}") from None

    def _put_checkpoint(self, conn: psycopg.Connection[tuple[object, ...]], checkpoint: bytes) -> None:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.registry_checkpoint (only_row, checkpoint) VALUES (1, %s)"
                " ON CONFLICT (only_row) DO UPDATE SET checkpoint = excluded.checkpoint"
            ).format(sql.Identifier(self._schema)),
            (checkpoint,),
        )

    def load_checkpoint(self) -> bytes | None:
        with self._lock:
            try:
                row = (
                    self._connection()
                    .execute(
                        sql.SQL("SELECT checkpoint FROM {}.registry_checkpoint WHERE only_row = 1").format(
                            sql.Identifier(self._schema)
                        )
                    )
                    .fetchone()
                )
            except psycopg.Error as exc:
                raise ConfigError(f"cannot read the registry checkpoint: {exc}") from None
        return None if row is None else bytes(row[0])  # type: ignore[call-overload]

    def store_checkpoint(self, checkpoint: bytes) -> None:
        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    self._put_checkpoint(conn, checkpoint)
            except psycopg.Error as exc:
                self._conn = None
                raise StateUnavailable(f"PostgreSQL: {exc}") from None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
