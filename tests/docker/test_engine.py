"""The container tier's engine (docker/engine.sh) networks through the host only: no bridge, no NAT,
no firewall rule, no forwarding; and a missing engine is explained, not hidden."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.docker.containers import OWN_ENGINE, docker, engine_problem, own_engine

pytestmark = pytest.mark.containers

PIDFILE = Path("/run/countersign-docker/dockerd.pid")
HOST_ONLY_FLAGS = {"--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"}


@pytest.fixture
def our_engine(docker_engine: None) -> None:
    if not own_engine():
        pytest.skip(
            f"the engine here is not the one docker/engine.sh starts ({OWN_ENGINE}): its networking is"
            " its owner's, so host-networking-only cannot be checked"
        )


def test_engine_runs_with_host_networking_only(our_engine: None) -> None:
    argv = set(Path(f"/proc/{PIDFILE.read_text().strip()}/cmdline").read_bytes().decode().split("\0"))
    assert argv >= HOST_ONLY_FLAGS, sorted(argv)
    drivers = set(docker("network", "ls", "--format", "{{.Driver}}", timeout=60).stdout.split())
    assert drivers == {"host", "null"}, drivers  # no bridge network at all
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "docker0" not in links and "veth" not in links, links
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert "DOCKER" not in rules, "the engine wrote firewall rules"


def test_a_container_without_host_networking_has_only_loopback(our_engine: None, local_base_images: Any) -> None:
    """What --bridge=none means for a container that does not ask for the host's network."""
    image = local_base_images.python
    script = "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
    result = docker("run", "--rm", image, "python3", "-c", script, timeout=120)
    assert result.stdout.strip() == "['lo']", result.stdout


def test_a_missing_engine_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    problem = engine_problem()
    assert problem is not None and problem.startswith("no Docker engine reachable"), problem
