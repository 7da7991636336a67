"""SQLite verifier state: the embedded default, for one verifier (or several processes on one host).

WAL journal; every :meth:`admit` is one ``BEGIN IMMEDIATE`` transaction, so concurrent verifiers
sharing the file serialise on SQLite's write lock and a nonce is consumed at most once.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from countersign._daemon.sqlite import open_sqlite
from countersign.errors import StateUnavailable
from countersign.reasons import Reason
from countersign.state import ChildEdge, LeafNonce, StateRejection

SCHEMA_VERSION = 3
_MIGRATIONS = {
    1: (
        "CREATE TABLE consumed_nonces (nonce TEXT PRIMARY KEY, retain_until_ms INTEGER NOT NULL) WITHOUT ROWID",
        "CREATE INDEX consumed_nonces_retention ON consumed_nonces (retain_until_ms)",
        "CREATE TABLE children (parent TEXT NOT NULL, child TEXT NOT NULL, retain_until_ms INTEGER NOT NULL,"
        " PRIMARY KEY (parent, child)) WITHOUT ROWID",
        "CREATE INDEX children_retention ON children (retain_until_ms)",
    ),
    2: ("ALTER TABLE consumed_nonces ADD COLUMN request_id TEXT NOT NULL DEFAULT ''",),
    # The fan-out check reads a parent's count instead of counting its children (as many rows as
    # it has children within retention); triggers keep the count with the rows it counts.
    3: (
        "CREATE TABLE child_counts (parent TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID",
        "INSERT INTO child_counts (parent, count) SELECT parent, COUNT(*) FROM children GROUP BY parent",
        "CREATE TRIGGER children_counted AFTER INSERT ON children BEGIN"
        " INSERT INTO child_counts (parent, count) VALUES (NEW.parent, 1)"
        " ON CONFLICT (parent) DO UPDATE SET count = count + 1; END",
        "CREATE TRIGGER children_uncounted AFTER DELETE ON children BEGIN"
        " UPDATE child_counts SET count = count - 1 WHERE parent = OLD.parent;"
        " DELETE FROM child_counts WHERE parent = OLD.parent AND count <= 0; END",
    ),
}


class SqliteState:
    """:class:`countersign.state.VerifierState` in one SQLite file."""

    def __init__(self, path: str | Path, *, busy_timeout_ms: int = 5_000) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            self._db = open_sqlite(self.path, busy_timeout_ms=busy_timeout_ms)
            self._migrate()
        except sqlite3.Error as exc:
            raise StateUnavailable(f"cannot open SQLite state {self.path}: {exc}") from exc

    def _migrate(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (version,) = self._db.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise StateUnavailable(f"{self.path} has schema version {version}, newer than this software")
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {step}")
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | None:
        with self._lock:
            try:
                return self._admit(edges, leaf, consume)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    def _admit(self, edges: Sequence[ChildEdge], leaf: LeafNonce, consume: bool) -> StateRejection | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE" if consume else "BEGIN")
        for edge in edges:
            known = db.execute(
                "SELECT 1 FROM children WHERE parent = ? AND child = ?", (edge.parent_digest, edge.child_nonce)
            ).fetchone()
            if known is not None:
                continue
            row = db.execute("SELECT count FROM child_counts WHERE parent = ?", (edge.parent_digest,)).fetchone()
            if (0 if row is None else row[0]) >= edge.max_children:
                db.execute("ROLLBACK")
                return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            if consume:
                db.execute(
                    "INSERT INTO children (parent, child, retain_until_ms) VALUES (?, ?, ?)",
                    (edge.parent_digest, edge.child_nonce, edge.retain_until_ms),
                )
        if not consume:
            db.execute("ROLLBACK")
            return None
        inserted = db.execute(
            "INSERT INTO consumed_nonces (nonce, retain_until_ms, request_id) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (leaf.nonce, leaf.retain_until_ms, leaf.request_id),
        ).rowcount
        same_request = False
        if inserted != 1 and leaf.request_id:
            row = db.execute("SELECT request_id FROM consumed_nonces WHERE nonce = ?", (leaf.nonce,)).fetchone()
            same_request = row is not None and row[0] == leaf.request_id
        db.execute("COMMIT")
        return None if inserted == 1 or same_request else StateRejection(Reason.NONCE_REPLAYED, leaf.index)

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        with self._lock:
            try:
                removed = self._db.execute(
                    "DELETE FROM consumed_nonces WHERE nonce IN"
                    " (SELECT nonce FROM consumed_nonces WHERE retain_until_ms < ? LIMIT ?)",
                    (now_ms, limit),
                ).rowcount
                removed += self._db.execute(
                    "DELETE FROM children WHERE (parent, child) IN"
                    " (SELECT parent, child FROM children WHERE retain_until_ms < ? LIMIT ?)",
                    (now_ms, limit - removed),
                ).rowcount
                return int(removed)
            except sqlite3.Error as exc:
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    def entry_count(self) -> int:
        with self._lock:
            (nonces,) = self._db.execute("SELECT COUNT(*) FROM consumed_nonces").fetchone()
            (children,) = self._db.execute("SELECT COUNT(*) FROM children").fetchone()
            return int(nonces) + int(children)

    def close(self) -> None:
        with self._lock:
            self._db.close()
