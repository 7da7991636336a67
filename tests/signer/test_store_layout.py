"""The signer's state file layout: a file an earlier release wrote opens with every row it holds."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from signer.store import SignerStore

pytestmark = pytest.mark.offline

# How an earlier release created the two tables that hold whole paths.
WITHOUT_ROWID_TABLES = (
    "CREATE TABLE issued (digest TEXT PRIMARY KEY, path BLOB NOT NULL, expires_ms INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE proposals (grant_id TEXT PRIMARY KEY, parent TEXT NOT NULL, child_record BLOB NOT NULL,"
    " child_cosig TEXT NOT NULL, expires_ms INTEGER NOT NULL, sealed_path BLOB) WITHOUT ROWID",
    "CREATE INDEX proposals_expiry ON proposals (expires_ms)",
)


def test_a_file_with_the_path_tables_without_rowid_is_rebuilt_keeping_every_row(tmp_path: Path) -> None:
    """Opening a state file whose ``issued`` and ``proposals`` are WITHOUT ROWID rebuilds them as rowid
    tables with every row, the expiry index on the new table, and does it once."""
    path = tmp_path / "old.db"
    SignerStore(f"sqlite:///{path}").close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE issued")
    db.execute("DROP TABLE proposals")
    for statement in WITHOUT_ROWID_TABLES:
        db.execute(statement)
    db.execute("INSERT INTO issued VALUES ('sha256:r1', x'0102', 10)")
    db.execute("INSERT INTO proposals VALUES ('g1', 'sha256:p', x'0a0b', 'cosig-1', 1000, x'0c0d')")
    db.execute("INSERT INTO proposals VALUES ('g2', 'sha256:p', x'0e', 'cosig-2', 5, NULL)")
    db.commit()
    db.close()

    def layout() -> dict[str, str]:
        with contextlib.closing(sqlite3.connect(path)) as check:
            return dict(check.execute("SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall())

    store = SignerStore(f"sqlite:///{path}")
    try:
        tables = layout()
        assert "WITHOUT ROWID" not in tables["issued"] and "WITHOUT ROWID" not in tables["proposals"]
        assert not any(name.endswith("_without_rowid") for name in tables)
        assert "ON proposals" in tables["proposals_expiry"]
        assert store.issued_path("sha256:r1") == b"\x01\x02"
        assert store.transaction(lambda tx: tx.proposal("g1")) == ("sha256:p", b"\x0a\x0b", "cosig-1", b"\x0c\x0d")
        assert store.transaction(lambda tx: tx.proposal("g2")) == ("sha256:p", b"\x0e", "cosig-2", None)
        store.transaction(lambda tx: tx.forget_expired_proposals(100))
        assert store.transaction(lambda tx: tx.proposal("g2")) is None
        assert store.transaction(lambda tx: tx.proposal("g1")) is not None
    finally:
        store.close()
    before = layout()
    SignerStore(f"sqlite:///{path}").close()  # already rebuilt: opening again changes nothing
    assert layout() == before
