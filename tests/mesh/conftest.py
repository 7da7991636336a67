"""Fixtures of the mesh tests: whole meshes of real daemon processes on loopback, mTLS on.

* ``mesh``: one mesh per pytest(-xdist) worker, for tests that neither stop a daemon nor change the
  registry. Its deployer-c may delegate to deployer-a only (the policy-refusal case).
* ``make_mesh``: a fresh mesh in the test's own ``tmp_path`` for tests that kill, restart or revoke.

Every address comes from the daemons' ready files (they bind port 0), so workers never collide. When a
test fails, the tail of each daemon's log is printed with the failure.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign_cli.localmesh import LocalMesh

SHARED_ALLOWED_CHILDREN = {"deployer-c": ["deployer-a"]}

_meshes_of_test: dict[str, list[LocalMesh]] = {}


def start_mesh(workdir: Path, *, enrol: bool | Collection[str] = True, **options: Any) -> LocalMesh:
    """Set up, start and (unless told otherwise) enrol a mesh; stop it again if any step fails."""
    mesh = LocalMesh(workdir, **options).setup()
    try:
        mesh.start_all()
        if enrol is True:
            mesh.enrol_all()
        elif enrol:
            enrol_some(mesh, list(enrol))
    except BaseException:
        mesh.stop_all()
        raise
    return mesh


def enrol_some(mesh: LocalMesh, deployers: list[str]) -> None:
    client = mesh.operator_client()
    try:
        for deployer in deployers:
            key = mesh.deployer_keys[deployer]
            client.submit(
                StatementKind.ENROL_DEPLOYER, deployer, key.key_id, public_key=b64url_encode(key.public_key), at_ms=0
            )
    finally:
        client.close()
    mesh.wait_for_registry(len(deployers))


def log_tails(mesh: LocalMesh) -> str:
    return "\n".join(f"--- {name} ---\n{mesh.log_tail(name, 15)}" for name in mesh.daemons)


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    shared = start_mesh(tmp_path_factory.mktemp("shared-mesh"), allowed_children=SHARED_ALLOWED_CHILDREN)
    yield shared
    shared.stop_all()


@pytest.fixture
def make_mesh(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalMesh]]:
    meshes: list[LocalMesh] = []
    _meshes_of_test[request.node.nodeid] = meshes

    def make(*, enrol: bool | Collection[str] = True, **options: Any) -> LocalMesh:
        made = start_mesh(tmp_path / f"mesh-{len(meshes)}", enrol=enrol, **options)
        meshes.append(made)
        return made

    try:
        yield make
    finally:
        for made in meshes:
            made.stop_all()
        _meshes_of_test.pop(request.node.nodeid, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        meshes = list(_meshes_of_test.get(item.nodeid, []))
        shared = item.funcargs.get("mesh") if hasattr(item, "funcargs") else None
        if isinstance(shared, LocalMesh):
            meshes.append(shared)
        for made in meshes:
            report.sections.append((f"daemon logs ({made.workdir.name})", log_tails(made)))
    return report
