"""The harness always removes what it created: on SIGTERM (signal handling + atexit), after an
exception (context manager), and — for an owner killed outright — through ``python -m tools.zones cleanup``,
which leaves runs whose owner still lives alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.zones.helpers import leftovers_of, poll
from tools.zones.mesh import REPO_ROOT
from tools.zones.net import ZoneNetwork, ZonesUnavailable, check_namespaces

pytestmark = [pytest.mark.netns, pytest.mark.exclusive]

OWNER = """
import json, sys, time
from tools.zones.net import ZoneNetwork
network = ZoneNetwork().up()
network.partition("a")
print(json.dumps({"run_id": network.run_id, "state_dir": str(network.state_dir)}), flush=True)
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def _zones_here() -> None:
    if os.geteuid() != 0:
        pytest.skip("zone tests need root (network namespaces, veth, bridge)")
    try:
        check_namespaces()
    except ZonesUnavailable as exc:
        pytest.skip(f"zone tests need network namespaces: {exc}")


def start_owner() -> tuple[subprocess.Popen[str], ZoneNetwork]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, "the owner process did not build its zones"
    body = json.loads(line)
    # A handle on the same names, to look for leftovers (never brought up here).
    network = ZoneNetwork(run_id=body["run_id"])
    assert leftovers_of(network), "the owner's zones do not exist"
    return owner, network


def test_sigterm_tears_the_zones_down() -> None:
    owner, network = start_owner()
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(20) == 128 + signal.SIGTERM
    assert leftovers_of(network) == []


def test_an_exception_tears_the_zones_down() -> None:
    network = ZoneNetwork()
    seen: list[str] = []

    def fail_inside() -> None:
        with network:
            network.partition("b")
            seen.extend(leftovers_of(network))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    assert seen, "the zones did not exist inside the block"
    assert leftovers_of(network) == []


def test_cleanup_removes_what_a_killed_owner_left_and_spares_live_runs() -> None:
    owner, orphan = start_owner()
    owner.kill()
    owner.wait(10)
    time.sleep(0.2)
    assert leftovers_of(orphan), "SIGKILL leaves the zones behind (nothing can run in the owner)"
    with ZoneNetwork() as live:
        result = subprocess.run(
            [sys.executable, "-m", "tools.zones", "cleanup"],
            capture_output=True,
            text=True,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert orphan.run_id in result.stdout
        poll(lambda: leftovers_of(orphan) == [], timeout_s=10, what="the orphan's zones to be gone")
        # The run whose owner (this process) lives is untouched.
        assert live.run_id not in result.stdout
        assert any(item.startswith("netns") for item in leftovers_of(live))
    assert leftovers_of(live) == []
