"""``sqlite:///path``: the signer's state in one SQLite file (WAL, ``synchronous=FULL``).

Replicas on one host may share the file: a write holds SQLite's write lock (``BEGIN IMMEDIATE``) while
it checks its conditions and applies, so two processes cannot both spend one grant, slot or ``seq``.
A batch of writes (the signer's group commit) is one transaction and one flush.

A file an earlier release wrote opens with every row it holds: tables it made WITHOUT ROWID that hold
whole paths are rebuilt as rowid tables, children it counted by trigger keep their counts, and rows that
had no expiry of their own take their record's (``PRAGMA user_version`` 2).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from countersign._daemon.sqlite import open_sqlite
from countersign.errors import ConfigError, StateUnavailable
from countersign.records import StreamUnit
from countersign.signer_state import (
    COLLECTED_TABLES,
    Proposal,
    RequestRecord,
    SessionState,
    StateReads,
    StateView,
    StateWrite,
    StoredGrant,
)

LAYOUT_VERSION = 2
# ``issued``, ``proposals`` and ``requests`` hold whole paths (kilobytes a row), so they are ordinary
# rowid tables: SQLite's guidance keeps WITHOUT ROWID for rows under about a twentieth of a page.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS issued (digest TEXT PRIMARY KEY, path BLOB NOT NULL, expires_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS children (parent TEXT NOT NULL, child_nonce TEXT NOT NULL,"
    " PRIMARY KEY (parent, child_nonce)) WITHOUT ROWID",
    # How many rows ``children`` holds per parent: the fan-out check reads one row, not a count.
    "CREATE TABLE IF NOT EXISTS child_counts (parent TEXT PRIMARY KEY, count INTEGER NOT NULL,"
    " expires_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS grants (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_deployer TEXT NOT NULL,"
    " expires_ms INTEGER NOT NULL, manifest_digest TEXT, parent_cosig TEXT) WITHOUT ROWID",
    # Sessions as an earlier release kept them (by session id alone): read only, so that a session
    # continued after an upgrade does not reuse a seq.
    "CREATE TABLE IF NOT EXISTS sessions (session TEXT PRIMARY KEY, seq INTEGER NOT NULL, last_digest TEXT NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS agent_sessions (agent TEXT NOT NULL, session TEXT NOT NULL, seq INTEGER NOT NULL,"
    " last_digest TEXT NOT NULL, closed INTEGER NOT NULL, stream_unit TEXT, stream_n INTEGER,"
    " expires_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (agent, session)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS proposals (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_record BLOB NOT NULL,"
    " child_cosig TEXT NOT NULL, expires_ms INTEGER NOT NULL, sealed_path BLOB)",
    "CREATE TABLE IF NOT EXISTS requests (request_id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,"
    " answer BLOB NOT NULL, expires_ms INTEGER NOT NULL, record TEXT NOT NULL DEFAULT '')",
)
# What the collector finds expired rows by; made after the columns exist (an old file gains some).
INDEXES = (
    "CREATE INDEX IF NOT EXISTS issued_expiry ON issued (expires_ms)",
    "CREATE INDEX IF NOT EXISTS child_counts_expiry ON child_counts (expires_ms)",
    "CREATE INDEX IF NOT EXISTS agent_sessions_expiry ON agent_sessions (expires_ms)",
    "CREATE INDEX IF NOT EXISTS grants_expiry ON grants (expires_ms)",
    "CREATE INDEX IF NOT EXISTS proposals_expiry ON proposals (expires_ms)",
    "CREATE INDEX IF NOT EXISTS requests_expiry ON requests (expires_ms)",
)
# Tables an earlier release made WITHOUT ROWID, rebuilt as rowid tables on open: their columns, and
# the indexes that go with the old table and are made again by INDEXES.
_REBUILT_AS_ROWID = {
    "issued": ("digest, path, expires_ms", ("issued_expiry",)),
    "proposals": ("grant_id, parent, child_record, child_cosig, expires_ms, sealed_path", ("proposals_expiry",)),
}
# The tables collected row by row, by their keys (some are WITHOUT ROWID).
_KEYS = {"issued": "digest", "agent_sessions": "agent, session", "grants": "grant_id", "proposals": "grant_id",
         "requests": "request_id"}  # fmt: skip
# Columns an earlier release's tables lack; filled from the record they belong to.
_ADDED_EXPIRY = {"child_counts": "parent", "agent_sessions": "agent"}


class SqliteState:
    batches = True

    def __init__(self, path: str, *, busy_timeout_ms: int = 5_000) -> None:
        self._path, self._busy_timeout_ms = path, busy_timeout_ms
        self._lock = threading.Lock()  # the writing connection: one batch at a time
        # Reads go through a connection per thread: in WAL mode they never wait for a batch being
        # committed (its flush), so a call reads while the previous batch is made durable.
        self._readers = threading.local()
        self._reader_connections: list[sqlite3.Connection] = []
        try:
            self._db = open_sqlite(path, busy_timeout_ms=busy_timeout_ms)
            self._migrate()
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open signer state {path}: {exc}") from None

    # --- layout ------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        """Create what is missing and bring an earlier release's file to this layout, in one transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if int(db.execute("PRAGMA user_version").fetchone()[0]) < LAYOUT_VERSION:
                self._upgrade()
            else:
                for statement in (*SCHEMA, *INDEXES):
                    db.execute(statement)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _upgrade(self) -> None:
        db = self._db
        had_counts = self._table_sql("child_counts") is not None
        rebuilt = [table for table in _REBUILT_AS_ROWID if "WITHOUT ROWID" in (self._table_sql(table) or "").upper()]
        for table in rebuilt:
            for index in _REBUILT_AS_ROWID[table][1]:
                db.execute(f"DROP INDEX IF EXISTS {index}")
            db.execute(f"ALTER TABLE {table} RENAME TO {table}_without_rowid")
        for statement in SCHEMA:
            db.execute(statement)
        for table in rebuilt:  # names and columns from the constant above, not from input
            columns = _REBUILT_AS_ROWID[table][0]
            db.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_without_rowid")  # noqa: S608
            db.execute(f"DROP TABLE {table}_without_rowid")
        # Counts are kept by the writes now, not by the earlier release's trigger.
        db.execute("DROP TRIGGER IF EXISTS children_counted")
        if not had_counts:  # a file from before the counts: count its children once
            db.execute("INSERT INTO child_counts (parent, count) SELECT parent, COUNT(*) FROM children GROUP BY parent")
        for table, owner in _ADDED_EXPIRY.items():
            present = {str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")}
            if "expires_ms" not in present:
                db.execute(f"ALTER TABLE {table} ADD COLUMN expires_ms INTEGER NOT NULL DEFAULT 0")
            # A row without an expiry of its own lives as long as its record (0 if that is gone).
            db.execute(
                f"UPDATE {table} SET expires_ms = coalesce("  # noqa: S608 (constant names)
                f"(SELECT expires_ms FROM issued WHERE digest = {table}.{owner}), 0) WHERE expires_ms = 0"
            )
        for statement in INDEXES:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")

    def _table_sql(self, table: str) -> str | None:
        row = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        return None if row is None else str(row[0])

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StateUnavailable(f"signer state: {exc}") from exc

    # --- the contract --------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        reader: sqlite3.Connection | None = getattr(self._readers, "db", None)
        if reader is None:
            reader = self._readers.db = open_sqlite(self._path, busy_timeout_ms=self._busy_timeout_ms)
            with self._lock:
                self._reader_connections.append(reader)
        return reader

    def read(self, reads: StateReads) -> StateView:
        try:
            return _read(self._reader(), reads)
        except sqlite3.Error as exc:
            raise StateUnavailable(f"signer state: {exc}") from exc

    def apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        with self._transaction() as db:
            return [_apply(db, write) for write in writes]

    def collect_expired(self, cutoff_ms: int, limit: int) -> dict[str, int]:
        """At most ``limit`` expired rows of each table in one short transaction (the store lock is held
        for one batch at a time); a parent's child rows go with its count row, whole."""
        removed: dict[str, int] = {}
        with self._transaction() as db:
            parents = [
                (str(row[0]),)
                for row in db.execute(
                    "SELECT parent FROM child_counts WHERE expires_ms < ? LIMIT ?", (cutoff_ms, limit)
                )
            ]
            removed["children"] = db.executemany("DELETE FROM children WHERE parent = ?", parents).rowcount
            removed["child_counts"] = db.executemany("DELETE FROM child_counts WHERE parent = ?", parents).rowcount
            for table, key in _KEYS.items():
                removed[table] = db.execute(
                    f"DELETE FROM {table} WHERE ({key}) IN"  # noqa: S608 (constant names)
                    f" (SELECT {key} FROM {table} WHERE expires_ms < ? LIMIT ?)",
                    (cutoff_ms, limit),
                ).rowcount
        return {table: removed[table] for table in COLLECTED_TABLES}

    def row_counts(self) -> dict[str, int] | None:
        with self._lock:
            return {
                table: int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # noqa: S608
                for table in COLLECTED_TABLES
            }

    def close(self) -> None:
        with self._lock:
            for reader in self._reader_connections:
                reader.close()
            self._db.close()


# Everything one call reads, in one statement (one snapshot); a column is NULL where nothing is
# stored or nothing was asked (a NULL key matches no row).
_READ = (
    "SELECT (SELECT path FROM issued WHERE digest = ?), (SELECT count FROM child_counts WHERE parent = ?),"
    " s.seq, s.last_digest, s.closed, s.stream_unit, s.stream_n,"
    " g.parent, g.child_deployer, g.expires_ms, g.manifest_digest, g.parent_cosig,"
    " p.parent, p.child_record, p.child_cosig, p.expires_ms, p.sealed_path,"
    " r.fingerprint, r.answer, r.expires_ms, r.record"
    " FROM (SELECT 1) LEFT JOIN agent_sessions s ON s.agent = ? AND s.session = ?"
    " LEFT JOIN grants g ON g.grant_id = ? LEFT JOIN proposals p ON p.grant_id = ?"
    " LEFT JOIN requests r ON r.request_id = ?"
)


def _read(db: sqlite3.Connection, reads: StateReads) -> StateView:
    agent, name = reads.session or (None, None)
    (issued, child_count, s_seq, s_last, s_closed, s_unit, s_n, g_parent, g_child, g_expires, g_manifest, g_cosig,
     p_parent, p_record, p_cosig, p_expires, p_sealed, r_fingerprint, r_answer, r_expires, r_record) = db.execute(
        _READ, (reads.issued, reads.children_of, agent, name, reads.grant, reads.proposal, reads.request)
    ).fetchone()  # fmt: skip
    session = grant = proposal = request = None
    if agent is not None and name is not None:
        if s_seq is not None:
            stream = None if s_unit is None else (StreamUnit(s_unit), int(s_n))
            session = SessionState(name, agent, int(s_seq), str(s_last), bool(s_closed), stream)
        else:
            session = _legacy_session(db, name)
    if reads.grant is not None and g_parent is not None:
        grant = StoredGrant(reads.grant, str(g_parent), str(g_child), int(g_expires), g_manifest, g_cosig)
    if reads.proposal is not None and p_parent is not None:
        sealed = None if p_sealed is None else bytes(p_sealed)
        proposal = Proposal(reads.proposal, str(p_parent), bytes(p_record), str(p_cosig), int(p_expires), sealed)
    if reads.request is not None and r_fingerprint is not None:
        request = RequestRecord(reads.request, str(r_fingerprint), bytes(r_answer), int(r_expires), str(r_record))
    return StateView(
        None if issued is None else bytes(issued), int(child_count or 0), session, grant, proposal, request
    )


def _legacy_session(db: sqlite3.Connection, session: str) -> SessionState | None:
    """A session an earlier release kept by id alone: its last receipt, with no agent, so that
    continuing it reuses no seq."""
    legacy = db.execute("SELECT seq, last_digest FROM sessions WHERE session = ?", (session,)).fetchone()
    return None if legacy is None else SessionState(session, None, int(legacy[0]), str(legacy[1]))


def _holds(db: sqlite3.Connection, write: StateWrite) -> bool:
    """Every condition of ``write`` (the write lock is held: nothing changes until the transaction ends)."""
    child = write.child
    if child is not None:
        row = db.execute("SELECT count FROM child_counts WHERE parent = ?", (child.parent,)).fetchone()
        known = db.execute(
            "SELECT 1 FROM children WHERE parent = ? AND child_nonce = ?", (child.parent, child.nonce)
        ).fetchone()
        if known is not None or (0 if row is None else int(row[0])) >= child.max_children:
            return False
    update = write.session
    if update is not None:
        row = db.execute(
            "SELECT seq FROM agent_sessions WHERE agent = ? AND session = ?", (update.state.agent, update.state.session)
        ).fetchone()
        if (None if row is None else int(row[0])) != update.previous_seq:
            return False
    if write.new_grant is not None and _exists(db, "grants", "grant_id", write.new_grant.grant_id):
        return False
    if write.spend is not None and not _exists(db, "grants", "grant_id", write.spend.grant_id, "manifest_digest"):
        return False
    if write.proposal is not None and _exists(db, "proposals", "grant_id", write.proposal.grant_id):
        return False
    if write.seal is not None and not _exists(db, "proposals", "grant_id", write.seal.grant_id, "sealed_path"):
        return False
    return not (write.request is not None and _exists(db, "requests", "request_id", write.request.request_id))


def _exists(db: sqlite3.Connection, table: str, key: str, value: str, unset: str | None = None) -> bool:
    """Whether ``table`` holds the row ``key = value`` (with column ``unset`` still NULL, if named)."""
    still = "" if unset is None else f" AND {unset} IS NULL"
    query = f"SELECT 1 FROM {table} WHERE {key} = ?{still}"  # noqa: S608 (constant names)
    return db.execute(query, (value,)).fetchone() is not None


def _apply(db: sqlite3.Connection, write: StateWrite) -> bool:
    if not _holds(db, write):
        return False
    db.executemany(
        "INSERT OR IGNORE INTO issued (digest, path, expires_ms) VALUES (?, ?, ?)",
        [(r.digest, r.path, r.expires_ms) for r in write.issued],
    )
    if (child := write.child) is not None:
        db.execute("INSERT INTO children (parent, child_nonce) VALUES (?, ?)", (child.parent, child.nonce))
        db.execute(
            "INSERT INTO child_counts (parent, count, expires_ms) VALUES (?, 1, ?) ON CONFLICT (parent) DO UPDATE"
            " SET count = count + 1, expires_ms = max(expires_ms, excluded.expires_ms)",
            (child.parent, child.expires_ms),
        )
    if (update := write.session) is not None:
        state = update.state
        unit, n = (None, None) if state.stream is None else (state.stream[0].value, state.stream[1])
        db.execute(
            "INSERT INTO agent_sessions (agent, session, seq, last_digest, closed, stream_unit, stream_n, expires_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (agent, session) DO UPDATE SET seq = excluded.seq,"
            " last_digest = excluded.last_digest, closed = excluded.closed, stream_unit = excluded.stream_unit,"
            " stream_n = excluded.stream_n, expires_ms = max(expires_ms, excluded.expires_ms)",
            (state.agent, state.session, state.last_seq, state.last_digest, int(state.closed), unit, n,
             update.expires_ms),
        )  # fmt: skip
    if (grant := write.new_grant) is not None:
        db.execute(
            "INSERT INTO grants (grant_id, parent, child_deployer, expires_ms) VALUES (?, ?, ?, ?)",
            (grant.grant_id, grant.parent, grant.child_deployer, grant.expires_ms),
        )
    if (spend := write.spend) is not None:
        db.execute(
            "UPDATE grants SET manifest_digest = ?, parent_cosig = ? WHERE grant_id = ?",
            (spend.manifest_digest, spend.parent_cosig, spend.grant_id),
        )
    if (proposal := write.proposal) is not None:
        db.execute(
            "INSERT INTO proposals (grant_id, parent, child_record, child_cosig, expires_ms) VALUES (?, ?, ?, ?, ?)",
            (proposal.grant_id, proposal.parent, proposal.child_record, proposal.child_cosig, proposal.expires_ms),
        )
    if (seal := write.seal) is not None:
        db.execute("UPDATE proposals SET sealed_path = ? WHERE grant_id = ?", (seal.path, seal.grant_id))
    if (request := write.request) is not None:
        db.execute(
            "INSERT INTO requests (request_id, fingerprint, answer, expires_ms, record) VALUES (?, ?, ?, ?, ?)",
            (request.request_id, request.fingerprint, request.answer, request.expires_ms, request.record),
        )
    return True
