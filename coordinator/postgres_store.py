"""The registry log in PostgreSQL, shared by coordinator replicas (and surviving any one host).

URL parameters as every daemon store reads them (:mod:`countersign._daemon.postgres`); the schema
defaults to ``public`` (where earlier releases kept the tables), the password to
``COUNTERSIGN_LOG_STORE_PASSWORD``. The primary key on ``sequence`` makes a racing second replica
fail with :class:`coordinator.store.LogConflict` rather than fork the log, and the checkpoint row is
replaced only by a checkpoint that is not older (one conditional upsert).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from coordinator.store import LogConflict, StoredCheckpoint, statements_in_order
from countersign._daemon.postgres import PostgresDatabase, load_migrations, parse_postgres_url
from countersign.errors import ConfigError, StateUnavailable

PASSWORD_ENV = "COUNTERSIGN_LOG_STORE_PASSWORD"  # noqa: S105 - the NAME of the variable, not a password
VERSION_TABLE = "countersign_registry_log_version"
MIGRATIONS = "coordinator.migrations.postgres"


class PostgresLogStore:
    def __init__(self, url: str) -> None:
        settings = parse_postgres_url(
            url, default_schema="public", password_env=PASSWORD_ENV, application="countersign-coordinator"
        )
        self.schema = settings.schema
        try:
            self._db = PostgresDatabase(settings, name="coordinator")
        except StateUnavailable as exc:
            raise ConfigError(f"cannot open the registry log in PostgreSQL: {exc}") from None
        try:
            self._db.migrate(load_migrations(MIGRATIONS), table=VERSION_TABLE)
        except StateUnavailable as exc:
            self._db.close()
            raise ConfigError(f"cannot open the registry log in PostgreSQL: {exc}") from None
        except BaseException:
            self._db.close()
            raise
        ident = sql.Identifier(self.schema)
        self._load_sql = sql.SQL(
            "SELECT sequence, statement FROM {}.registry_log WHERE sequence >= %s ORDER BY sequence"
        ).format(ident)
        self._append_sql = sql.SQL(
            "INSERT INTO {}.registry_log (sequence, digest, statement) VALUES (%s, %s, %s)"
        ).format(ident)
        # One statement: the row is replaced only by a checkpoint that is not older (spec 7.5), and
        # returns nothing otherwise; a concurrent replica's insert or update is waited for, then judged.
        self._put_sql = sql.SQL(
            "INSERT INTO {s}.registry_checkpoint AS held (only_row, checkpoint, sequence, issued_ms)"
            " VALUES (1, %s, %s, %s) ON CONFLICT (only_row) DO UPDATE SET checkpoint = excluded.checkpoint,"
            " sequence = excluded.sequence, issued_ms = excluded.issued_ms"
            " WHERE held.sequence <= excluded.sequence AND held.issued_ms <= excluded.issued_ms RETURNING 1"
        ).format(s=ident)
        self._checkpoint_sql = sql.SQL("SELECT checkpoint FROM {}.registry_checkpoint WHERE only_row = 1").format(ident)

    def load(self, start: int = 0) -> list[bytes]:
        with self._db.connection("load") as conn:
            rows = conn.execute(self._load_sql, (start,)).fetchall()
        return statements_in_order(start, rows)

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: StoredCheckpoint | None = None) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            conn.execute(self._append_sql, (sequence, digest, statement))
            if checkpoint is not None and not self._put_checkpoint(conn, checkpoint):
                raise LogConflict("a newer checkpoint is stored")

        try:
            self._db.run("append", work)
        except StateUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise LogConflict(f"sequence {sequence} is already stored") from None
            raise

    def _put_checkpoint(self, conn: psycopg.Connection[Any], checkpoint: StoredCheckpoint) -> bool:
        return (
            conn.execute(self._put_sql, (checkpoint.data, checkpoint.sequence, checkpoint.issued_ms)).fetchone()
            is not None
        )

    def load_checkpoint(self) -> bytes | None:
        with self._db.connection("load checkpoint") as conn:
            row = conn.execute(self._checkpoint_sql).fetchone()
        return None if row is None else bytes(row[0])

    def store_checkpoint(self, checkpoint: StoredCheckpoint) -> bool:
        return bool(self._db.run("store checkpoint", lambda conn: self._put_checkpoint(conn, checkpoint)))

    def close(self) -> None:
        self._db.close()
