"""The real containers, on the LOCAL STAND-IN base image (docker/local-base/build.sh): everything above
the base is docker/Dockerfile itself, built with ``--build-arg PYTHON_IMAGE=<local base>``, and the
mesh is docker/compose.yaml on host networking (tests/docker/compose_host.py says what that changes).

The compose mesh: PostgreSQL (the local stand-in postgres image, on its own loopback port, never the
machine's 5432), init, coordinator, deployer-a's two signer replicas (on PostgreSQL) and one signer
each for deployer-b and deployer-c, two verifier replicas, enrolment; then the demo flow through it,
during which the deployer-a replica answering the Planner's session is killed (``docker kill``,
tests/docker/replica_kill.py) and the flow still completes; the killed replica started again and
serving alone; a crash and automatic restart of one verifier container, and the replay of the path
accepted before the crash, which both replicas must still refuse.

Run by ``make containers`` (docker/engine.sh starts an engine with host networking only). Where no
engine is reachable these tests skip and say why; under that target they fail instead.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docker.compose_host import DEMO_OUT, LOOPBACK, HostNetworkCompose, host_network_variant, raw_compose
from tests.docker.conftest import RUNTIME_UID
from tests.docker.containers import compose_command, docker, inspect
from tests.docker.replica_kill import kill_mid_session, signed_receipts
from tests.ports import free_port

pytestmark = [pytest.mark.containers, pytest.mark.slow]

DAEMONS = ("coordinator", "signer-a", "signer-a2", "signer-b", "signer-c", "verifier-1", "verifier-2")
REPLICAS_A = ("signer-a", "signer-a2")
SAVED_PATH = f"{DEMO_OUT}/accepted-path.bin"
HOLD = "hold"  # in the demo's output directory


# --- the image ------------------------------------------------------------------------------------


def test_image_on_local_base_image_is_non_root_with_the_grpc_health_check(
    countersign_images: dict[str, str], local_base_images: Any
) -> None:
    runtime = countersign_images["runtime"]
    assert inspect(runtime, "{{.Config.User}}") == f"{RUNTIME_UID}:{RUNTIME_UID}"
    assert inspect(runtime, "{{json .Config.Healthcheck.Test}}") == (
        '["CMD","/opt/countersign/bin/python","/usr/local/lib/countersign/healthcheck.py"]'
    )
    assert inspect(runtime, "{{json .Config.Entrypoint}}") == '["countersign"]'
    # The stand-in base is the one the build was given (its recipe label is inherited).
    assert (
        inspect(runtime, '{{index .Config.Labels "io.countersign.local-base.recipe"}}')
        == (local_base_images.python.rsplit("-", 1)[1])
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return docker("run", "--rm", "--network", "host", *args, timeout=120, check=False)

    help_text = run(runtime, "--help")
    assert help_text.returncode == 0 and "coordinator" in help_text.stdout, help_text.stdout + help_text.stderr
    who = run("--entrypoint", "id", runtime)
    assert who.stdout.split()[0] == f"uid={RUNTIME_UID}(countersign)", who.stdout
    # No installer is left in the runtime venv, and the sources are not in the image.
    probe = run(
        "--entrypoint",
        "/opt/countersign/bin/python",
        runtime,
        "-c",
        "import importlib.util as u; print(u.find_spec('pip') is None, u.find_spec('countersign_cli') is not None)",
    )
    assert probe.stdout.split() == ["True", "True"], probe.stdout + probe.stderr
    listing = run("--entrypoint", "ls", runtime, "/")
    assert "src" not in listing.stdout.split(), listing.stdout
    # The health probe says "not serving" (exit 1) when no daemon runs, in one line.
    health = run("--entrypoint", "/opt/countersign/bin/python", runtime, "/usr/local/lib/countersign/healthcheck.py")
    assert health.returncode == 1 and health.stdout.startswith("unhealthy:"), health.stdout + health.stderr


# --- the compose mesh -------------------------------------------------------------------------------


@dataclass
class ComposeMesh:
    command: list[str]
    project: str
    file: Path
    variant: HostNetworkCompose
    environment: dict[str, str]
    demo_out: Path  # the demo job's writable directory (DEMO_OUT inside it)

    def argv(self, *args: str) -> list[str]:
        return [*self.command, "--project-name", self.project, "--file", str(self.file), *args]

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            cwd=self.file.parent,
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def container(self, service: str) -> str:
        found = docker(
            "ps",
            "--all",
            "--quiet",
            "--filter",
            f"label=com.docker.compose.project={self.project}",
            "--filter",
            f"label=com.docker.compose.service={service}",
            timeout=60,
        ).stdout.split()
        assert len(found) == 1, f"{service}: containers {found}"
        return found[0]

    def demo(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """The demo service's own command (its host-network addresses), plus ``extra``, once every daemon
        is healthy. Without its dependencies: Compose v1's ``run`` first runs init and enrol again, then
        refuses at once a daemon whose health probe timed out meanwhile (5 s, too short on a loaded
        machine), where this waits for it. The first demo run (:meth:`start_demo`) goes through them."""
        self.wait_healthy(DAEMONS)
        command = self.variant.document["services"]["demo"]["command"]
        return self("--profile", "demo", "run", "--rm", "-T", "--no-deps", "demo", *command, *extra, timeout=300)

    def start_demo(self, *extra: str) -> subprocess.Popen[str]:
        """The demo as a user runs it (``run --rm demo``: through its dependencies, init and enrol again
        and every daemon healthy), plus ``extra``, left running: its output (stderr merged in) is a pipe
        to read as it goes."""
        command = self.variant.document["services"]["demo"]["command"]
        return subprocess.Popen(
            self.argv("--profile", "demo", "run", "--rm", "-T", "demo", *command, *extra),
            cwd=self.file.parent,
            env=self.environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def logs(self) -> str:
        return self("logs", "--no-color", "--tail", "40", timeout=120).stdout

    def health(self) -> str:
        """Each daemon's state and the last answer of its health check (for a failure's message)."""
        template = (
            "{{.State.Status}}/{{.State.Health.Status}} {{with .State.Health}}{{range .Log}}{{.Output}}{{end}}{{end}}"
        )
        return "\n".join(f"{s}: {inspect(self.container(s), template).strip()[-400:]}" for s in DAEMONS)

    def wait_healthy(self, services: tuple[str, ...], timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {s: inspect(self.container(s), "{{.State.Status}}/{{.State.Health.Status}}") for s in services}
            if all(state == "running/healthy" for state in states.values()):
                return
            time.sleep(1)
        raise AssertionError(f"not healthy after {timeout_s} s: {states}\n{self.logs()}")


@pytest.fixture
def compose_mesh(tmp_path: Path, countersign_images: dict[str, str], local_base_images: Any) -> Iterator[ComposeMesh]:
    command = compose_command()
    if command is None:
        pytest.fail("no Compose here: neither `docker compose` nor `docker-compose` (docker/requirements.sh)")
    demo_out = tmp_path / "demo-out"
    demo_out.mkdir()
    os.chown(demo_out, RUNTIME_UID, RUNTIME_UID)  # the demo job runs as the image's user
    variant = host_network_variant(raw_compose(), free_port, demo_out=str(demo_out))
    file = tmp_path / "compose.host.yaml"
    file.write_text(variant.to_yaml())
    environment = {
        **os.environ,
        "COUNTERSIGN_IMAGE": countersign_images["runtime"],
        "COUNTERSIGN_DEV_MESH_IMAGE": countersign_images["dev-mesh"],
        "POSTGRES_IMAGE": local_base_images.postgres,
    }
    mesh = ComposeMesh(command, f"countersign-e2e-{uuid.uuid4().hex[:8]}", file, variant, environment, demo_out)
    try:
        yield mesh
    finally:
        down = mesh("--profile", "demo", "down", "--volumes", "--remove-orphans", "--timeout", "20", timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr


def listening_addresses(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the TCP listeners on ``port`` (host networking: the host's own sockets);
    an IPv4-mapped IPv6 address (gRPC's dual-stack socket) counts as its IPv4 address."""
    result = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=30, check=True)
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for line in result.stdout.splitlines():
        if line.strip():
            address = ipaddress.ip_address(line.split()[3].rsplit(":", 1)[0].strip("[]"))
            mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
            found.add(mapped or address)
    return found


def test_compose_mesh_on_local_base_image_survives_a_signer_replica_killed_and_a_verifier_crash(
    compose_mesh: ComposeMesh,
) -> None:
    mesh = compose_mesh
    up = mesh("up", "--detach", timeout=600)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{mesh.logs()}"
    mesh.wait_healthy(DAEMONS)

    # Every daemon: the built image, its non-root user, hardened, host networking on loopback only.
    for service in DAEMONS:
        container = mesh.container(service)
        assert inspect(container, "{{.Config.Image}}") == mesh.environment["COUNTERSIGN_IMAGE"], service
        assert inspect(container, "{{.Config.User}}") == f"{RUNTIME_UID}:{RUNTIME_UID}", service
        assert inspect(container, "{{.HostConfig.NetworkMode}} {{.HostConfig.ReadonlyRootfs}}") == "host true"
        assert inspect(container, "{{json .HostConfig.CapDrop}}") == '["ALL"]', service
    for (service, _), port in mesh.variant.ports.items():
        if service in (*DAEMONS, "postgres"):
            assert listening_addresses(port) == {ipaddress.ip_address(LOOPBACK)}, (service, port)
    for service in ("init", "enrol"):
        assert inspect(mesh.container(service), "{{.State.Status}} {{.State.ExitCode}}") == "exited 0", service

    # The demo flow through the mesh: two co-signed cross-deployer edges, accept on verifier-1, the
    # replay refused on verifier-2 (the shared PostgreSQL nonce store), substituted output rejected;
    # while it issues the Planner's session, the deployer-a replica answering it is killed.
    containers = {name: mesh.container(name) for name in REPLICAS_A}
    replica_restarts = {name: int(inspect(c, "{{.RestartCount}}")) for name, c in containers.items()}
    killed = kill_mid_session(
        mesh.start_demo("--save-path", SAVED_PATH, "--hold", f"{DEMO_OUT}/{HOLD}"),
        mesh.demo_out / HOLD,
        {name: mesh.variant.address(name, 9401) for name in REPLICAS_A},
        lambda name: docker("kill", containers[name], timeout=60),
    )
    out = killed.output
    assert killed.returncode == 0, f"{out}\n{mesh.logs()}"
    assert "all outcomes as expected" in out and "BAD" not in out, out
    assert "REJECT NONCE_REPLAYED" in out and "REJECT OUTPUT_MISMATCH" in out, out
    assert re.search(r"ok +the Planner's session, \d+ receipts \(replica 1\) +ACCEPT", out), out
    assert re.search(r"the Planner's session: \d+ receipts and its close, .*\(2 replicas\)", out), out
    # SIGKILL (exit 137), and `docker kill` leaves it down (the restart policy waits for a start).
    victim = containers[killed.victim]
    assert inspect(victim, "{{.State.Status}} {{.State.ExitCode}}") == "exited 137"
    assert int(inspect(victim, "{{.RestartCount}}")) == replica_restarts[killed.victim]
    mesh.wait_healthy((killed.survivor,))

    # Started again, the killed replica serves on the same state alone: deployer-a's runtime and the
    # delegation's parent_signer name only it.
    started = mesh("start", killed.victim, timeout=120)
    assert started.returncode == 0, started.stderr
    mesh.wait_healthy((killed.victim,))
    alone = ",".join(
        f"{deployer}={mesh.variant.address(service, 7401)}"
        for deployer, service in (("deployer-a", killed.victim), ("deployer-b", "signer-b"), ("deployer-c", "signer-c"))
    )
    again = mesh.demo("--signers", alone)
    assert again.returncode == 0, f"{again.stdout}{again.stderr}\n{mesh.health()}"
    assert "all outcomes as expected" in again.stdout, again.stdout
    assert "(1 replica)" in again.stdout and signed_receipts(mesh.variant.address(killed.victim, 9401)) > 0

    # verifier-1 crashes (SIGKILL to its daemon, not `docker stop`): the restart policy brings it back.
    verifier = mesh.container("verifier-1")
    restarts = int(inspect(verifier, "{{.RestartCount}}"))
    os.kill(int(inspect(verifier, "{{.State.Pid}}")), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while int(inspect(verifier, "{{.RestartCount}}")) == restarts:
        assert time.monotonic() < deadline, f"verifier-1 was not restarted:\n{mesh.logs()}"
        time.sleep(0.5)
    mesh.wait_healthy(("verifier-1",))

    # The path accepted before the crash is still a replay, on the restarted replica and the other.
    replicas = ",".join(mesh.variant.address(v, 7402) for v in ("verifier-1", "verifier-2"))
    replay = mesh("--profile", "demo", "run", "--rm", "-T", "--no-deps", "demo", "--verifiers", replicas,
                  "--tls-dir", "/run/countersign/demo", "--replay", SAVED_PATH, timeout=120)  # fmt: skip
    assert replay.returncode == 0, f"{replay.stdout}\n{replay.stderr}\n{mesh.logs()}"
    assert replay.stdout.count("REJECT NONCE_REPLAYED") == 2 and "every replay refused" in replay.stdout

    # The restarted verifier still accepts new work: the whole demo again.
    again = mesh.demo()
    assert again.returncode == 0 and "all outcomes as expected" in again.stdout, again.stdout + again.stderr

    # A signer restarted by compose keeps its state (its volume), and SIGTERM drains and exits 0.
    restarted = mesh("restart", "signer-b", timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    mesh.wait_healthy(("signer-b",))
    state = mesh("exec", "-T", "signer-b", "ls", "/var/lib/countersign", timeout=60)
    assert {"signer.db", "registry.json"} <= set(state.stdout.split()), state.stdout + state.stderr
    stopped = mesh("stop", "verifier-2", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    assert inspect(mesh.container("verifier-2"), "{{.State.Status}} {{.State.ExitCode}}") == "exited 0"
