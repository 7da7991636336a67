"""Opening the daemons' PostgreSQL stores the same way everywhere: one URL reading, one pool, one
migration runner over plain ``.sql`` files.

URL: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?PARAMS]``. Every libpq parameter passes through
(``sslmode``, ``options``, ...); these are the store's own and are stripped before libpq sees them:

* ``schema``: the schema holding the tables (default: the store's own; also taken from
  ``options=-csearch_path=NAME`` when ``schema`` is absent). Created if missing.
* ``statement_timeout_ms``: server-side bound on one statement, lock waits included (default 10000).
* ``pool_min_size`` / ``pool_max_size``: connection pool bounds (default 1 / 8).

``connect_timeout`` (libpq's) is also the longest a call waits for a pooled connection while the server
is down (default 3). The password, when the URL has none, comes from the store's own environment
variable (then libpq's ``PGPASSWORD`` / ``.pgpass``); it is handed to libpq only, never logged.

Every connection's ``search_path`` is the store's schema, so the migrations are plain SQL naming no
schema; functions they create pin it (``SET search_path FROM CURRENT``).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from countersign.errors import ConfigError, StateUnavailable

OWN_PARAMS = ("schema", "statement_timeout_ms", "pool_min_size", "pool_max_size")
SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*([^\s,]+)")
_MIGRATION_FILE = re.compile(r"V([0-9]+)__[a-z0-9_]+\.sql")
# A deadlock or serialisation failure rolled its transaction back whole: retrying it is safe.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})


@dataclass(frozen=True, slots=True)
class PostgresSettings:
    conninfo: str
    schema: str
    connect_timeout: int
    statement_timeout_ms: int
    pool_min_size: int
    pool_max_size: int


def parse_postgres_url(url: str, *, default_schema: str, password_env: str, application: str) -> PostgresSettings:
    """Read a store URL (module docstring). Raises ConfigError naming what is wrong (never the password)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {parts.scheme}://…")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_PARAMS}
    passed = [(k, v) for k, v in query if k not in OWN_PARAMS]
    # libpq decodes %XX only: a space must go back as %20, not as urlencode's default "+".
    libpq_url = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(passed, quote_via=quote), ""))
    try:
        params: dict[str, Any] = conninfo_to_dict(libpq_url)
    except psycopg.ProgrammingError:
        raise ConfigError("not a valid PostgreSQL URL") from None
    schema = own.get("schema") or _schema_from_options(params.get("options")) or default_schema
    if not SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(f"schema must be a plain identifier, got {schema!r}")
    connect_timeout = _positive_int({k: str(v) for k, v in params.items()}, "connect_timeout", 3)
    settings = {
        "statement_timeout_ms": _positive_int(own, "statement_timeout_ms", 10_000),
        "pool_min_size": _positive_int(own, "pool_min_size", 1),
        "pool_max_size": _positive_int(own, "pool_max_size", 8),
    }
    if settings["pool_min_size"] > settings["pool_max_size"]:
        raise ConfigError("pool_min_size must not exceed pool_max_size")
    # Dead peers are noticed within seconds, not after the kernel's default of many minutes.
    for key, value in (
        ("keepalives", 1),
        ("keepalives_idle", 5),
        ("keepalives_interval", 2),
        ("keepalives_count", 3),
        ("tcp_user_timeout", 10_000),
        ("application_name", application),
    ):
        params.setdefault(key, value)
    params["connect_timeout"] = max(connect_timeout, 2)
    if "password" not in params and os.environ.get(password_env):
        params["password"] = os.environ[password_env]
    return PostgresSettings(make_conninfo("", **params), schema, connect_timeout, **settings)


def _schema_from_options(options: str | None) -> str | None:
    found = _SEARCH_PATH.search(options or "")
    return None if found is None else found.group(1).strip("\"'")


def _positive_int(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"PostgreSQL URL parameter {name} must be a positive integer, got {raw!r}")
    return value


def load_migrations(package: str) -> list[tuple[int, str]]:
    """The ``V<n>__<name>.sql`` files of ``package``, as (n, text), numbered 1, 2, ... without a gap."""
    found = []
    for entry in resources.files(package).iterdir():
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match is not None:
            found.append((int(match.group(1)), entry.read_text(encoding="utf-8")))
    found.sort()
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        raise ConfigError(f"migrations of {package} must be numbered 1 to {len(found)} without a gap")
    return found


class PostgresDatabase:
    """A connection pool on one schema of a PostgreSQL server, and its migrations."""

    def __init__(self, settings: PostgresSettings, *, name: str) -> None:
        self.schema = settings.schema
        self._timeout = float(settings.connect_timeout)
        self._statement_timeout_ms = settings.statement_timeout_ms
        self._checking = threading.Lock()
        self._pool = ConnectionPool(
            settings.conninfo,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            kwargs={"autocommit": True},
            configure=self._configure,
            timeout=self._timeout,
            # Short on purpose: psycopg_pool doubles the delay between reconnection attempts up to
            # reconnect_timeout, so a long one kept a store unavailable after an outage for about as
            # long again as the outage lasted (docs/replicas.md).
            reconnect_timeout=5.0,
            name=f"countersign-{name}-{self.schema}",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=self._timeout)
        except PoolTimeout as exc:
            self._pool.close(timeout=0)
            raise StateUnavailable(f"PostgreSQL: no connection within {self._timeout:g} s: {exc}") from exc

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(self._statement_timeout_ms)))
        # The schema may not exist yet on the first connection (migrate creates it): search_path
        # names it anyway, and it takes effect once it does.
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    @contextmanager
    def connection(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; every driver or pool failure becomes StateUnavailable."""
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise StateUnavailable(
                f"PostgreSQL ({what}): no connection within {self._timeout:g} s; server down or pool exhausted"
            ) from exc
        except psycopg.OperationalError as exc:
            self._recheck_pool()
            raise StateUnavailable(f"PostgreSQL ({what}): {exc}".rstrip()) from exc
        except psycopg.Error as exc:
            raise StateUnavailable(f"PostgreSQL ({what}): {type(exc).__name__}: {exc}".rstrip()) from exc

    def run(self, what: str, work: Any, attempts: int = 3) -> Any:
        """``work(conn)`` in one transaction; retried (whole) after a deadlock or serialisation failure."""
        for attempt in range(attempts):
            try:
                with self.connection(what) as conn, conn.transaction():
                    return work(conn)
            except StateUnavailable as exc:
                cause = exc.__cause__
                retry = isinstance(cause, psycopg.Error) and cause.sqlstate in RETRYABLE_SQLSTATES
                if not retry or attempt + 1 == attempts:
                    raise
        raise AssertionError("unreachable")

    def _recheck_pool(self) -> None:
        """After a connection failure (a server restart), drop the other dead idle connections in the
        background so the next calls get fresh ones instead of failing one by one."""
        if not self._checking.acquire(blocking=False):
            return

        def run() -> None:
            try:
                self._pool.check()
            except Exception:  # noqa: S110 - best effort; the pool reconnects on demand anyway
                pass
            finally:
                self._checking.release()

        threading.Thread(target=run, name="countersign-pg-check", daemon=True).start()

    def migrate(self, migrations: Sequence[tuple[int, str]], *, table: str) -> int:
        """Bring the schema to the last of ``migrations``; idempotent and safe to run concurrently.

        Each migration runs in its own transaction under an advisory lock keyed by the schema and
        re-reads the version (kept in ``table``) under it, so concurrent starters apply each exactly
        once. A schema newer than this software is refused. Returns the version found before."""
        ident = sql.Identifier(self.schema)
        lock = sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
            sql.Literal(f"countersign-schema:{self.schema}:{table}")
        )
        latest = migrations[-1][0] if migrations else 0
        found: int | None = None
        with self.connection("migrate") as conn:
            for step, text in migrations:
                with conn.transaction():
                    conn.execute(lock)
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE IF NOT EXISTS {}.{} ("
                            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                        ).format(ident, sql.Identifier(table))
                    )
                    row = conn.execute(
                        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.{}").format(ident, sql.Identifier(table))
                    ).fetchone()
                    version = int(row[0]) if row else 0
                    if found is None:
                        found = version
                    if version > latest:
                        raise ConfigError(
                            f"PostgreSQL schema {self.schema} has {table} version {version}, newer than this"
                            f" software ({latest})"
                        )
                    if version >= step:
                        continue
                    conn.execute(text)  # one file, many statements: no parameters, simple protocol
                    conn.execute(
                        sql.SQL("INSERT INTO {}.{} (version) VALUES (%s)").format(ident, sql.Identifier(table)),
                        (step,),
                    )
        return found or 0

    def close(self) -> None:
        self._pool.close()
