"""Ports for servers a test starts itself and must name before they run.

Picking a port by binding to port 0 and releasing it races with every other test that binds port 0:
the kernel may hand the same port out again before the server starts. These ports come from below the
kernel's ephemeral range instead, which bind-to-0 never uses, and are checked free before use.
"""

from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20_000, 32_000  # below net.ipv4.ip_local_port_range (32768-60999 here)


def free_port(host: str = "127.0.0.1") -> int:
    for _ in range(200):
        port = random.randrange(_LOW, _HIGH)
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{_LOW}, {_HIGH}) on {host}")
