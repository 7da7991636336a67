"""SQLite verifier state: the embedded default, for one verifier (or several processes on one host).

WAL journal; every :meth:`admit` is one ``BEGIN IMMEDIATE`` transaction, so concurrent verifiers
sharing the file serialise on SQLite's write lock and a nonce is consumed at most once. The verdict
log (schema version 4) is a ``verdicts`` table and its child ``verdict_signatures`` (one row per
signature a verdict's records carry), indexed by key id, record digest and deployer, each with the
verdict's time, so "which verdicts relied on K since T" reads one index range.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from countersign._daemon.sqlite import open_sqlite
from countersign.errors import StateUnavailable
from countersign.reasons import Reason
from countersign.state import (
    MAX_LOOKUP_VERDICTS,
    MAX_SESSION_LEAVES,
    ChildEdge,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    StateRejection,
    VerdictEntry,
    check_session_leaves,
    first_repeated_leaf,
)
from verifier.stores.verdict_rows import (
    LOOKUP_COLUMN,
    SIGNATURE_COLUMNS,
    VERDICT_COLUMNS,
    chunks,
    entries_from_rows,
    signature_rows,
    verdict_row,
)

SCHEMA_VERSION = 5
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
    # The verdict log. One row per verdict, one per signature its records carry ("signer" for the
    # issuer's, "parent"/"child" for co-signatures); the row's time is the verdict's, so an index on
    # (key_id, time_ms) answers "relied on K since T" without touching the verdicts table first.
    4: (
        "CREATE TABLE verdicts (verdict_id TEXT PRIMARY KEY, time_ms INTEGER NOT NULL, mode TEXT NOT NULL,"
        " client TEXT NOT NULL, request_id TEXT NOT NULL, registry_sequence INTEGER NOT NULL,"
        " verdict TEXT NOT NULL, reason TEXT NOT NULL, construction TEXT NOT NULL,"
        " retain_until_ms INTEGER NOT NULL, needs_revalidation INTEGER NOT NULL DEFAULT 0,"
        " revalidation_cause TEXT NOT NULL DEFAULT '', marked_ms INTEGER) WITHOUT ROWID",
        "CREATE INDEX verdicts_by_time ON verdicts (time_ms, verdict_id)",
        "CREATE INDEX verdicts_retention ON verdicts (retain_until_ms)",
        "CREATE TABLE verdict_signatures (verdict_id TEXT NOT NULL, position INTEGER NOT NULL,"
        " role TEXT NOT NULL, record_digest TEXT NOT NULL, deployer TEXT NOT NULL, key_id TEXT NOT NULL,"
        " created_ms INTEGER NOT NULL, time_ms INTEGER NOT NULL,"
        " PRIMARY KEY (verdict_id, position, role)) WITHOUT ROWID",
        "CREATE INDEX verdict_signatures_by_key ON verdict_signatures (key_id, time_ms)",
        "CREATE INDEX verdict_signatures_by_record ON verdict_signatures (record_digest, time_ms)",
        "CREATE INDEX verdict_signatures_by_deployer ON verdict_signatures (deployer, time_ms)",
    ),
    # When each nonce was consumed, so that a retry's answer names the acceptance it repeats (0 for
    # nonces consumed before this column existed).
    5: ("ALTER TABLE consumed_nonces ADD COLUMN accepted_ms INTEGER NOT NULL DEFAULT 0",),
}

_SQLITE_MAX_VARIABLES = 500  # well under SQLITE_MAX_VARIABLE_NUMBER in any build
_INSERT_VERDICT = f"INSERT INTO verdicts ({VERDICT_COLUMNS}) VALUES ({','.join('?' * 12)})"  # noqa: S608
_INSERT_SIGNATURE = f"INSERT INTO verdict_signatures ({SIGNATURE_COLUMNS}) VALUES ({','.join('?' * 8)})"  # noqa: S608


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
    ) -> StateRejection | EarlierAcceptance | None:
        with self._lock:
            try:
                return self._admit(edges, leaf, consume, now_ms)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    def _admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
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
            "INSERT INTO consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (leaf.nonce, leaf.retain_until_ms, leaf.request_id, now_ms),
        ).rowcount
        earlier: EarlierAcceptance | None = None
        if inserted != 1 and leaf.request_id:
            row = db.execute(
                "SELECT request_id, accepted_ms FROM consumed_nonces WHERE nonce = ?", (leaf.nonce,)
            ).fetchone()
            if row is not None and row[0] == leaf.request_id:
                earlier = EarlierAcceptance(int(row[1]))
        db.execute("COMMIT")
        if inserted == 1:
            return None
        return earlier if earlier is not None else StateRejection(Reason.NONCE_REPLAYED, leaf.index)

    def admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        """One ``BEGIN IMMEDIATE`` transaction: the edges, then every nonce; a nonce already consumed
        rolls the whole transaction back, so the session consumes nothing."""
        check_session_leaves(leaves, self.max_session_leaves if consume else MAX_SESSION_LEAVES)
        with self._lock:
            try:
                return self._admit_session(edges, leaves, consume, now_ms)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    @property
    def max_session_leaves(self) -> int:
        return MAX_SESSION_LEAVES

    def _admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE" if consume else "BEGIN")
        new_children: list[ChildEdge] = []
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
            new_children.append(edge)
        if not consume:
            db.execute("ROLLBACK")
            return None
        replayed = first_repeated_leaf(leaves)
        earlier: list[int] = []  # the acceptance times of leaves consumed before under this request id
        for start in range(0, len(leaves), _SQLITE_MAX_VARIABLES):
            batch = leaves[start : start + _SQLITE_MAX_VARIABLES]
            placeholders = ",".join("?" * len(batch))
            consumed = {
                nonce: (request_id, accepted_ms)
                for nonce, request_id, accepted_ms in db.execute(
                    f"SELECT nonce, request_id, accepted_ms FROM consumed_nonces WHERE nonce IN ({placeholders})",  # noqa: S608
                    [leaf.nonce for leaf in batch],
                ).fetchall()
            }
            for leaf in batch:
                if leaf.nonce not in consumed:
                    continue
                request_id, accepted_ms = consumed[leaf.nonce]
                if not (leaf.request_id and request_id == leaf.request_id):
                    replayed = leaf.index if replayed is None else min(replayed, leaf.index)
                    break
                earlier.append(accepted_ms)
        if replayed is not None:
            db.execute("ROLLBACK")
            return StateRejection(Reason.NONCE_REPLAYED, replayed)
        db.executemany(
            "INSERT INTO children (parent, child, retain_until_ms) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            [(e.parent_digest, e.child_nonce, e.retain_until_ms) for e in new_children],
        )
        db.executemany(
            "INSERT INTO consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            [(leaf.nonce, leaf.retain_until_ms, leaf.request_id, now_ms) for leaf in leaves],
        )
        db.execute("COMMIT")
        return EarlierAcceptance(max(earlier)) if len(earlier) == len(leaves) else None

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
                if removed < limit:
                    expired = self._db.execute(
                        "SELECT verdict_id FROM verdicts WHERE retain_until_ms < ? LIMIT ?", (now_ms, limit - removed)
                    ).fetchall()
                    removed += self._forget_verdicts([row[0] for row in expired])
                return int(removed)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    def _forget_verdicts(self, verdict_ids: Sequence[str]) -> int:
        """Delete verdicts with their signature rows, in one transaction; return how many went."""
        if not verdict_ids:
            return 0
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        removed = 0
        for chunk in chunks(verdict_ids, _SQLITE_MAX_VARIABLES):
            marks = ",".join("?" * len(chunk))
            db.execute(f"DELETE FROM verdict_signatures WHERE verdict_id IN ({marks})", chunk)  # noqa: S608
            removed += db.execute(f"DELETE FROM verdicts WHERE verdict_id IN ({marks})", chunk).rowcount  # noqa: S608
        db.execute("COMMIT")
        return removed

    # --- the verdict log ---------------------------------------------------------------------

    def record_verdict(self, entry: VerdictEntry) -> None:
        self.record_verdicts([entry])

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                db.executemany(_INSERT_VERDICT, [verdict_row(entry) for entry in entries])
                db.executemany(_INSERT_SIGNATURE, [row for entry in entries for row in signature_rows(entry)])
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (record verdict): {exc}") from exc

    def accepts_relying_on(
        self, kind: DependencyKind, values: Sequence[str], *, since_ms: int = 0, limit: int = MAX_LOOKUP_VERDICTS
    ) -> list[VerdictEntry]:
        column = LOOKUP_COLUMN[kind]
        with self._lock:
            try:
                ids: set[str] = set()
                for chunk in chunks(list(dict.fromkeys(values)), _SQLITE_MAX_VARIABLES):
                    rows = self._db.execute(
                        f"SELECT DISTINCT verdict_id FROM verdict_signatures"  # noqa: S608
                        f" WHERE {column} IN ({','.join('?' * len(chunk))}) AND time_ms >= ?",
                        (*chunk, since_ms),
                    )
                    ids.update(row[0] for row in rows)
                return self._accepted_entries(sorted(ids), limit)
            except sqlite3.Error as exc:
                raise StateUnavailable(f"SQLite state {self.path} (verdict lookup): {exc}") from exc

    def _accepted_entries(self, verdict_ids: Sequence[str], limit: int) -> list[VerdictEntry]:
        verdicts: list[Any] = []
        for chunk in chunks(verdict_ids, _SQLITE_MAX_VARIABLES):
            verdicts += self._db.execute(
                f"SELECT {VERDICT_COLUMNS} FROM verdicts"  # noqa: S608
                f" WHERE verdict_id IN ({','.join('?' * len(chunk))}) AND verdict = 'ACCEPT'",
                chunk,
            ).fetchall()
        verdicts = sorted(verdicts, key=lambda row: (row[1], row[0]))[:limit]
        signatures: list[Any] = []
        for chunk in chunks([row[0] for row in verdicts], _SQLITE_MAX_VARIABLES):
            signatures += self._db.execute(
                "SELECT verdict_id, position, role, record_digest, deployer, key_id, created_ms"  # noqa: S608
                f" FROM verdict_signatures WHERE verdict_id IN ({','.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
        return entries_from_rows(verdicts, signatures)

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                marked = 0
                for chunk in chunks(list(dict.fromkeys(v.verdict_id for v in verdicts)), _SQLITE_MAX_VARIABLES):
                    marked += db.execute(
                        "UPDATE verdicts SET needs_revalidation = 1, revalidation_cause = ?, marked_ms = ?"  # noqa: S608
                        f" WHERE verdict_id IN ({','.join('?' * len(chunk))}) AND needs_revalidation = 0",
                        (cause, now_ms, *chunk),
                    ).rowcount
                db.execute("COMMIT")
                return marked
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (mark verdicts): {exc}") from exc

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000) -> int:
        with self._lock:
            try:
                (held,) = self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()
                excess = min(int(held) - max_rows, limit)
                if excess <= 0:
                    return 0
                oldest = self._db.execute(
                    "SELECT verdict_id FROM verdicts ORDER BY time_ms, verdict_id LIMIT ?", (excess,)
                ).fetchall()
                return self._forget_verdicts([row[0] for row in oldest])
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (trim verdicts): {exc}") from exc

    def verdict_count(self) -> int:
        with self._lock:
            try:
                (held,) = self._db.execute("SELECT COUNT(*) FROM verdicts").fetchone()
            except sqlite3.Error as exc:
                raise StateUnavailable(f"SQLite state {self.path} (verdict count): {exc}") from exc
            return int(held)

    def entry_count(self) -> int:
        with self._lock:
            (nonces,) = self._db.execute("SELECT COUNT(*) FROM consumed_nonces").fetchone()
            (children,) = self._db.execute("SELECT COUNT(*) FROM children").fetchone()
            return int(nonces) + int(children)

    def close(self) -> None:
        with self._lock:
            self._db.close()
