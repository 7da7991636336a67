"""The compose file's own commands, environment and start order, run as local processes (see
tests/docker/compose_local.py for what is and is not replaced), and docker/healthcheck.py against
real daemons: the compose flow without a Docker engine, quick to run (the container tier,
tests/docker/test_containers_e2e.py, runs the same file in containers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign_cli.localmesh import LocalMesh
from tests.docker.compose_local import LocalCompose
from tests.docker.conftest import DOCKER_DIR, Dockerfile, load_compose

pytestmark = pytest.mark.daemons

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
HEALTHCHECK = DOCKER_DIR / "healthcheck.py"


def postgres_url() -> str:
    """The test server, as for the store tests; unreachable is a failure, not a skip."""
    import psycopg

    url = os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    try:
        with psycopg.connect(url, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        pytest.fail(f"PostgreSQL at {url} is unreachable ({exc}); start it or set COUNTERSIGN_TEST_POSTGRES_URL")
    return url


@pytest.fixture
def local_compose(tmp_path: Path, dockerfile: Dockerfile) -> Iterator[LocalCompose]:
    mesh = LocalCompose(load_compose(), dockerfile, tmp_path, postgres_url(), uuid.uuid4().hex[:10])
    try:
        yield mesh
    finally:
        mesh.down()


@pytest.mark.daemons
@pytest.mark.postgres
@pytest.mark.slow
def test_compose_flow_as_local_processes(local_compose: LocalCompose) -> None:
    mesh = local_compose
    # init -> (PostgreSQL) -> coordinator -> signers, verifiers -> enrol, each on its condition.
    mesh.up(["demo"])
    assert set(mesh.running) == {"coordinator", "signer-a", "signer-b", "signer-c", "verifier-1", "verifier-2"}

    # What init left in each volume: only the service's own material, keys private.
    volumes = mesh.workdir / "volumes"
    assert sorted(p.name for p in (volumes / "signer-a-secrets").iterdir()) == [
        "ca.pem",
        "signer.jwk",
        "tls.key",
        "tls.pem",
    ]
    for private in ("signer-a-secrets/signer.jwk", "signer-a-secrets/tls.key", "db/pgpass", "ca/ca.key"):
        assert (volumes / private).stat().st_mode & 0o077 == 0, private
    assert not list((volumes / "public").glob("*.key")) and not list((volumes / "public").glob("*.jwk"))
    operator = json.loads((volumes / "public" / "operator.pub.json").read_text())
    assert f'operator_public_key = "{operator["public_key"]}"' in (volumes / "public" / "operator.toml").read_text()

    # The demo flow through the compose service's own command: delegation across three signers,
    # accept on verifier-1, replay refused on verifier-2 (shared PostgreSQL state).
    demo = mesh.run_job("demo", timeout_s=120)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "all outcomes as expected" in demo.stdout
    assert "REJECT NONCE_REPLAYED" in demo.stdout and "REJECT OUTPUT_MISMATCH" in demo.stdout

    # Both jobs are safe to run again (docker compose up after a restart).
    again = mesh.run_job("init")
    assert again.returncode == 0 and "already initialised" in again.stdout, again.stdout + again.stderr
    again = mesh.run_job("enrol")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("is already enrolled") == 3

    # Signer state persists in its volume: a restarted signer keeps its registry copy and database.
    assert (volumes / "signer-b-state" / "signer.db").is_file()
    assert len(json.loads((volumes / "signer-b-state" / "registry.json").read_text())["statements"]) == 3

    # Graceful shutdown: every daemon exits 0 on SIGTERM.
    codes = mesh.down()
    assert codes == dict.fromkeys(codes, 0), codes


@pytest.mark.daemons
def test_healthcheck_reports_serving_then_not(tmp_path: Path) -> None:
    """docker/healthcheck.py finds each daemon's settings itself and asks grpc.health.v1 over mTLS."""
    mesh = LocalMesh(tmp_path / "mesh", deployers=("deployer-a",), verifiers=1).setup()
    try:
        mesh.start_all()
        for name, daemon in mesh.daemons.items():
            assert daemon.process is not None
            result = probe("--pid", str(daemon.process.pid))
            assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
            assert result.stdout.strip().endswith(": SERVING"), result.stdout
            assert daemon.kind in result.stdout
        coordinator = mesh.daemons["coordinator"]
        assert coordinator.process is not None
        pid = coordinator.process.pid
        mesh.stop("coordinator")
        result = probe("--pid", str(pid))
        assert result.returncode == 1 and result.stdout.startswith("unhealthy:"), result.stdout
    finally:
        mesh.stop_all()


def test_healthcheck_fails_without_a_daemon() -> None:
    result = probe("--pid", str(os.getpid()))
    assert result.returncode == 1 and "not a daemon" in result.stdout


def test_healthcheck_reads_the_daemon_command_line() -> None:
    sys.path.insert(0, str(DOCKER_DIR))
    try:
        import healthcheck
    finally:
        sys.path.remove(str(DOCKER_DIR))
    daemon_of = healthcheck.daemon_of
    assert daemon_of(["/opt/countersign/bin/python", "/opt/countersign/bin/countersign", "signer", "serve"]) == (
        "signer",
        None,
    )
    assert daemon_of(["/sbin/docker-init", "--", "countersign", "verifier", "serve", "--config", "/c.toml"]) == (
        "verifier",
        "/c.toml",
    )
    assert daemon_of(["python", "-m", "countersign_cli", "coordinator", "serve", "--config=x.toml"]) == (
        "coordinator",
        "x.toml",
    )
    assert daemon_of(["countersign", "pki", "init"]) is None
    assert daemon_of(["other", "signer", "serve"]) is None


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args], capture_output=True, text=True, timeout=60, check=False
    )
