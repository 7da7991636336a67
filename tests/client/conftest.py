"""Fixtures of the client tests: one real mesh per pytest(-xdist) worker on loopback with mTLS, reached
only through the public package ``countersign.client``. Its deployer-c may delegate to deployer-a
only (the policy-refusal case)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from countersign_cli.localmesh import LocalMesh


@pytest.fixture(scope="session")
def client_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    mesh = LocalMesh(tmp_path_factory.mktemp("client-mesh"), allowed_children={"deployer-c": ["deployer-a"]}).setup()
    try:
        mesh.start_all()
        mesh.enrol_all()
        yield mesh
    finally:
        mesh.stop_all()


@pytest.fixture
def nowhere() -> str:
    """A loopback address nothing listens on (a port the kernel just handed out, closed again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    mesh = item.funcargs.get("client_mesh") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and isinstance(mesh, LocalMesh):
        tails = "\n".join(f"--- {name} ---\n{mesh.log_tail(name, 15)}" for name in mesh.daemons)
        report.sections.append(("daemon logs", tails))
    return report
