"""The compose file's own commands, environment and start order, run as local processes (see
tests/docker/compose_local.py for what is and is not replaced), and docker/healthcheck.py against
real daemons: the compose flow without a Docker engine, quick to run (the container tier,
tests/docker/test_containers_e2e.py, runs the same file in containers).

deployer-a's signer runs as two replicas over one PostgreSQL schema, and the one answering the demo's
runtime is SIGKILLed while the demo issues the Planner's session (tests/docker/replica_kill.py): every
signing call still succeeds, the final path verifies and the session verifies as one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign_cli.localmesh import LocalMesh
from tests.docker.compose_local import LocalCompose
from tests.docker.conftest import DOCKER_DIR, Dockerfile, load_compose, load_demo_flow
from tests.docker.replica_kill import RISE, kill_mid_session, signed_receipts

pytestmark = pytest.mark.daemons

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
HEALTHCHECK = DOCKER_DIR / "healthcheck.py"
REPLICAS_A = ("signer-a", "signer-a2")


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
    assert set(mesh.running) == {"coordinator", *REPLICAS_A, "signer-b", "signer-c", "verifier-1", "verifier-2"}

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
    # accept on verifier-1, replay refused on verifier-2 (shared PostgreSQL state); deployer-a's
    # replica answering the Planner's session is SIGKILLed while the session is being issued.
    hold = mesh.workdir / "hold"
    metrics = {name: mesh.address(name, 9401) for name in REPLICAS_A}
    killed = kill_mid_session(mesh.start_job("demo", "--hold", str(hold)), hold, metrics, mesh.kill)
    out = killed.output
    assert killed.returncode == 0, f"{out}\n{mesh.log_tail(killed.survivor)}"
    assert mesh.running[killed.victim].process.returncode == -signal.SIGKILL
    assert "all outcomes as expected" in out and "BAD" not in out, out
    assert "REJECT NONCE_REPLAYED" in out and "REJECT OUTPUT_MISMATCH" in out
    assert re.search(r"ok +the Planner's session, \d+ receipts \(replica 1\) +ACCEPT", out), out
    assert re.search(r"ok +final output of the Writer \(replica 1\) +ACCEPT", out), out
    session = re.search(r"the Planner's session: (\d+) receipts and its close, seq 0-(\d+), .*\(2 replicas\)", out)
    assert session, out
    receipts, last_seq = int(session.group(1)), int(session.group(2))
    # The turns before and after the hold, and at least RISE receipts from each replica while held.
    assert last_seq == receipts and receipts >= 2 * load_demo_flow().PLANNER_TURNS + 2 * RISE, out
    # The session lives in deployer-a's own schema, where both replicas wrote it: one row, closed at
    # the last seq the runtime saw.
    import psycopg
    from psycopg import sql

    schema = next(s for s in mesh.schemas if s.startswith("countersign_signer_a_"))
    with psycopg.connect(mesh.postgres_url, autocommit=True) as conn:
        query = sql.SQL("SELECT seq, closed FROM {}.agent_sessions WHERE session = 'planner'")
        rows = conn.execute(query.format(sql.Identifier(schema))).fetchall()
    assert rows == [(last_seq, True)], rows
    assert not (volumes / "signer-a-state" / "signer.db").exists(), "deployer-a keeps no SQLite state"

    # The killed replica restarts on the same state and serves alone: the demo again, deployer-a's
    # runtime and the delegation's parent_signer naming only it.
    mesh.start_daemon(killed.victim)
    mesh.wait_healthy(killed.victim, 90)
    alone = mesh.translate("demo", f"deployer-a={killed.victim}:7401,deployer-b=signer-b:7401,deployer-c=signer-c:7401")
    demo = mesh.run_job("demo", "--signers", alone, timeout_s=120)
    assert demo.returncode == 0 and "all outcomes as expected" in demo.stdout, demo.stdout + demo.stderr
    assert "(1 replica)" in demo.stdout
    assert signed_receipts(metrics[killed.victim]) > 0

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
