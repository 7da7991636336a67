"""Durable storage of the registry log: an append-only table of signed statements.

``sqlite:///path`` (default) or ``postgresql://…`` (so a coordinator can restart on another host).
The store only keeps bytes in order; every statement is re-verified when the log is loaded.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Protocol
from urllib.parse import urlsplit

from countersign._daemon.sqlite import open_sqlite, sqlite_file
from countersign.errors import ConfigError


class LogConflict(Exception):
    """Another statement already holds this sequence number."""


class LogStore(Protocol):
    def load(self) -> list[bytes]:
        """Every stored statement, in sequence order."""
        ...

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: bytes | None = None) -> None:
        """Store one statement durably (and, if given, the checkpoint naming the log it ends, in the
        same transaction). Raises LogConflict if ``sequence`` is taken."""
        ...

    def load_checkpoint(self) -> bytes | None:
        """The latest stored signed checkpoint, if any."""
        ...

    def store_checkpoint(self, checkpoint: bytes) -> None:
        """Replace the stored checkpoint durably."""
        ...

    def close(self) -> None: ...


class SqliteLogStore:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        try:
            self._db = open_sqlite(path)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS registry_log"
                " (sequence INTEGER PRIMARY KEY, digest TEXT NOT NULL, statement BLOB NOT NULL)"
            )
            # One row: only the latest checkpoint matters (an older one is superseded, never served).
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS registry_checkpoint"
                " (only_row INTEGER PRIMARY KEY CHECK (only_row = 1), checkpoint BLOB NOT NULL)"
            )
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open registry log {path}: {exc}") from None

    def load(self) -> list[bytes]:
        with self._lock:
            rows = self._db.execute("SELECT sequence, statement FROM registry_log ORDER BY sequence").fetchall()
        for expected, (sequence, _) in enumerate(rows):
            if sequence != expected:
                raise ConfigError(f"registry log has a gap at sequence {expected}")
        return [bytes(statement) for _, statement in rows]

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: bytes | None = None) -> None:
        with self._lock:
            # One transaction: the statement and the checkpoint naming it (the connection autocommits).
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO registry_log (sequence, digest, statement) VALUES (?, ?, ?)",
                    (sequence, digest, statement),
                )
                if checkpoint is not None:
                    self._put_checkpoint(checkpoint)
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                raise LogConflict(f"sequence {sequence} is already stored") from None
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _put_checkpoint(self, checkpoint: bytes) -> None:
        self._db.execute(
            "INSERT INTO registry_checkpoint (only_row, checkpoint) VALUES (1, ?)"
            " ON CONFLICT (only_row) DO UPDATE SET checkpoint = excluded.checkpoint",
            (checkpoint,),
        )

    def load_checkpoint(self) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT checkpoint FROM registry_checkpoint WHERE only_row = 1").fetchone()
        return None if row is None else bytes(row[0])

    def store_checkpoint(self, checkpoint: bytes) -> None:
        with self._lock:
            self._put_checkpoint(checkpoint)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_log_store(url: str) -> LogStore:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = sqlite_file(url)
        if path is None:
            shapes = "sqlite:///relative/registry.db or sqlite:////absolute/registry.db"
            raise ConfigError(f"log_store must look like {shapes}, got {url!r}")
        return SqliteLogStore(path)
    if parts.scheme in ("postgresql", "postgres"):
        from coordinator.postgres_store import PostgresLogStore

        return PostgresLogStore(url)
    raise ConfigError(f"unknown log_store scheme {parts.scheme!r}; use sqlite:/// or postgresql://")
