"""The host-network variant of docker/compose.yaml that the container tier runs (tests/docker/compose_host.py)
differs from the real file in networking only, and every address in it is on loopback; and the demo
job's saved-path format and replay mode (docker/dev-mesh/demo_flow.py) behave, without a mesh."""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.docker.compose_host import DEMO_OUT, LOOPBACK, NETWORK_KEYS, host_network_variant, raw_compose
from tests.docker.conftest import load_demo_flow

pytestmark = pytest.mark.offline

REWRITTEN = {"environment", "command", "network_mode", "volumes"}
ADDRESS = re.compile(r"(?<![\w/])([\w.-]+):(\d{2,5})\b")


def variant(demo_out: str | None = "/tmp/demo-out") -> tuple[dict[str, Any], Any]:
    counter = itertools.count(21000)
    return raw_compose(), host_network_variant(raw_compose(), lambda: next(counter), demo_out=demo_out)


def addresses(service: dict[str, Any]) -> list[tuple[str, int]]:
    values = [str(v) for v in (service.get("environment") or {}).values()]
    values += [str(part) for part in service.get("command") or []]
    return [(m.group(1), int(m.group(2))) for value in values for m in ADDRESS.finditer(value.split("@")[-1])]


def test_only_networking_changes() -> None:
    raw, host = variant()
    services = host.document["services"]
    assert set(services) == set(raw["services"])
    assert host.document["volumes"] == raw["volumes"]
    assert "networks" not in host.document and "name" not in host.document
    for name, original in raw["services"].items():
        changed = services[name]
        assert changed["network_mode"] == "host", name
        for key in NETWORK_KEYS:
            assert key not in changed, (name, key)
        kept = {k: v for k, v in original.items() if k not in (*NETWORK_KEYS, *REWRITTEN)}
        assert {k: v for k, v in changed.items() if k not in REWRITTEN} == kept, name
        # The same variables, with addresses rewritten (PostgreSQL also learns its port).
        expected_env = set(original.get("environment") or {}) | ({"PGPORT"} if name == "postgres" else set())
        assert set(changed.get("environment") or {}) == expected_env, name
        assert changed.get("volumes", [])[: len(original.get("volumes", []))] == original.get("volumes", []), name
    assert services["demo"]["volumes"][-1] == f"/tmp/demo-out:{DEMO_OUT}"
    assert services["postgres"]["command"] == ["postgres", "-c", f"listen_addresses={LOOPBACK}"]
    assert services["coordinator"]["image"] == raw["services"]["coordinator"]["image"]  # ${COUNTERSIGN_IMAGE:-...}


def test_every_address_is_loopback_and_every_port_its_own() -> None:
    raw, host = variant()
    services = host.document["services"]
    for name, service in services.items():
        for address, _ in addresses(service):
            assert address == LOOPBACK, f"{name}: {address}"
        for value in (service.get("environment") or {}).values():
            assert "0.0.0.0" not in str(value), name
    assert len(set(host.ports.values())) == len(host.ports), "two listeners on one port"
    # Each daemon listens where the others dial it.
    coordinator = host.address("coordinator", 7400)
    for name in ("signer-a", "signer-b", "signer-c", "verifier-1", "verifier-2"):
        assert services[name]["environment"]["COUNTERSIGN_COORDINATOR"] == coordinator, name
    assert services["coordinator"]["environment"]["COUNTERSIGN_LISTEN"] == coordinator
    assert services["enrol"]["environment"]["COORDINATOR"] == coordinator
    postgres = host.address("postgres", 5432)
    assert services["postgres"]["environment"]["PGPORT"] == postgres.rsplit(":", 1)[1]
    assert postgres != f"{LOOPBACK}:5432", "never the machine's own PostgreSQL port"
    for name in ("coordinator", "verifier-1", "verifier-2"):
        url = (
            services[name]["environment"].get("COUNTERSIGN_LOG_STORE")
            or services[name]["environment"]["COUNTERSIGN_STORE_URL"]
        )
        assert f"@{postgres}/" in url, (name, url)
    demo = " ".join(services["demo"]["command"])
    for name, port in (("signer-a", 7401), ("signer-a2", 7401), ("signer-b", 7401), ("signer-c", 7401),
                       ("verifier-1", 7402)):  # fmt: skip
        assert host.address(name, port) in demo, name
    # The real file dials service names and listens on wildcards: the rewrite had work to do.
    assert any(a != LOOPBACK for s in raw["services"].values() for a, _ in addresses(s))


def test_without_a_demo_directory_no_mount_is_added() -> None:
    raw, host = variant(demo_out=None)
    assert host.document["services"]["demo"]["volumes"] == raw["services"]["demo"]["volumes"]


# --- demo_flow.py's saved path and replay mode -----------------------------------------------------


@given(path=st.binary(max_size=2048), output=st.binary(max_size=512))
def test_saved_path_round_trips(tmp_path_factory: pytest.TempPathFactory, path: bytes, output: bytes) -> None:
    module = load_demo_flow()
    file = tmp_path_factory.mktemp("saved") / "path.bin"
    module.save(file, path, output)
    assert module.load(file) == (path, output)


def test_a_truncated_saved_path_is_refused(tmp_path: Path) -> None:
    module = load_demo_flow()
    file = tmp_path / "path.bin"
    module.save(file, b"x" * 100, b"out")
    file.write_bytes(file.read_bytes()[:50])
    with pytest.raises(ValueError, match="truncated"):
        module.load(file)


def test_signers_name_several_replicas_per_deployer() -> None:
    pairs = load_demo_flow().pairs
    named = pairs("deployer-a=a1:7401, a2:7401,deployer-b=b:7401")
    assert named == {"deployer-a": "a1:7401,a2:7401", "deployer-b": "b:7401"}
    assert pairs("deployer-a=a:7401") == {"deployer-a": "a:7401"}
    for bad in ("a1:7401,deployer-a=a2:7401", "deployer-a=", "deployer-a=a:1,deployer-a=b:1", "=a:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            pairs(bad)
