"""Opening the daemons' SQLite files the same way everywhere: WAL, full synchronous commits."""

from __future__ import annotations

import sqlite3
import time


def open_sqlite(path: str, *, busy_timeout_ms: int = 5_000) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit) with WAL and ``synchronous=FULL``.

    Switching a new file to WAL needs an exclusive lock and does not wait on SQLite's busy handler, so
    several processes opening one new file at once can see "database is locked": that step is retried
    until the busy timeout. Raises sqlite3.Error.
    """
    db = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False)
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                db.close()
                raise
            time.sleep(0.005)
    # FULL: a commit survives power loss as well as a crash (a consumed nonce or spent grant must not
    # come back); WAL keeps that to one fsync per commit.
    db.execute("PRAGMA synchronous=FULL")
    return db
