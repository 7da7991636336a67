"""Ports for servers a test starts itself and must name before they run.

Picking a port by binding to port 0 and releasing it races with every other test that binds port 0:
the kernel may hand the same port out again before the server starts. These ports come from below the
kernel's ephemeral range instead, which bind-to-0 never uses, and are checked free before use.
"""

from __future__ import annotations

import os
import random
import socket

_LOW, _HIGH = 20_000, 32_000  # below net.ipv4.ip_local_port_range (32768-60999 here)
_SLICES = 8  # pytest-xdist workers each draw from their own slice, so two workers never pick alike


def _range() -> tuple[int, int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under xdist
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return _LOW, _HIGH
    width = (_HIGH - _LOW) // _SLICES
    low = _LOW + (int(worker[2:]) % _SLICES) * width
    return low, low + width


_handed_out: set[int] = set()  # a port is free until its server binds it: never hand it out twice


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now and not handed out before in this process: a test that names several ports
    before starting any server (tests/docker/compose_local.py) gets distinct ones."""
    low, high = _range()
    if len(_handed_out) > (high - low) // 2:  # a long run: start afresh (those early servers are gone)
        _handed_out.clear()
    for _ in range(200):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in [{low}, {high}) on {host}")
