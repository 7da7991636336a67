"""Opening the daemons' SQLite files the same way everywhere: WAL, full synchronous commits."""

from __future__ import annotations

import sqlite3
import time

from countersign.errors import ConfigError


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


def sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:`` URL names, as an absolute path; None if the URL is not a file URL.

    Read as SQLAlchemy and most tools read it: ``sqlite:///state.db`` is ``state.db`` in the working
    directory (three slashes, then a relative path) and ``sqlite:////var/lib/x.db`` the absolute
    ``/var/lib/x.db`` (four). The path is resolved when the URL is read, so a daemon or command that
    changes directory later keeps the same file. Raises ConfigError when the URL named an existing
    file under the earlier reading (three slashes, absolute) and names none now.
    """
    from pathlib import Path
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
        return None
    relative = unquote(parts.path[1:])
    path = Path(relative).absolute()
    earlier = Path("/" + relative)  # what releases before this one opened: the same path, absolute
    if not relative.startswith("/") and not path.exists() and earlier.exists():
        # Refuse rather than start on an empty file: a fresh store forgets consumed nonces and spent grants.
        raise ConfigError(
            f"{url} now means {path} (three slashes: relative to the working directory), which does not exist, "
            f"while {earlier} does: to keep using it, write sqlite:///{earlier}"
        )
    return str(path)
