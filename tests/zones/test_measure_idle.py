"""``zones measure --poll-idle``: the PM QoS request holds while measuring and ends with it."""

from __future__ import annotations

import os
import struct

import pytest

from zones.measure import idle_policy

DEVICE = "/dev/cpu_dma_latency"


def current_latency_limit() -> int:
    """The kernel's aggregate wake-up latency limit (µs) over every open request."""
    handle = os.open(DEVICE, os.O_RDONLY)
    try:
        return int(struct.unpack("i", os.read(handle, 4))[0])
    finally:
        os.close(handle)


def test_poll_idle_holds_zero_latency_only_while_measuring() -> None:
    if not os.access(DEVICE, os.R_OK | os.W_OK):
        pytest.skip(f"{DEVICE} needs root and a kernel with PM QoS: --poll-idle cannot be used here")
    before = current_latency_limit()
    assert before > 0, "another process already holds the CPUs in polling idle: this test would prove nothing"
    with idle_policy(poll=True) as described:
        assert current_latency_limit() == 0
        assert "polling" in described
    assert current_latency_limit() == before
    with pytest.raises(RuntimeError), idle_policy(poll=True):  # an error while measuring ends it too
        raise RuntimeError("measurement failed")
    assert current_latency_limit() == before
    with idle_policy(poll=False) as described:
        assert current_latency_limit() == before
        assert "default" in described
