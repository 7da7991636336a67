"""Fixtures of the replica tests: verifier processes sharing ONE real PostgreSQL store.

* ``replicas``: a factory that starts a mesh in the test's own ``tmp_path`` with N verifier processes
  (``python -m countersign_cli verifier serve``) whose ``store_url`` is a fresh schema of the test server
  (``COUNTERSIGN_TEST_POSTGRES_URL``, default this machine's server; see tests/stores/conftest.py).
  Only the coordinator and the verifiers run: paths are issued in process with the mesh's enrolled
  deployer keys (``ReplicaSet.paths``), which is far faster than going through the signer daemons.
* The schema is dropped after the test. If PostgreSQL cannot be reached the tests FAIL.
* ``FailoverClient``: the client-side retry policy of docs/replicas.md, recording every attempt.
* ``PgCluster``: stops and starts this machine's PostgreSQL cluster (root, ``pg_ctlcluster``); the
  fixture ``pg_cluster`` always leaves the server running and ready, even when the test fails.

When a test fails, the tail of each daemon's log is attached to the report.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from countersign.client import VerifierClient
from countersign.constructions import RecordFields, issue
from countersign.errors import ServiceError
from countersign.keys import Ed25519Signer
from countersign.records import AgentRef, Construction, Path
from countersign.samples import SampleMesh
from countersign_cli.localmesh import LocalMesh
from tests.stores.conftest import PostgresSchemas, dynamodb_emulator, postgres_base_url

T = TypeVar("T")
__all__ = ["dynamodb_emulator"]  # the DynamoDB emulator fixture, for the signer replica tests

PARENT_DEPLOYER = "deployer-a"
CHILD_DEPLOYER = "deployer-b"
HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def poll(check: Callable[[], T | None], *, timeout_s: float, interval_s: float = 0.05, what: str) -> T:
    """Call ``check`` until it returns something truthy; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last value {last!r}")
        time.sleep(interval_s)


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
            f"the replica tests need a PostgreSQL server: could not connect to {url!r} ({exc}). Start the local"
            " server or set COUNTERSIGN_TEST_POSTGRES_URL (these tests fail rather than skip on purpose).",
            pytrace=False,
        )
    return url


@pytest.fixture
def pg_schemas(postgres_server: str) -> Iterator[PostgresSchemas]:
    schemas = PostgresSchemas(postgres_server)
    yield schemas
    schemas.drop_all()


class PgCluster:
    """This machine's PostgreSQL cluster, driven as root through ``pg_ctlcluster``."""

    def __init__(self, base_url: str) -> None:
        if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None:
            pytest.fail("restarting PostgreSQL needs root and pg_ctlcluster (this machine's cluster)", pytrace=False)
        root = FilePath("/etc/postgresql")
        versions = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        if not versions:
            pytest.fail("no PostgreSQL cluster under /etc/postgresql", pytrace=False)
        parts = urlsplit(base_url)
        if parts.hostname not in (None, "localhost", "127.0.0.1", "::1"):
            pytest.fail(f"the test server {base_url!r} is not this machine's cluster; cannot restart it", pytrace=False)
        self.cluster = [versions[-1], "main"]
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 5432

    def ctl(self, action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", *self.cluster, action],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def ready(self) -> bool:
        """``pg_isready``: the server accepts connections."""
        tool = shutil.which("pg_isready")
        if tool is None:
            pytest.fail("pg_isready is missing (postgresql-client)", pytrace=False)
        probe = subprocess.run(
            [tool, "-h", self.host, "-p", str(self.port), "-t", "2"], capture_output=True, timeout=30, check=False
        )
        return probe.returncode == 0

    def ensure_running(self) -> None:
        """Start the cluster if it is not running, then wait until it accepts connections."""
        if self.ctl("status").returncode != 0:
            started = self.ctl("start")
            assert started.returncode == 0, f"could not start PostgreSQL again: {started.stderr}"
        poll(self.ready, timeout_s=60, interval_s=0.2, what="pg_isready after restoring PostgreSQL")


@pytest.fixture
def pg_cluster(postgres_server: str) -> Iterator[PgCluster]:
    cluster = PgCluster(postgres_server)
    try:
        yield cluster
    finally:
        cluster.ensure_running()


# --------------------------------------------------------------------------------------------
# Paths issued in process with the mesh's enrolled keys


@dataclass(frozen=True)
class Presented:
    """A path as a client presents it: the path bytes and the output its leaf binds."""

    name: str
    path: bytes
    output: bytes


class PathMaker:
    """Valid SIGNED-DAG paths signed with the deployer keys the mesh enrolled (thread-safe)."""

    def __init__(self, keys: Mapping[str, Ed25519Signer]) -> None:
        self.sample = SampleMesh(dict(keys))
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def _next(self) -> int:
        with self._lock:
            return next(self._counter)

    def fresh(self, *, ttl_ms: int = HOUR_MS) -> Presented:
        """A two-record path (deployer-a root, co-signed deployer-b leaf with an output receipt)."""
        n = self._next()
        output = f"replica test output {n}".encode()
        path = self.sample.issue_path(
            Construction.SIGNED_DAG,
            [PARENT_DEPLOYER, CHILD_DEPLOYER],
            output,
            now_ms=now_ms(),
            system=f"system-{n}",
            ttl_ms=ttl_ms,
        )
        return Presented(f"path-{n}", path.to_bytes(), output)

    def parent(self, *, max_children: int, ttl_ms: int = HOUR_MS) -> Path:
        """A root record without output: a parent for :meth:`child` paths."""
        n = self._next()
        now = now_ms()
        fields = RecordFields(
            deployer=PARENT_DEPLOYER,
            agent=AgentRef(f"parent-{n}", f"system-{n}"),
            created_ms=now - 1_000,
            expires_ms=now + ttl_ms,
            max_children=max_children,
        )
        return Path((issue(Construction.SIGNED_DAG, fields, self.sample.signers[PARENT_DEPLOYER]),))

    def child(self, parent: Path) -> Presented:
        """A path ending at a new co-signed child of ``parent`` that carries its own output receipt."""
        n = self._next()
        output = f"replica test child output {n}".encode()
        now = now_ms()
        parent_record = parent.leaf.record
        path = self.sample.issue_path(
            Construction.SIGNED_DAG,
            [CHILD_DEPLOYER],
            output,
            now_ms=now,
            system=parent_record.agent.system,
            # issue_path sets expires_ms = now + ttl_ms - depth: the child expires just before its parent.
            ttl_ms=parent_record.expires_ms - now,
            prefix=parent.envelopes,
        )
        return Presented(f"child-{n}", path.to_bytes(), output)


# --------------------------------------------------------------------------------------------
# Outcomes and the client-side failover policy


@dataclass(frozen=True)
class Outcome:
    """One presentation to one replica: ``ACCEPT``, a reject reason, or ``ERROR`` with its code."""

    replica: int
    verdict: str
    code: str = ""
    retryable: bool = False
    started: float = 0.0
    ended: float = 0.0

    @property
    def label(self) -> str:
        return f"ERROR:{self.code}" if self.verdict == "ERROR" else self.verdict

    @property
    def error(self) -> bool:
        return self.verdict == "ERROR"

    @property
    def retry_elsewhere(self) -> bool:
        """The policy of docs/replicas.md: retry a retryable error, or a transport UNAVAILABLE."""
        return self.error and (self.retryable or self.code == "UNAVAILABLE")


def present(client: VerifierClient, replica: int, item: Presented, *, audit: bool = False) -> Outcome:
    started = time.monotonic()
    try:
        result = client.verify(item.path, item.output, audit=audit).result
    except ServiceError as exc:
        return Outcome(replica, "ERROR", exc.code, exc.retryable, started, time.monotonic())
    verdict = "ACCEPT" if result else str(result.reason)
    return Outcome(replica, verdict, started=started, ended=time.monotonic())


class FailoverClient:
    """Present to one replica; on a retryable error present again to the NEXT replica, with backoff.

    Safe for an accept: the retried request either consumes the nonce (ACCEPT, once) or finds it
    consumed (NONCE_REPLAYED) by the attempt that failed in flight. Every attempt is returned.
    """

    def __init__(
        self, clients: Sequence[VerifierClient], *, max_attempts: int = 8, backoff_s: float = 0.02, cap_s: float = 0.5
    ) -> None:
        self.clients = list(clients)
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.cap_s = cap_s

    def verify(self, item: Presented, first: int, *, audit: bool = False) -> list[Outcome]:
        attempts: list[Outcome] = []
        replica = first % len(self.clients)
        for attempt in range(self.max_attempts):
            outcome = present(self.clients[replica], replica, item, audit=audit)
            attempts.append(outcome)
            if not outcome.retry_elsewhere:
                break
            time.sleep(min(self.cap_s, self.backoff_s * 2**attempt))
            replica = (replica + 1) % len(self.clients)
        return attempts


# --------------------------------------------------------------------------------------------
# Meshes of verifier replicas


@dataclass
class ReplicaSet:
    mesh: LocalMesh
    schemas: PostgresSchemas
    schema: str
    store_url: str
    clients: list[VerifierClient] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.paths = PathMaker(self.mesh.deployer_keys)

    @property
    def size(self) -> int:
        return len(self.clients)

    def name(self, replica: int) -> str:
        return f"verifier-{replica}"

    def present(self, replica: int, item: Presented, *, audit: bool = False) -> Outcome:
        return present(self.clients[replica], replica, item, audit=audit)

    def failover(self, **options: Any) -> FailoverClient:
        return FailoverClient(self.clients, **options)

    def pid(self, replica: int) -> int:
        process = self.mesh.daemons[self.name(replica)].process
        assert process is not None
        return process.pid

    def store_counts(self) -> tuple[int, int]:
        """(consumed nonces, child-set members), read from the PostgreSQL tables directly."""
        import psycopg
        from psycopg import sql

        ident = sql.Identifier(self.schema)
        query = sql.SQL("SELECT (SELECT count(*) FROM {s}.consumed_nonces), (SELECT count(*) FROM {s}.children)")
        with psycopg.connect(self.schemas.base_url, connect_timeout=5, autocommit=True) as conn:
            row = conn.execute(query.format(s=ident)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def metric(self, replica: int, name: str) -> float | None:
        """A sample of the replica's Prometheus endpoint (None if absent)."""
        daemon = self.mesh.daemons[self.name(replica)]
        url = f"http://{daemon.host}:{daemon.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:  # loopback metrics endpoint of our daemon
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        return None

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.mesh.stop_all()


_meshes_of_test: dict[str, list[LocalMesh]] = {}


@pytest.fixture
def replicas(
    tmp_path: FilePath, pg_schemas: PostgresSchemas, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ReplicaSet]]:
    """``replicas(n=3, extra_env=..., **url_params)``: a coordinator and ``n`` verifier processes sharing
    one fresh PostgreSQL schema, the deployers enrolled, one client per replica."""
    made: list[ReplicaSet] = []
    meshes: list[LocalMesh] = []
    _meshes_of_test[request.node.nodeid] = meshes

    def make(n: int = 3, *, extra_env: Mapping[str, str] | None = None, **url_params: object) -> ReplicaSet:
        schema = pg_schemas.new()
        store_url = pg_schemas.url(schema, **url_params)  # type: ignore[arg-type]  # libpq/store URL params
        mesh = LocalMesh(
            tmp_path / f"mesh-{len(meshes)}",
            deployers=(PARENT_DEPLOYER, CHILD_DEPLOYER),
            verifiers=n,
            verifier_store_url=store_url,
            extra_env=dict(extra_env or {}),
        ).setup()
        meshes.append(mesh)
        replica_set = ReplicaSet(mesh, pg_schemas, schema, store_url)
        made.append(replica_set)
        mesh.start("coordinator")
        # The replicas start together: they race to migrate the fresh schema (the advisory lock's job).
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda i: mesh.start(f"verifier-{i}", timeout_s=60), range(n)))
        mesh.enrol_all()
        replica_set.clients = [mesh.verifier_client(i) for i in range(n)]
        return replica_set

    try:
        yield make
    finally:
        for replica_set in made:
            replica_set.close()
        _meshes_of_test.pop(request.node.nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        for mesh in _meshes_of_test.get(item.nodeid, []):
            tails = "\n".join(f"--- {name} ---\n{mesh.log_tail(name, 15)}" for name in mesh.daemons)
            report.sections.append((f"daemon logs ({mesh.workdir.name})", tails))
    return report
