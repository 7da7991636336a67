"""The signer's session state survives a reopen, keyed by agent record, and continues sessions an
earlier release kept by id alone without reusing a seq."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from countersign.cosigning import SessionState
from countersign.records import StreamUnit
from signer.store import SignerStore

pytestmark = pytest.mark.offline

AGENT, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
LAST = "sha256:" + "c" * 64


def test_session_state_is_per_agent_and_survives_a_reopen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'signer.db'}"
    store = SignerStore(url)
    closed = SessionState("chat", AGENT, 3, LAST, closed=True, stream=(StreamUnit.TOKENS, 16))
    store.transaction(lambda tx: tx.store_session(closed))
    store.close()
    store = SignerStore(url)
    assert store.transaction(lambda tx: tx.session(AGENT, "chat")) == closed
    assert store.transaction(lambda tx: tx.session(OTHER, "chat")) is None
    store.close()


def test_a_session_from_before_agent_keys_continues_where_it_was(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the table as the earlier release made it
        db.execute(
            "CREATE TABLE sessions (session TEXT PRIMARY KEY, seq INTEGER NOT NULL, last_digest TEXT NOT NULL)"
            " WITHOUT ROWID"
        )
        db.execute("INSERT INTO sessions VALUES ('chat', 7, ?)", (LAST,))
    store = SignerStore(f"sqlite:///{path}")
    assert store.transaction(lambda tx: tx.session(AGENT, "chat")) == SessionState("chat", None, 7, LAST)
    store.close()
