"""The real thing, where a Docker engine is reachable: build the images, bring docker/compose.yaml up
with testcontainers' DockerCompose (init, PostgreSQL, coordinator, three signers, two verifiers,
enrolment), run the demo flow in its own container, restart a signer and check that its state
survived, and tear everything down with its volumes.

Without an engine (``docker info`` fails, as on this project's machines) the test SKIPS and says
so; tests/docker/test_compose_flow.py then runs the same compose commands as local processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest

from tests.docker.conftest import DOCKER_DIR
from tests.ports import free_port

pytestmark = pytest.mark.daemons

PORT_VARIABLES = [
    f"MESH_{kind}_{service}"
    for kind in ("PORT", "METRICS_PORT")
    for service in ("COORDINATOR", "SIGNER_A", "SIGNER_B", "SIGNER_C", "VERIFIER_1", "VERIFIER_2")
]


def docker_engine_problem() -> str | None:
    """Why the end-to-end test cannot run here, or None when it can."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    try:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0:
        reason = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine reachable (`docker info` failed: {reason})"
    compose = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False)
    if compose.returncode != 0:
        return "the docker CLI has no compose plugin (`docker compose version` failed)"
    return None


@pytest.fixture
def compose_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A project name and host ports of its own, so runs never collide with each other or a dev mesh."""
    values = {"COMPOSE_PROJECT_NAME": f"countersign-e2e-{uuid.uuid4().hex[:8]}"}
    values |= {name: str(free_port()) for name in PORT_VARIABLES}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def compose(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "compose", "--file", "compose.yaml", *args],
        cwd=DOCKER_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=os.environ.copy(),
    )


@pytest.mark.slow
def test_containers_end_to_end_requires_docker_engine(compose_environment: dict[str, str]) -> None:
    problem = docker_engine_problem()
    if problem is not None:
        pytest.skip(f"{problem}: the container end-to-end test needs a Docker engine with compose")
    from testcontainers.compose import DockerCompose

    # up --build --detach: builds both targets of docker/Dockerfile, then starts the default services.
    stack = DockerCompose(DOCKER_DIR, compose_file_name="compose.yaml", build=True, wait=False)
    with stack:
        # The demo's depends_on waits for enrol to finish and every daemon to report healthy.
        demo = compose("--profile", "demo", "run", "--rm", "demo")
        logs = "" if demo.returncode == 0 else "\n".join(stack.get_logs())
        assert demo.returncode == 0, f"{demo.stdout}\n{demo.stderr}\n{logs}"
        assert "all outcomes as expected" in demo.stdout
        assert "REJECT NONCE_REPLAYED" in demo.stdout

        for service in ("coordinator", "signer-a", "signer-b", "signer-c", "verifier-1", "verifier-2"):
            container = stack.get_container(service)
            assert container.State == "running", service
            inspect = subprocess.run(
                ["docker", "inspect", "--format", "{{.State.Health.Status}} {{.Config.User}}", container.ID],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            health, user = inspect.stdout.split()
            assert health == "healthy" and user == "10001:10001", (service, inspect.stdout)
            for publisher in container.Publishers or []:
                if publisher.PublishedPort:
                    assert publisher.URL in ("127.0.0.1", None), (service, publisher)

        # A signer restarted keeps its SQLite state and registry copy (its volume), and the mesh
        # still delegates through it: the demo runs again.
        restarted = compose("restart", "signer-b", timeout=120)
        assert restarted.returncode == 0, restarted.stderr
        again = compose("--profile", "demo", "run", "--rm", "demo")
        assert again.returncode == 0, f"{again.stdout}\n{again.stderr}"
        state = compose("exec", "-T", "signer-b", "ls", "/var/lib/countersign", timeout=60)
        assert "signer.db" in state.stdout and "registry.json" in state.stdout, state.stdout + state.stderr

        # SIGTERM drains and exits 0.
        stopped = compose("stop", "verifier-2", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        code = subprocess.run(
            ["docker", "inspect", "--format", "{{.State.ExitCode}}", stack.get_container("verifier-2", True).ID],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert code.stdout.strip() == "0", code.stdout


def test_engine_probe_explains_itself() -> None:
    problem = docker_engine_problem()
    assert problem is None or problem.startswith(("no docker CLI", "no Docker engine", "`docker info`", "the docker"))
