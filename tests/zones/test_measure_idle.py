"""``zones measure --poll-idle``: the PM QoS request holds while measuring and ends with it, and is
refused where the kernel has no cpuidle driver (there it could not change how CPUs idle)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tools.zones.measure import cpuidle_driver, idle_policy

pytestmark = pytest.mark.offline

DEVICE = "/dev/cpu_dma_latency"


def current_latency_limit() -> int:
    """The kernel's aggregate wake-up latency limit (µs) over every open request."""
    handle = os.open(DEVICE, os.O_RDONLY)
    try:
        return int(struct.unpack("i", os.read(handle, 4))[0])
    finally:
        os.close(handle)


def fake_cpuidle(tmp_path: Path, driver: str | None) -> Path:
    """A stand-in for /sys/devices/system/cpu/cpuidle naming ``driver`` (None: no such file)."""
    directory = tmp_path / "cpuidle"
    directory.mkdir()
    if driver is not None:
        (directory / "current_driver").write_text(driver + "\n")
    return directory


def require_device() -> int:
    if not os.access(DEVICE, os.R_OK | os.W_OK):
        pytest.skip(f"{DEVICE} needs root and a kernel with PM QoS: --poll-idle cannot be used here")
    before = current_latency_limit()
    assert before > 0, "another process already holds the CPUs in polling idle: this test would prove nothing"
    return before


def test_poll_idle_holds_zero_latency_only_while_measuring(tmp_path: Path) -> None:
    before = require_device()
    cpuidle = fake_cpuidle(tmp_path, "haltpoll")  # a kernel whose cpuidle driver honours PM QoS
    with idle_policy(poll=True, cpuidle=cpuidle) as described:
        assert current_latency_limit() == 0
        assert "polling" in described and "haltpoll" in described
    assert current_latency_limit() == before
    with pytest.raises(RuntimeError), idle_policy(poll=True, cpuidle=cpuidle):  # an error ends it too
        raise RuntimeError("measurement failed")
    assert current_latency_limit() == before
    with idle_policy(poll=False, cpuidle=cpuidle) as described:
        assert current_latency_limit() == before
        assert "default" in described and "haltpoll" in described


@pytest.mark.parametrize("driver", ["none", None])
def test_poll_idle_is_refused_without_a_cpuidle_driver(tmp_path: Path, driver: str | None) -> None:
    before = require_device()
    cpuidle = fake_cpuidle(tmp_path, driver)
    assert cpuidle_driver(cpuidle) == "none"
    with pytest.raises(SystemExit, match="no cpuidle driver"), idle_policy(poll=True, cpuidle=cpuidle):
        pytest.fail("measured with a setting that changes nothing")
    assert current_latency_limit() == before  # refused before any request was made
    with idle_policy(poll=False, cpuidle=cpuidle) as described:
        assert "cpuidle driver: none" in described


def test_the_run_header_names_this_kernels_cpuidle_driver() -> None:
    driver = cpuidle_driver()
    with idle_policy(poll=False) as described:
        assert described.endswith(f"cpuidle driver: {driver})")
