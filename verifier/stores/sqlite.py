"""SQLite verifier state: the embedded default, for one verifier (or several processes on one host).

WAL journal; every :meth:`admit` is one ``BEGIN IMMEDIATE`` transaction, so concurrent verifiers
sharing the file serialise on SQLite's write lock and a nonce is consumed at most once. The verdict
log (schema version 6, issue 29) stores what repeats once per client identity: ``verdict_log`` rows
name their path by digest, ``verdict_paths`` holds each path once and ``verdict_path_uses`` its index
entries by key id, record digest and deployer (verifier/stores/verdict_rows.py).
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
    ClientUsage,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    StateRejection,
    VerdictEntry,
    bounded_cause,
    check_session_leaves,
    first_repeated_leaf,
    records_from_json,
    trim_by_share,
)
from verifier.stores.verdict_rows import (
    LEGACY_SIGNATURE_COLUMNS,
    LEGACY_VERDICT_COLUMNS,
    PATH_COLUMNS,
    USE_COLUMNS,
    VERDICT_COLUMNS,
    PathReader,
    chunks,
    entry_from_row,
    kind_code,
    legacy_entries,
    marked_row,
    path_row,
    use_rows,
    verdict_row,
)

SCHEMA_VERSION = 6
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
    # Issue 29: what repeats stored once per client (verifier/stores/verdict_rows.py). The verdicts of
    # versions 4-5 move over (``_move_legacy_verdicts``), then their tables go.
    6: (
        "CREATE TABLE verdict_log (verdict_id TEXT NOT NULL UNIQUE, time_ms INTEGER NOT NULL, mode TEXT NOT NULL,"
        " client TEXT NOT NULL, request_id TEXT NOT NULL, registry_sequence INTEGER NOT NULL,"
        " verdict TEXT NOT NULL, reason TEXT NOT NULL, path_digest BLOB, retain_until_ms INTEGER NOT NULL,"
        " needs_revalidation INTEGER NOT NULL DEFAULT 0, revalidation_cause TEXT NOT NULL DEFAULT '',"
        " bytes INTEGER NOT NULL, marked_ms INTEGER)",
        "CREATE INDEX verdict_log_by_path ON verdict_log (client, path_digest, time_ms)",
        "CREATE INDEX verdict_log_by_client ON verdict_log (client, time_ms, verdict_id)",
        "CREATE INDEX verdict_log_retention ON verdict_log (retain_until_ms)",
        "CREATE TABLE verdict_paths (client TEXT NOT NULL, path_digest BLOB NOT NULL, construction TEXT NOT NULL,"
        " records TEXT NOT NULL, bytes INTEGER NOT NULL, PRIMARY KEY (client, path_digest)) WITHOUT ROWID",
        "CREATE TABLE verdict_path_uses (kind TEXT NOT NULL, value TEXT NOT NULL, client TEXT NOT NULL,"
        " path_digest BLOB NOT NULL, PRIMARY KEY (kind, value, client, path_digest)) WITHOUT ROWID",
        "MOVE LEGACY VERDICTS",
        "DROP TABLE verdict_signatures",
        "DROP TABLE verdicts",
    ),
}
_MOVE_LEGACY = "MOVE LEGACY VERDICTS"

_SQLITE_MAX_VARIABLES = 500  # well under SQLITE_MAX_VARIABLE_NUMBER in any build
_INSERT_VERDICT = f"INSERT INTO verdict_log ({VERDICT_COLUMNS}) VALUES ({','.join('?' * 13)})"  # noqa: S608
_INSERT_PATH = f"INSERT INTO verdict_paths ({PATH_COLUMNS}) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"  # noqa: S608
_INSERT_USE = f"INSERT INTO verdict_path_uses ({USE_COLUMNS}) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"  # noqa: S608
_SELECT_ENTRY = (
    f"SELECT {', '.join('v.' + c.strip() for c in VERDICT_COLUMNS.split(','))}, p.construction, p.records"  # noqa: S608
    " FROM verdict_log AS v LEFT JOIN verdict_paths AS p ON p.client = v.client AND p.path_digest = v.path_digest"
)


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
                    if statement == _MOVE_LEGACY:
                        self._move_legacy_verdicts()
                    else:
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
                    self._db.execute("BEGIN IMMEDIATE")
                    expired = self._db.execute(
                        "SELECT rowid, client, path_digest, bytes FROM verdict_log WHERE retain_until_ms < ? LIMIT ?",
                        (now_ms, limit - removed),
                    ).fetchall()
                    removed += self._forget_verdicts(expired).rows
                    self._db.execute("COMMIT")
                return int(removed)
            except sqlite3.Error as exc:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path}: {exc}") from exc

    def _forget_verdicts(self, rows: Sequence[Any]) -> ClientUsage:
        """Delete these ``verdict_log`` rows (rowid, client, path digest, bytes), and each path with the
        last of its client's verdicts on it; inside the caller's transaction. Returns what went."""
        db = self._db
        removed = freed = 0
        for chunk in chunks([row[0] for row in rows], _SQLITE_MAX_VARIABLES):
            marks = ",".join("?" * len(chunk))
            removed += db.execute(f"DELETE FROM verdict_log WHERE rowid IN ({marks})", chunk).rowcount  # noqa: S608
        freed += sum(int(row[3]) for row in rows)
        for client, digest in dict.fromkeys((row[1], row[2]) for row in rows if row[2] is not None):
            if db.execute(
                "SELECT 1 FROM verdict_log WHERE client = ? AND path_digest = ? LIMIT 1", (client, digest)
            ).fetchone():
                continue
            path = db.execute(
                "SELECT records, bytes FROM verdict_paths WHERE client = ? AND path_digest = ?", (client, digest)
            ).fetchone()
            if path is None:
                continue
            db.executemany(
                "DELETE FROM verdict_path_uses WHERE kind = ? AND value = ? AND client = ? AND path_digest = ?",
                use_rows(client, digest, records_from_json(path[0])),
            )
            db.execute("DELETE FROM verdict_paths WHERE client = ? AND path_digest = ?", (client, digest))
            freed += int(path[1])
        return ClientUsage(removed, freed)

    # --- the verdict log ---------------------------------------------------------------------

    def record_verdict(self, entry: VerdictEntry) -> None:
        self.record_verdicts([entry])

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                self._insert_verdicts(entries)
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (record verdict): {exc}") from exc

    def _insert_verdicts(self, entries: Sequence[VerdictEntry], *, rows: Sequence[Any] | None = None) -> None:
        """Insert ``entries`` (their ``rows`` if given: the migration keeps marks) with their paths,
        inside the caller's transaction. A path already held for the client adds nothing."""
        db = self._db
        for index, entry in enumerate(entries):
            path = path_row(entry)
            if path is not None and db.execute(_INSERT_PATH, path).rowcount == 1:
                db.executemany(_INSERT_USE, use_rows(entry.client, path[1], entry.records))
            db.execute(_INSERT_VERDICT, verdict_row(entry) if rows is None else rows[index])

    def _move_legacy_verdicts(self) -> None:
        """Migration 6: the verdicts of schema 4-5 into the new tables, marks kept, in batches."""
        db = self._db
        last = ""
        while True:
            batch = db.execute(
                f"SELECT {LEGACY_VERDICT_COLUMNS} FROM verdicts WHERE verdict_id > ? ORDER BY verdict_id LIMIT 500",  # noqa: S608
                (last,),
            ).fetchall()
            if not batch:
                return
            ids = [row[0] for row in batch]
            signatures = db.execute(
                f"SELECT {LEGACY_SIGNATURE_COLUMNS} FROM verdict_signatures"  # noqa: S608
                f" WHERE verdict_id IN ({','.join('?' * len(ids))})",
                ids,
            ).fetchall()
            entries = legacy_entries(batch, signatures)
            rows = [marked_row(e) for e in entries]
            self._insert_verdicts(entries, rows=rows)
            last = max(ids)

    def accepts_relying_on(
        self,
        kind: DependencyKind,
        values: Sequence[str],
        *,
        since_ms: int = 0,
        limit: int = MAX_LOOKUP_VERDICTS,
        client: str | None = None,
    ) -> list[VerdictEntry]:
        code = kind_code(kind.value)
        mine = "" if client is None else " AND client = ?"
        with self._lock:
            try:
                rows: dict[str, Any] = {}
                for chunk in chunks(list(dict.fromkeys(values)), _SQLITE_MAX_VARIABLES):
                    found = self._db.execute(
                        f"{_SELECT_ENTRY} WHERE v.verdict = 'ACCEPT' AND v.time_ms >= ?"  # noqa: S608
                        " AND (v.client, v.path_digest) IN (SELECT client, path_digest FROM verdict_path_uses"
                        f" WHERE kind = ? AND value IN ({','.join('?' * len(chunk))}){mine})"
                        " ORDER BY v.time_ms, v.verdict_id LIMIT ?",
                        (since_ms, code, *chunk, *(() if client is None else (client,)), limit),
                    )
                    rows.update((row[0], row) for row in found)
            except sqlite3.Error as exc:
                raise StateUnavailable(f"SQLite state {self.path} (verdict lookup): {exc}") from exc
        read = PathReader()
        ordered = sorted(rows.values(), key=lambda row: (row[1], row[0]))[:limit]
        return [entry_from_row(row, row[13], read(row[14])) for row in ordered]

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                marked = 0
                for chunk in chunks(list(dict.fromkeys(v.verdict_id for v in verdicts)), _SQLITE_MAX_VARIABLES):
                    marked += db.execute(
                        "UPDATE verdict_log SET needs_revalidation = 1, revalidation_cause = ?, marked_ms = ?"  # noqa: S608
                        f" WHERE verdict_id IN ({','.join('?' * len(chunk))}) AND needs_revalidation = 0",
                        (bounded_cause(cause), now_ms, *chunk),
                    ).rowcount
                db.execute("COMMIT")
                return marked
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (mark verdicts): {exc}") from exc

    def _usage(self) -> dict[str, ClientUsage]:
        usage = {
            str(client): ClientUsage(int(rows), int(size))
            for client, rows, size in self._db.execute(
                "SELECT client, count(*), sum(bytes) FROM verdict_log GROUP BY client"
            )
        }
        for client, size in self._db.execute("SELECT client, sum(bytes) FROM verdict_paths GROUP BY client"):
            held = usage.get(str(client), ClientUsage(0, 0))
            usage[str(client)] = ClientUsage(held.rows, held.bytes + int(size))
        return usage

    def verdict_usage(self) -> dict[str, ClientUsage]:
        with self._lock:
            try:
                return self._usage()
            except sqlite3.Error as exc:
                raise StateUnavailable(f"SQLite state {self.path} (verdict usage): {exc}") from exc

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000, *, max_bytes: int | None = None) -> int:
        db = self._db

        def forget_oldest(client: str, count: int) -> ClientUsage:
            db.execute("BEGIN IMMEDIATE")
            oldest = db.execute(
                "SELECT rowid, client, path_digest, bytes FROM verdict_log WHERE client = ?"
                " ORDER BY time_ms, verdict_id LIMIT ?",
                (client, count),
            ).fetchall()
            gone = self._forget_verdicts(oldest)
            db.execute("COMMIT")
            return gone

        with self._lock:
            try:
                return trim_by_share(self._usage(), max_rows, max_bytes, limit, forget_oldest)
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StateUnavailable(f"SQLite state {self.path} (trim verdicts): {exc}") from exc

    def verdict_count(self) -> int:
        with self._lock:
            try:
                (held,) = self._db.execute("SELECT COUNT(*) FROM verdict_log").fetchone()
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
