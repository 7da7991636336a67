"""The signer's SQLite state file across releases: a file an earlier release wrote opens with every row
it holds and keeps what replay safety needs (spent slots, a session's seq, a closed session)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from countersign.signer_state import NewChild, SessionState, SessionUpdate, StateReads, StateWrite
from signer.stores.sqlite import LAYOUT_VERSION, SqliteState

pytestmark = pytest.mark.offline

AGENT, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
LAST = "sha256:" + "c" * 64
PARENT = "sha256:" + "d" * 64

# How the release before this layout created its tables (the ones that changed since).
EARLIER_RELEASE = (
    "CREATE TABLE issued (digest TEXT PRIMARY KEY, path BLOB NOT NULL, expires_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE children (parent TEXT NOT NULL, child_nonce TEXT NOT NULL, PRIMARY KEY (parent, child_nonce))"
    " WITHOUT ROWID",
    "CREATE TABLE child_counts (parent TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TRIGGER children_counted AFTER INSERT ON children BEGIN INSERT INTO child_counts (parent, count)"
    " VALUES (NEW.parent, 1) ON CONFLICT (parent) DO UPDATE SET count = count + 1; END",
    "CREATE TABLE sessions (session TEXT PRIMARY KEY, seq INTEGER NOT NULL, last_digest TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE agent_sessions (agent TEXT NOT NULL, session TEXT NOT NULL, seq INTEGER NOT NULL,"
    " last_digest TEXT NOT NULL, closed INTEGER NOT NULL, stream_unit TEXT, stream_n INTEGER,"
    " PRIMARY KEY (agent, session)) WITHOUT ROWID",
    "CREATE TABLE proposals (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_record BLOB NOT NULL,"
    " child_cosig TEXT NOT NULL, expires_ms INTEGER NOT NULL, sealed_path BLOB) WITHOUT ROWID",
    "CREATE INDEX proposals_expiry ON proposals (expires_ms)",
)


def earlier_file(path: Path, *, counted: bool = True) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        for statement in EARLIER_RELEASE:
            if counted or "child_counts" not in statement:
                db.execute(statement)
        db.execute("INSERT INTO issued VALUES (?, x'0102', 5000)", (PARENT,))
        db.execute("INSERT INTO issued VALUES (?, x'0304', 9000)", (AGENT,))
        db.executemany("INSERT INTO children VALUES (?, ?)", [(PARENT, "a"), (PARENT, "b")])
        db.execute("INSERT INTO agent_sessions VALUES (?, 'chat', 3, ?, 1, 'tokens', 16)", (AGENT, LAST))
        db.execute("INSERT INTO sessions VALUES ('old-chat', 7, ?)", (LAST,))
        db.execute("INSERT INTO proposals VALUES ('g1', ?, x'0a0b', 'cosig-1', 1000, x'0c0d')", (PARENT,))
        db.commit()


def layout(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return dict(db.execute("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall())


@pytest.mark.parametrize("counted", [True, False], ids=["with-counts", "before-counts"])
def test_an_earlier_release_file_opens_with_every_row(tmp_path: Path, counted: bool) -> None:
    path = tmp_path / "old.db"
    earlier_file(path, counted=counted)
    store = SqliteState(str(path))
    try:
        tables = layout(path)
        assert "WITHOUT ROWID" not in tables["issued"] and "WITHOUT ROWID" not in tables["proposals"]
        assert "children_counted" not in tables  # counts are kept by the writes now
        assert store.read(StateReads(issued=PARENT)).issued == b"\x01\x02"
        proposal = store.read(StateReads(proposal="g1")).proposal
        assert proposal is not None and (proposal.child_record, proposal.sealed_path) == (b"\x0a\x0b", b"\x0c\x0d")
        # Children counted once (from the rows when the file had no counts), and still bounded.
        assert store.read(StateReads(children_of=PARENT)).child_count == 2
        assert store.apply([StateWrite(child=NewChild(PARENT, "c", 3, 5000))]) == [True]
        assert store.apply([StateWrite(child=NewChild(PARENT, "d", 3, 5000))]) == [False]
        # A closed session stays closed and keeps its seq; a session kept by id alone continues.
        closed = store.read(StateReads(session=(AGENT, "chat"))).session
        assert closed is not None and (closed.last_seq, closed.closed) == (3, True)
        legacy = store.read(StateReads(session=(OTHER, "old-chat"))).session
        assert legacy == SessionState("old-chat", None, 7, LAST)
        # Continuing it: the new row must not exist yet, whatever the legacy row says.
        moved = SessionUpdate(SessionState("old-chat", OTHER, 8, "sha256:" + "e" * 64), None, 9000)
        assert store.apply([StateWrite(session=moved)]) == [True]
        # Rows that had no expiry of their own took their record's.
        assert store.collect_expired(5_001, 100)["child_counts"] == 1
        assert store.read(StateReads(children_of=PARENT)).child_count == 0
        assert store.read(StateReads(session=(AGENT, "chat"))).session is not None  # its record lives to 9000
    finally:
        store.close()
    before = layout(path)
    SqliteState(str(path)).close()  # upgraded once: opening again changes nothing
    assert layout(path) == before
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == LAYOUT_VERSION


def test_collection_stays_bounded_over_a_long_run(tmp_path: Path) -> None:
    """Rounds of short-lived state with a collection after each: the store holds about one round."""
    store = SqliteState(str(tmp_path / "signer.db"))
    peaks = []
    for round_no in range(30):
        now = round_no * 1_000
        writes = [
            StateWrite(child=NewChild(f"sha256:p{round_no}-{i}", "c", 1, now + 500),
                       session=SessionUpdate(SessionState("s", f"sha256:a{round_no}-{i}", 0, LAST), None, now + 500))
            for i in range(20)
        ]  # fmt: skip
        assert store.apply(writes) == [True] * 20
        counts = store.row_counts()
        assert counts is not None
        peaks.append(sum(counts.values()))
        while max(store.collect_expired(now, 7).values()) == 7:  # small batches: many per round
            pass
    assert max(peaks) == peaks[1] == peaks[-1]  # one round's rows plus one not yet expired
    store.close()
