"""Fixtures of the runtime SDK tests: one real mesh per pytest(-xdist) worker on loopback with mTLS.

Its deployer-a may delegate to deployer-b only (the parent-refuses case: a -> c is refused); b and c
delegate to any other deployer. ``registry_file`` is the same registry as a file, for offline checks.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from countersign.client import AsyncRuntime, Runtime
from countersign.keys import PublicKey
from countersign.registry import KeyEntry, Registry
from countersign_cli.localmesh import LocalMesh

ALLOWED_CHILDREN = {"deployer-a": ["deployer-b"]}


def start_runtime_mesh(workdir: Path) -> LocalMesh:
    mesh = LocalMesh(workdir, allowed_children=ALLOWED_CHILDREN).setup()
    try:
        mesh.start_all()
        mesh.enrol_all()
    except BaseException:
        mesh.stop_all()
        raise
    return mesh


def mesh_registry(mesh: LocalMesh) -> Registry:
    """The registry the mesh's operator enrolled: every deployer's key, valid from time 0."""
    return Registry(
        {d: {key.key_id: KeyEntry(PublicKey(key.public_key), 0)} for d, key in mesh.deployer_keys.items()},
        sequence=len(mesh.deployer_keys),
    )


def runtime_env(mesh: LocalMesh, deployer: str | None = None) -> dict[str, str]:
    """The environment a runtime of ``deployer`` (or, with None, a consumer) reads."""
    name = f"{deployer}-runtime" if deployer else "client"
    tls = mesh.tls_for(name)
    env = {"COUNTERSIGN_CLIENT_CA": tls.ca, "COUNTERSIGN_CLIENT_CERT": tls.cert, "COUNTERSIGN_CLIENT_KEY": tls.key}
    if deployer:
        env |= {"COUNTERSIGN_SIGNER": mesh.daemons[deployer].address, "COUNTERSIGN_DEPLOYER": deployer}
    else:
        env["COUNTERSIGN_VERIFIER"] = mesh.daemons["verifier-0"].address
    return env


@pytest.fixture(scope="session")
def runtime_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    mesh = start_runtime_mesh(tmp_path_factory.mktemp("runtime-mesh"))
    yield mesh
    mesh.stop_all()


@pytest.fixture(scope="session")
def registry_file(runtime_mesh: LocalMesh) -> str:
    path = runtime_mesh.workdir / "registry.json"
    path.write_text(json.dumps(mesh_registry(runtime_mesh).to_json()))
    return str(path)


@pytest.fixture
def runtime(runtime_mesh: LocalMesh) -> Iterator[Callable[[str], Runtime]]:
    """``runtime("deployer-b")``: a sync runtime of that deployer, closed after the test."""
    made: list[Runtime] = []

    def make(deployer: str) -> Runtime:
        made.append(Runtime.from_env(runtime_env(runtime_mesh, deployer)))
        return made[-1]

    yield make
    for each in made:
        each.close()


def async_runtime(mesh: LocalMesh, deployer: str) -> AsyncRuntime:
    """Call inside the event loop that will use it."""
    return AsyncRuntime.from_env(runtime_env(mesh, deployer))


@pytest.fixture
def nowhere() -> str:
    """A loopback address nothing listens on (a port the kernel just handed out, closed again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    mesh = item.funcargs.get("runtime_mesh") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and isinstance(mesh, LocalMesh):
        tails = "\n".join(f"--- {name} ---\n{mesh.log_tail(name, 15)}" for name in mesh.daemons)
        report.sections.append(("daemon logs", tails))
    return report
