"""Signer state on PostgreSQL, one database and login role per deployer: infra/postgres/signer-state.sql
run by psql against a real PostgreSQL (this machine's, the one the project's store tests use), then
the signer's own migrations run as that role, and the other deployer's role refused.

The server here accepts every local login without a password (trust), so what this shows is the
privileges (CONNECT, ownership), not the password check; RDS checks the password as well. Every
name is unique to the run and dropped afterwards; the server's existing databases are not touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SQL = REPO_ROOT / "infra" / "postgres" / "signer-state.sql"
PROJECT_PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
# The same server the project's store tests use (tests/stores/conftest.py).
SERVER_URL = os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _url(user: str | None = None, database: str | None = None, query: str = "") -> str:
    parts = urlsplit(SERVER_URL)
    netloc = parts.netloc if user is None else f"{user}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, f"/{database}" if database else parts.path, query, ""))


def _psql(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGCONNECT_TIMEOUT": "5"}
    return subprocess.run(
        ["psql", url, "-X", "-q", "-v", "ON_ERROR_STOP=1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.fixture(scope="module")
def server() -> str:
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    probe = _psql(SERVER_URL, "-c", "SELECT 1")
    if probe.returncode != 0:
        pytest.skip(f"no PostgreSQL at {SERVER_URL}: {probe.stderr.strip()}")
    return SERVER_URL


@pytest.fixture
def names(server: str) -> Iterator[dict[str, str]]:
    run = uuid.uuid4().hex[:10]
    made = {
        "shared": f"cs_infra_{run}_shared",  # stands for the RDS database "countersign"
        "a": f"countersign_signer_t{run}_a",
        "b": f"countersign_signer_t{run}_b",
    }
    created = _psql(server, "-c", f'CREATE DATABASE "{made["shared"]}"')
    assert created.returncode == 0, created.stderr
    try:
        yield made
    finally:
        for name in (made["a"], made["b"], made["shared"]):
            _psql(server, "-c", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for name in (made["a"], made["b"]):
            _psql(server, "-c", f'DROP ROLE IF EXISTS "{name}"')


def _provision(names: dict[str, str], deployer: str) -> None:
    result = _psql(
        _url(database=names["shared"]),
        "-v",
        f"name={names[deployer]}",
        "-v",
        f"password=pw-{uuid.uuid4().hex}",
        "-f",
        str(SQL),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_deployer_role_reaches_only_its_own_database(names: dict[str, str]) -> None:
    _provision(names, "a")
    _provision(names, "b")
    a, b, shared = names["a"], names["b"], names["shared"]

    # Each role uses its own database: it may create a schema and tables there.
    for own in (a, b):
        made = _psql(
            _url(own, own), "-c", "CREATE SCHEMA probe; CREATE TABLE probe.t (x int); INSERT INTO probe.t VALUES (1)"
        )
        assert made.returncode == 0, made.stderr

    # Neither may connect to the other's database, nor to the shared one.
    for user, database in ((a, b), (b, a), (a, shared), (b, shared)):
        refused = _psql(_url(user, database), "-c", "SELECT 1")
        assert refused.returncode != 0, f"{user} connected to {database}"
        assert "permission denied for database" in refused.stderr, refused.stderr

    # Nor is either a superuser, or able to create roles or databases.
    flags = _psql(
        _url(database=shared),
        "-At",
        "-c",
        "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles"
        f" WHERE rolname IN ('{a}', '{b}') ORDER BY 1",
    )
    assert flags.stdout.split() == [f"{a}|f|f|f", f"{b}|f|f|f"]


def test_the_signer_migrates_its_state_as_its_own_role(names: dict[str, str]) -> None:
    """The signer store's own migrations (signer/stores/migrations/postgres) need nothing beyond what
    the script grants: run through the project's PostgresState as the deployer's role."""
    if not PROJECT_PYTHON.exists():
        pytest.skip(f"{PROJECT_PYTHON} is missing: run `make venv` to check the signer's migrations")
    _provision(names, "a")
    url = _url(names["a"], names["a"], "sslmode=disable&schema=countersign_signer")
    code = (
        "import sys; from signer.stores.postgres import PostgresState\n"
        "state = PostgresState(sys.argv[1]); print(state.schema); state.close()\n"
    )
    migrated = subprocess.run(
        [str(PROJECT_PYTHON), "-c", code, url], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    assert migrated.stdout.strip() == "countersign_signer"
    tables = _psql(
        _url(names["a"], names["a"]),
        "-At",
        "-c",
        "SELECT tablename FROM pg_tables WHERE schemaname = 'countersign_signer' ORDER BY 1",
    )
    assert {"grants", "issued", "requests"} <= set(tables.stdout.split()), tables.stdout
    # The other deployer's role, provisioned the same way, cannot reach those tables at all.
    _provision(names, "b")
    refused = _psql(_url(names["b"], names["a"]), "-c", "SELECT count(*) FROM countersign_signer.grants")
    assert refused.returncode != 0 and "permission denied for database" in refused.stderr
