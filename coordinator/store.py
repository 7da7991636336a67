"""Durable storage of the registry log: an append-only table of signed statements and the latest
operator checkpoint (docs/stores.md "Registry log"); :mod:`coordinator.log_stores` opens the one a URL names.

``sqlite:///path`` (default; coordinators on one host may share the file), ``postgresql://…`` and
``dynamodb://TABLE?region=…`` (coordinator replicas in several zones share one log). The store only
keeps bytes in order; every statement is re-verified when a coordinator loads it. Two replicas cannot
fork the log: a sequence number is taken once (the second append raises :class:`LogConflict`), and the
stored checkpoint is only ever replaced by one that is not older (spec 7.5).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from typing import Protocol

from countersign._daemon.sqlite import open_sqlite
from countersign.errors import ConfigError, StateUnavailable


class LogConflict(Exception):
    """Another statement already holds this sequence number, or a newer checkpoint is stored."""


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A signed checkpoint's bytes and what orders it: the log length it names and when it was issued."""

    data: bytes
    sequence: int
    issued_ms: int


class LogStore(Protocol):
    def load(self, start: int = 0) -> list[bytes]:
        """Every stored statement from sequence ``start`` on, in order. Raises ConfigError on a gap."""
        ...

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: StoredCheckpoint | None = None) -> None:
        """Store one statement durably (and, if given, the checkpoint naming the log it ends, in the
        same transaction). Raises LogConflict if ``sequence`` is taken or a newer checkpoint is stored."""
        ...

    def load_checkpoint(self) -> bytes | None:
        """The latest stored signed checkpoint, if any."""
        ...

    def store_checkpoint(self, checkpoint: StoredCheckpoint) -> bool:
        """Replace the stored checkpoint durably, unless the stored one is newer (then False)."""
        ...

    def close(self) -> None: ...


def may_replace(checkpoint: StoredCheckpoint, stored: tuple[int, int] | None) -> bool:
    """Whether ``checkpoint`` may replace the one stored as (sequence, issued_ms) (spec 7.5: not older)."""
    return stored is None or (checkpoint.sequence >= stored[0] and checkpoint.issued_ms >= stored[1])


class SqliteLogStore:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        try:
            self._db = open_sqlite(path)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS registry_log"
                " (sequence INTEGER PRIMARY KEY, digest TEXT NOT NULL, statement BLOB NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS registry_checkpoint (only_row INTEGER PRIMARY KEY CHECK (only_row = 1),"
                " checkpoint BLOB NOT NULL, sequence INTEGER NOT NULL DEFAULT 0, issued_ms INTEGER NOT NULL DEFAULT 0)"
            )
            columns = {str(row[1]) for row in self._db.execute("PRAGMA table_info(registry_checkpoint)")}
            for column in ("sequence", "issued_ms"):  # a file from before checkpoints were ordered
                if column not in columns:
                    self._db.execute(f"ALTER TABLE registry_checkpoint ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open registry log {path}: {exc}") from None

    def load(self, start: int = 0) -> list[bytes]:
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT sequence, statement FROM registry_log WHERE sequence >= ? ORDER BY sequence", (start,)
                ).fetchall()
            except sqlite3.Error as exc:
                raise StateUnavailable(f"registry log: {exc}") from exc
        return statements_in_order(start, rows)

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: StoredCheckpoint | None = None) -> None:
        with self._lock:
            # One transaction: the statement and the checkpoint naming it (the connection autocommits).
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO registry_log (sequence, digest, statement) VALUES (?, ?, ?)",
                    (sequence, digest, statement),
                )
                if checkpoint is not None and not self._put_checkpoint(checkpoint):
                    raise LogConflict("a newer checkpoint is stored")
            except sqlite3.IntegrityError:
                self._db.execute("ROLLBACK")
                raise LogConflict(f"sequence {sequence} is already stored") from None
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _put_checkpoint(self, checkpoint: StoredCheckpoint) -> bool:
        row = self._db.execute("SELECT sequence, issued_ms FROM registry_checkpoint WHERE only_row = 1").fetchone()
        if not may_replace(checkpoint, None if row is None else (int(row[0]), int(row[1]))):
            return False
        self._db.execute(
            "INSERT INTO registry_checkpoint (only_row, checkpoint, sequence, issued_ms) VALUES (1, ?, ?, ?)"
            " ON CONFLICT (only_row) DO UPDATE SET checkpoint = excluded.checkpoint, sequence = excluded.sequence,"
            " issued_ms = excluded.issued_ms",
            (checkpoint.data, checkpoint.sequence, checkpoint.issued_ms),
        )
        return True

    def load_checkpoint(self) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT checkpoint FROM registry_checkpoint WHERE only_row = 1").fetchone()
        return None if row is None else bytes(row[0])

    def store_checkpoint(self, checkpoint: StoredCheckpoint) -> bool:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                stored = self._put_checkpoint(checkpoint)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return stored

    def close(self) -> None:
        with self._lock:
            self._db.close()


def statements_in_order(start: int, rows: list[tuple[int, bytes]] | list[tuple[object, ...]]) -> list[bytes]:
    """The statements of ``rows`` (sequence, statement), checked to run from ``start`` without a gap."""
    for expected, (sequence, _) in enumerate(rows, start):
        if sequence != expected:
            raise ConfigError(f"registry log has a gap at sequence {expected}")
    return [bytes(statement) for _, statement in rows]  # type: ignore[call-overload]
