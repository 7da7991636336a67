"""Fixtures of the three-zone scenario tests (``zones/``: namespaces, delay proxies, faults).

Every test builds its own zones and mesh with ``make_zones`` and tears them down, whatever happens.
They SKIP only where root or network namespaces are missing; a missing ``iptables`` is a FAILURE
(the project installs it: ``tools/zones/requirements.sh``). They rewire the network and run real daemons:
markers ``netns``, ``daemons``, ``exclusive`` (run alone), ``slow``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.zones.helpers import leftovers_of
from tools.zones.mesh import ZoneMesh
from tools.zones.net import ZonesUnavailable, check_namespaces

_zones_of_test: dict[str, list[ZoneMesh]] = {}
_availability: list[str | None] = []
_postgres_started: dict[int, str | None] = {}


def postgres_start_time(url: str) -> str | None:
    """When the PostgreSQL server started (to tell a failure caused by someone restarting it)."""
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()::text").fetchone()
    except Exception:  # only a diagnostic
        return None
    return None if row is None else str(row[0])


def _unavailable() -> str | None:
    """Why zones cannot run here (None: they can). Checked once per session."""
    if not _availability:
        reason: str | None = None
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            reason = "zone tests need root (network namespaces, veth, bridge)"
        else:
            try:
                check_namespaces()
            except ZonesUnavailable as exc:
                reason = f"zone tests need network namespaces: {exc}"
        _availability.append(reason)
    return _availability[0]


@pytest.fixture
def zones_available() -> None:
    """Skip where zones cannot be built (no root, no namespaces); fail where the project's own
    dependencies are missing."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    if shutil.which("iptables") is None:
        pytest.fail("iptables is not installed: run tools/zones/requirements.sh (as root)", pytrace=False)


@pytest.fixture
def make_zones(
    zones_available: None, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ZoneMesh]]:
    made: list[ZoneMesh] = []
    _zones_of_test[request.node.nodeid] = made

    def make(**options: Any) -> ZoneMesh:
        zoned = ZoneMesh(tmp_path / f"zones-{len(made)}", **options)
        made.append(zoned)
        _postgres_started[id(zoned)] = postgres_start_time(zoned.postgres_url)
        zoned.start()
        return zoned

    try:
        yield make
    finally:
        for zoned in made:
            zoned.close()
        _zones_of_test.pop(request.node.nodeid, None)
    # Teardown is part of the contract: nothing of these zones may be left.
    for zoned in made:
        leftovers = leftovers_of(zoned.net)
        assert not leftovers, f"zones not torn down: {leftovers}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when in ("setup", "call") and report.failed:
        for zoned in _zones_of_test.get(item.nodeid, []):
            if zoned.mesh is not None:
                report.sections.append((f"zone logs ({zoned.net.run_id})", zoned.log_tails()))
            before, now = _postgres_started.get(id(zoned)), postgres_start_time(zoned.postgres_url)
            if before != now:
                report.sections.append(
                    (
                        "PostgreSQL",
                        f"the server was restarted or unreachable during this test ({before} -> {now}):"
                        " another suite on this machine may have restarted it",
                    )
                )
    return report
