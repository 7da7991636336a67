"""Fixtures of the verifier-state store tests: one harness per backend, against the real thing.

* PostgreSQL: the server at ``COUNTERSIGN_TEST_POSTGRES_URL`` (default: this machine's server,
  ``postgresql://postgres@127.0.0.1:5432/test``). Every test gets its own schema, dropped afterwards.
  If the server cannot be reached the tests FAIL (a store test that silently skips proves nothing).
* DynamoDB: moto's server mode (``moto_server`` from the virtualenv, a separate process on a free
  loopback port): an EMULATOR. boto3 talks real HTTP to it, through exactly the code path used against
  AWS; only ``endpoint_url`` differs. What this does and does not prove: docs/stores.md.
* Outages are real: the store talks to its server through a loopback TCP proxy that a test cuts.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from countersign.state import InMemoryState, VerifierState
from tests.ports import free_port as _free_port
from tests.stores.store_proxy import TcpProxy
from verifier.stores import open_store

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
EMULATOR_REGION = "us-east-1"


def postgres_base_url() -> str:
    return os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def with_params(url: str, **params: object) -> str:
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


# --------------------------------------------------------------------------------------------
# PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The base URL of a reachable PostgreSQL server, or a test failure saying why not."""
    import psycopg

    url = postgres_base_url()
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(
            f"PostgreSQL tests need a server: could not connect to {url!r} ({exc}). Start the local server"
            " or set COUNTERSIGN_TEST_POSTGRES_URL (these tests fail rather than skip on purpose).",
            pytrace=False,
        )
    return url


class PostgresSchemas:
    """Hands out fresh schema names on the test server and drops them all at teardown."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.names: list[str] = []

    def new(self) -> str:
        name = f"cs_test_{uuid.uuid4().hex[:12]}"
        self.names.append(name)
        return name

    def url(self, schema: str, *, base: str | None = None, **params: object) -> str:
        return with_params(base or self.base_url, schema=schema, **{"connect_timeout": 2, **params})

    def drop_all(self) -> None:
        import psycopg
        from psycopg import sql

        if not self.names:
            return
        with psycopg.connect(self.base_url, connect_timeout=5, autocommit=True) as conn:
            for name in self.names:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def pg_schemas(postgres_server: str) -> Iterator[PostgresSchemas]:
    schemas = PostgresSchemas(postgres_server)
    yield schemas
    schemas.drop_all()


# --------------------------------------------------------------------------------------------
# DynamoDB emulator (moto server mode)


@pytest.fixture(scope="session")
def dynamodb_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start moto's DynamoDB emulator in server mode (a separate process on a free loopback port, see
    moto_serial_server.py for why requests are applied one at a time); yield its endpoint URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("moto_serial_server.py")), str(port)],
            stdout=out,
            stderr=out,
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"DynamoDB emulator did not start: {log.read_text()[-2000:]}", pytrace=False)
                time.sleep(0.05)  # readiness poll of a starting process, bounded by the deadline
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(autouse=True)
def _emulator_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # Dummy credentials for the emulator, through boto3's ordinary chain (as a task role would be).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def dynamodb_url(endpoint: str, table: str, **params: object) -> str:
    return with_params(f"dynamodb://{table}?region={EMULATOR_REGION}&endpoint_url={endpoint}", **params)


# --------------------------------------------------------------------------------------------
# One harness per backend, used by the conformance suite


class StoreHarness:
    """A backend under test. ``open()`` gives another handle to the same store; ``fresh()`` an
    empty store; ``outage()`` makes the store unreachable inside the block (None: no outage mode)."""

    name = "?"

    def __init__(self) -> None:
        self._handles: list[VerifierState] = []

    def _track(self, store: VerifierState) -> VerifierState:
        self._handles.append(store)
        return store

    def open(self) -> VerifierState:
        raise NotImplementedError

    def open_many_concurrently(self, n: int) -> list[VerifierState]:
        """``n`` handles on one store that does not exist yet, opened at the same time (migrations race)."""
        raise NotImplementedError

    def fresh(self) -> VerifierState:
        raise NotImplementedError

    def open_for_outage(self) -> VerifierState:
        """A handle for the outage test (SQLite: short busy timeout, so the test stays quick)."""
        return self.open()

    def outage(self) -> contextlib.AbstractContextManager[None] | None:
        return None

    def close(self) -> None:
        for store in self._handles:
            with contextlib.suppress(Exception):
                store.close()


def _concurrently(n: int, opener: Callable[[], VerifierState]) -> list[VerifierState]:
    barrier = threading.Barrier(n)

    def run() -> VerifierState:
        barrier.wait()
        return opener()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: run(), range(n)))


class MemoryHarness(StoreHarness):
    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self._store = InMemoryState()

    def open(self) -> VerifierState:
        return self._store

    def open_many_concurrently(self, n: int) -> list[VerifierState]:
        store = InMemoryState()  # process-local: "the same store" is the same object
        return [store] * n

    def fresh(self) -> VerifierState:
        return InMemoryState()


class SqliteHarness(StoreHarness):
    name = "sqlite"

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.path = directory / "state.db"
        self._fresh = 0

    def open(self) -> VerifierState:
        return self._track(open_store(f"sqlite:///{self.path}"))

    def open_many_concurrently(self, n: int) -> list[VerifierState]:
        path = self.directory / f"concurrent-{uuid.uuid4().hex[:8]}.db"
        return [self._track(s) for s in _concurrently(n, lambda: open_store(f"sqlite:///{path}"))]

    def fresh(self) -> VerifierState:
        self._fresh += 1
        return self._track(open_store(f"sqlite:///{self.directory / f'fresh-{self._fresh}.db'}"))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Another process-level writer holds SQLite's write lock past the busy timeout: the store's
        writes cannot run (the SQLite face of 'store unavailable'). Stores opened with a short timeout."""
        import sqlite3

        holder = sqlite3.connect(self.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()

    def open_for_outage(self) -> VerifierState:
        from verifier.stores.sqlite import SqliteState

        return self._track(SqliteState(self.path, busy_timeout_ms=200))

    def outage(self) -> contextlib.AbstractContextManager[None] | None:
        return self._locked()


class PostgresHarness(StoreHarness):
    name = "postgresql"

    def __init__(self, schemas: PostgresSchemas) -> None:
        super().__init__()
        self.schemas = schemas
        self.schema = schemas.new()
        host, port = _host_port(schemas.base_url)
        self.proxy = TcpProxy(host, port)
        self.url = schemas.url(self.schema, base=_replace_host_port(schemas.base_url, self.proxy.address))
        self._fresh_store: VerifierState | None = None

    def open(self) -> VerifierState:
        return self._track(open_store(self.url))

    def open_many_concurrently(self, n: int) -> list[VerifierState]:
        url = self.schemas.url(self.schemas.new())
        return [self._track(s) for s in _concurrently(n, lambda: open_store(url))]

    def fresh(self) -> VerifierState:
        import psycopg

        if self._fresh_store is None:
            self._fresh_store = self._track(open_store(self.schemas.url(self.schemas.new())))
        schema = self._fresh_store.schema  # type: ignore[attr-defined]
        with psycopg.connect(self.schemas.base_url, autocommit=True) as conn:
            conn.execute(
                f'TRUNCATE "{schema}".consumed_nonces, "{schema}".child_sets, "{schema}".children,'
                f' "{schema}".verdict_log, "{schema}".verdict_paths, "{schema}".verdict_path_uses'
            )
        return self._fresh_store

    def outage(self) -> contextlib.AbstractContextManager[None] | None:
        return self.proxy.outage()

    def close(self) -> None:
        super().close()
        self.proxy.close()


class DynamoDbHarness(StoreHarness):
    name = "dynamodb_emulator"

    def __init__(self, endpoint: str) -> None:
        from verifier.stores.dynamodb import ensure_table

        super().__init__()
        self.endpoint = endpoint
        self.table = f"cs-test-{uuid.uuid4().hex[:12]}"
        host, port = _host_port(endpoint)
        self.proxy = TcpProxy(host, port)
        ensure_table(dynamodb_url(endpoint, self.table))
        self.url = dynamodb_url(f"http://{self.proxy.address}", self.table, max_attempts=2, connect_timeout=1)
        self._fresh_store: VerifierState | None = None

    def open(self) -> VerifierState:
        return self._track(open_store(self.url))

    def open_many_concurrently(self, n: int) -> list[VerifierState]:
        from verifier.stores.dynamodb import ensure_table

        url = dynamodb_url(self.endpoint, f"cs-test-{uuid.uuid4().hex[:12]}")

        def opener() -> VerifierState:
            ensure_table(url)  # what a deploy script would do; Terraform in production
            return open_store(url)

        return [self._track(s) for s in _concurrently(n, opener)]

    def fresh(self) -> VerifierState:
        if self._fresh_store is None:
            from verifier.stores.dynamodb import ensure_table

            url = dynamodb_url(self.endpoint, f"cs-test-{uuid.uuid4().hex[:12]}")
            ensure_table(url)
            self._fresh_store = self._track(open_store(url))
        client: Any = self._fresh_store._client  # type: ignore[attr-defined]
        table = self._fresh_store.table  # type: ignore[attr-defined]
        request: dict[str, Any] = {"TableName": table, "ProjectionExpression": "pk, sk"}
        while True:
            page = client.scan(**request)
            for item in page["Items"]:
                client.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        self._fresh_store._scan_cursor = None  # type: ignore[attr-defined]
        return self._fresh_store

    def outage(self) -> contextlib.AbstractContextManager[None] | None:
        return self.proxy.outage()

    def close(self) -> None:
        super().close()
        self.proxy.close()


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (5432 if parts.scheme.startswith("postgres") else 80)


def _replace_host_port(url: str, address: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit((parts.scheme, userinfo + address, parts.path, parts.query, parts.fragment))


BACKENDS = [
    pytest.param("memory", id="memory", marks=pytest.mark.offline),
    pytest.param("sqlite", id="sqlite", marks=pytest.mark.offline),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("dynamodb_emulator", id="dynamodb_emulator", marks=pytest.mark.dynamodb_emulator),
]


# Backends with a server that can go away (the in-memory store lives inside the process).
OUTAGE_BACKENDS = BACKENDS[1:]


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    yield from _harness(request, tmp_path)


@pytest.fixture(params=OUTAGE_BACKENDS)
def outage_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    yield from _harness(request, tmp_path)


def _harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreHarness]:
    kind = request.param
    made: StoreHarness
    if kind == "memory":
        made = MemoryHarness()
    elif kind == "sqlite":
        made = SqliteHarness(tmp_path)
    elif kind == "postgresql":
        made = PostgresHarness(request.getfixturevalue("pg_schemas"))
    else:
        made = DynamoDbHarness(request.getfixturevalue("dynamodb_emulator"))
    yield made
    made.close()
