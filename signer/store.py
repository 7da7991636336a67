"""The signer's durable state (SQLite): issued records, children per parent, grants, session counters.

It is what lets a restarted signer neither forget a limit nor reuse a grant. Each decision that
spends something (a grant, a child slot, a session sequence number) is one ``BEGIN IMMEDIATE``
transaction, so two concurrent requests cannot both spend it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from countersign._daemon.sqlite import open_sqlite, sqlite_file
from countersign.cosigning import Grant, SessionState
from countersign.errors import ConfigError, StateUnavailable
from countersign.records import StreamUnit

# ``issued`` and ``proposals`` hold whole paths (kilobytes a row), so they are ordinary rowid tables:
# SQLite's guidance keeps WITHOUT ROWID for rows under about a twentieth of a page. The child's two
# transactions of an issuance took about 40 % less time once these two were rebuilt (docs/benchmarks.md).
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS issued (digest TEXT PRIMARY KEY, path BLOB NOT NULL, expires_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS children (parent TEXT NOT NULL, child_nonce TEXT NOT NULL,"
    " PRIMARY KEY (parent, child_nonce)) WITHOUT ROWID",
    # How many rows ``children`` holds per parent, kept by a trigger: the fan-out check reads one row
    # instead of counting a parent's children (which grows with every child it ever had).
    "CREATE TABLE IF NOT EXISTS child_counts (parent TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TRIGGER IF NOT EXISTS children_counted AFTER INSERT ON children BEGIN"
    " INSERT INTO child_counts (parent, count) VALUES (NEW.parent, 1)"
    " ON CONFLICT (parent) DO UPDATE SET count = count + 1; END",
    "CREATE TABLE IF NOT EXISTS grants (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_deployer TEXT NOT NULL,"
    " expires_ms INTEGER NOT NULL, manifest_digest TEXT, parent_cosig TEXT) WITHOUT ROWID",
    # Sessions as an earlier release kept them (by session id alone, across agent records): read only,
    # so that a session continued after an upgrade does not reuse a seq.
    "CREATE TABLE IF NOT EXISTS sessions (session TEXT PRIMARY KEY, seq INTEGER NOT NULL, last_digest TEXT NOT NULL)"
    " WITHOUT ROWID",
    # A session of one agent record (docs/spec.md 17.6): its last receipt, whether it is closed, its
    # stream's unit and n. A restarted signer neither reuses a seq nor reopens a closed session.
    "CREATE TABLE IF NOT EXISTS agent_sessions (agent TEXT NOT NULL, session TEXT NOT NULL, seq INTEGER NOT NULL,"
    " last_digest TEXT NOT NULL, closed INTEGER NOT NULL, stream_unit TEXT, stream_n INTEGER,"
    " PRIMARY KEY (agent, session)) WITHOUT ROWID",
    # The child side's proposal under each grant, and once sealed the resulting path: a retry re-sends
    # the same edge, or gets the same path back.
    "CREATE TABLE IF NOT EXISTS proposals (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_record BLOB NOT NULL,"
    " child_cosig TEXT NOT NULL, expires_ms INTEGER NOT NULL, sealed_path BLOB)",
    "CREATE INDEX IF NOT EXISTS proposals_expiry ON proposals (expires_ms)",
    # What the collector (``SignerStore.collect_expired``) finds expired rows by.
    "CREATE INDEX IF NOT EXISTS issued_expiry ON issued (expires_ms)",
    "CREATE INDEX IF NOT EXISTS grants_expiry ON grants (expires_ms)",
)

# The tables the collector reports on (rows held, rows collected), in the order it collects them.
COLLECTED_TABLES = ("issued", "children", "child_counts", "agent_sessions", "grants", "proposals")
DEFAULT_COLLECT_BATCH = 1_000  # records per transaction: the store lock is held for one batch at a time

# Tables an earlier release made WITHOUT ROWID, rebuilt as rowid tables on open: their columns, and
# the indexes that go with the old table and are made again by SCHEMA.
_REBUILT_AS_ROWID = {
    "issued": ("digest, path, expires_ms", ()),
    "proposals": ("grant_id, parent, child_record, child_cosig, expires_ms, sealed_path", ("proposals_expiry",)),
}

T = TypeVar("T")
__all__ = ["Grant", "SignerStore", "Transaction"]


class SignerStore:
    def __init__(self, url: str, on_commit: Callable[[bool, float], None] | None = None) -> None:
        """``on_commit(durable, seconds)`` is told how long each successful commit took."""
        path = sqlite_file(url)
        if path is None:
            raise ConfigError(
                f"state_url must look like sqlite:///relative/signer.db or sqlite:////absolute/signer.db, got {url!r}"
            )
        self._lock = threading.Lock()
        self._on_commit = on_commit
        try:
            self._db = open_sqlite(path)
            self._create_schema()
            # A second connection for commits that need not survive power loss (see ``transaction``):
            # the sync mode is per connection, so neither ever switches it.
            self._fast = open_sqlite(path)
            self._fast.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open signer state {path}: {exc}") from None

    def _create_schema(self) -> None:
        """Create what is missing; a file from before ``child_counts`` existed gets it counted once, and
        one whose path tables are WITHOUT ROWID gets them rebuilt, rows and all, in the same transaction."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            had_counts = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'child_counts'"
            ).fetchone()
            rebuilt = [table for table in _REBUILT_AS_ROWID if self._without_rowid(table)]
            for table in rebuilt:
                for index in _REBUILT_AS_ROWID[table][1]:
                    self._db.execute(f"DROP INDEX {index}")
                self._db.execute(f"ALTER TABLE {table} RENAME TO {table}_without_rowid")
            for statement in SCHEMA:
                self._db.execute(statement)
            for table in rebuilt:  # names and columns from the constant above, not from input
                columns = _REBUILT_AS_ROWID[table][0]
                self._db.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {table}_without_rowid")  # noqa: S608
                self._db.execute(f"DROP TABLE {table}_without_rowid")
            if had_counts is None:  # the trigger was created just now, after these children
                self._db.execute(
                    "INSERT INTO child_counts (parent, count) SELECT parent, COUNT(*) FROM children GROUP BY parent"
                )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _without_rowid(self, table: str) -> bool:
        row = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        return row is not None and "WITHOUT ROWID" in str(row[0]).upper()

    @contextmanager
    def _transaction(self, durable: bool) -> Iterator[sqlite3.Connection]:
        db = self._db if durable else self._fast
        with self._lock:
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                started = time.perf_counter()
                db.execute("COMMIT")
                if self._on_commit is not None:
                    self._on_commit(durable, time.perf_counter() - started)
            except sqlite3.Error as exc:
                raise StateUnavailable(f"signer state: {exc}") from exc

    def transaction(self, work: Callable[[Transaction], T], *, durable: bool = True) -> T:
        """Run ``work`` atomically; an exception it raises rolls everything back.

        ``durable`` (the default) syncs the commit to disk before returning: it is what spends a grant,
        a child slot or a session number, which must survive even a power loss. Recording a record
        that spends nothing (a root, or a child whose slot the parent's signer spent) may pass
        ``durable=False``: the commit still survives a crash or kill of this process (WAL), only an
        operating-system crash may lose it, and then the record is merely unknown here (fail closed).
        """
        with self._transaction(durable) as db:
            return work(Transaction(db))

    def issued_path(self, digest: str) -> bytes | None:
        """The canonical path this signer returned when it issued the record ``digest``."""
        with self._lock:
            row = self._db.execute("SELECT path FROM issued WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else bytes(row[0])

    def collect_expired(self, cutoff_ms: int, limit: int = DEFAULT_COLLECT_BATCH) -> dict[str, int]:
        """Forget what can no longer matter: rows tied to a record or grant that expired before
        ``cutoff_ms`` (the caller passes now minus its clock-skew margin). At most ``limit`` expired
        records (with what hangs off them), grants and proposals in one short transaction; returns
        how many rows of each table went.

        The rules (ADR 0026), each keeping what replay safety needs:

        * ``issued``: a record past its expiry can be nobody's parent any more (``record_fields``
          refuses a child of an expired parent), so its stored path is dead weight. Once it is gone
          the record is unknown here and every call naming it is refused ``PARENT_UNKNOWN``: fail closed.
        * ``children`` / ``child_counts``: a parent's child set only bounds its fan-out, which needs
          the parent to be usable; they go with the parent's ``issued`` row.
        * ``agent_sessions``: a session's seq and closed flag go only with its agent record's ``issued``
          row. Every receipt of the session expires no later than the agent record, so none can
          still verify, and the signer can no longer issue a receipt under that agent at all (it is
          unknown, and expired): a forgotten seq cannot be reused, a forgotten close cannot reopen.
        * ``grants``: a grant past its expiry can no longer be spent; a spent one answered its edge's
          retries until now, and a retry later than this margin is refused ``GRANT_NOT_FOUND``.
        * ``proposals``: the child's side of a delegation, kept until the proposed child record
          expires; after that the edge could not verify anyway.
        * The pre-agent-key ``sessions`` table is kept: its rows carry no expiry, it is read only and
          no longer grows.
        """
        removed: dict[str, int] = {}

        def work(db: sqlite3.Connection) -> None:
            # Everything keyed by a record goes with the record, found by the expiry index: a round
            # costs what it forgets, not what the store holds.
            expired = [
                (str(row[0]),)
                for row in db.execute("SELECT digest FROM issued WHERE expires_ms < ? LIMIT ?", (cutoff_ms, limit))
            ]
            removed["children"] = db.executemany("DELETE FROM children WHERE parent = ?", expired).rowcount
            removed["child_counts"] = db.executemany("DELETE FROM child_counts WHERE parent = ?", expired).rowcount
            removed["agent_sessions"] = db.executemany("DELETE FROM agent_sessions WHERE agent = ?", expired).rowcount
            removed["issued"] = db.executemany("DELETE FROM issued WHERE digest = ?", expired).rowcount
            removed["grants"] = db.execute(
                "DELETE FROM grants WHERE grant_id IN (SELECT grant_id FROM grants WHERE expires_ms < ? LIMIT ?)",
                (cutoff_ms, limit),
            ).rowcount
            removed["proposals"] = db.execute(
                "DELETE FROM proposals WHERE rowid IN (SELECT rowid FROM proposals WHERE expires_ms < ? LIMIT ?)",
                (cutoff_ms, limit),
            ).rowcount

        # Forgetting needs no power-loss durability: a lost delete is collected again next time.
        with self._transaction(durable=False) as db:
            work(db)
        return removed

    def row_counts(self) -> dict[str, int]:
        """Rows held per collected table (what the collector keeps bounded)."""
        with self._lock:
            return {
                table: int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # noqa: S608 (constant names)
                for table in COLLECTED_TABLES
            }

    def close(self) -> None:
        with self._lock:
            self._fast.close()
            self._db.close()


class Transaction:
    """Operations inside one atomic transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def issued_path(self, digest: str) -> bytes | None:
        row = self._db.execute("SELECT path FROM issued WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else bytes(row[0])

    def is_issued(self, digest: str) -> bool:
        return self._db.execute("SELECT 1 FROM issued WHERE digest = ?", (digest,)).fetchone() is not None

    def record_issued(self, digest: str, path: bytes, expires_ms: int) -> None:
        # The same record issued twice (a retried delegation sealing the same edge) is one record.
        self._db.execute(
            "INSERT OR IGNORE INTO issued (digest, path, expires_ms) VALUES (?, ?, ?)", (digest, path, expires_ms)
        )

    def child_count(self, parent: str) -> int:
        row = self._db.execute("SELECT count FROM child_counts WHERE parent = ?", (parent,)).fetchone()
        return 0 if row is None else int(row[0])

    def add_child(self, parent: str, child_nonce: str) -> None:
        self._db.execute("INSERT OR IGNORE INTO children (parent, child_nonce) VALUES (?, ?)", (parent, child_nonce))

    def open_grant(self, grant: Grant) -> None:
        self._db.execute(
            "INSERT INTO grants (grant_id, parent, child_deployer, expires_ms) VALUES (?, ?, ?, ?)",
            (grant.grant_id, grant.parent, grant.child_deployer, grant.expires_ms),
        )

    def grant(self, grant_id: str) -> Grant | None:
        row = self._db.execute(
            "SELECT grant_id, parent, child_deployer, expires_ms, manifest_digest, parent_cosig FROM grants"
            " WHERE grant_id = ?",
            (grant_id,),
        ).fetchone()
        return None if row is None else Grant(*row)

    def use_grant(self, grant_id: str, manifest_digest: str, parent_cosig: str) -> None:
        updated = self._db.execute(
            "UPDATE grants SET manifest_digest = ?, parent_cosig = ? WHERE grant_id = ? AND manifest_digest IS NULL",
            (manifest_digest, parent_cosig, grant_id),
        ).rowcount
        if updated != 1:
            raise StateUnavailable("grant was used concurrently")

    def proposal(self, grant_id: str) -> tuple[str, bytes, str, bytes | None] | None:
        """(parent digest, child record bytes, child co-signature JSON, sealed path or None) under a grant."""
        row = self._db.execute(
            "SELECT parent, child_record, child_cosig, sealed_path FROM proposals WHERE grant_id = ?", (grant_id,)
        ).fetchone()
        if row is None:
            return None
        return str(row[0]), bytes(row[1]), str(row[2]), None if row[3] is None else bytes(row[3])

    def save_proposal(self, grant_id: str, parent: str, child_record: bytes, child_cosig: str, expires_ms: int) -> None:
        self._db.execute(
            "INSERT INTO proposals (grant_id, parent, child_record, child_cosig, expires_ms) VALUES (?, ?, ?, ?, ?)",
            (grant_id, parent, child_record, child_cosig, expires_ms),
        )

    def seal_proposal(self, grant_id: str, path: bytes) -> None:
        self._db.execute("UPDATE proposals SET sealed_path = ? WHERE grant_id = ?", (path, grant_id))

    def forget_expired_proposals(self, now_ms: int) -> None:
        self._db.execute("DELETE FROM proposals WHERE expires_ms < ?", (now_ms,))

    def session(self, agent: str, session: str) -> SessionState | None:
        """The session ``session`` of the agent record ``agent``; for one an earlier release kept (by
        id alone), its last receipt with no agent, so that continuing it reuses no seq."""
        row = self._db.execute(
            "SELECT seq, last_digest, closed, stream_unit, stream_n FROM agent_sessions"
            " WHERE agent = ? AND session = ?",
            (agent, session),
        ).fetchone()
        if row is not None:
            seq, last, closed, unit, n = row
            stream = None if unit is None else (StreamUnit(unit), int(n))
            return SessionState(session, agent, int(seq), str(last), bool(closed), stream)
        legacy = self._db.execute("SELECT seq, last_digest FROM sessions WHERE session = ?", (session,)).fetchone()
        return None if legacy is None else SessionState(session, None, int(legacy[0]), str(legacy[1]))

    def store_session(self, state: SessionState) -> None:
        assert state.agent is not None  # stored only by this release, which keys sessions by agent record
        unit, n = (None, None) if state.stream is None else (state.stream[0].value, state.stream[1])
        self._db.execute(
            "INSERT INTO agent_sessions (agent, session, seq, last_digest, closed, stream_unit, stream_n)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (agent, session) DO UPDATE SET seq = excluded.seq,"
            " last_digest = excluded.last_digest, closed = excluded.closed, stream_unit = excluded.stream_unit,"
            " stream_n = excluded.stream_n",
            (state.agent, state.session, state.last_seq, state.last_digest, int(state.closed), unit, n),
        )
