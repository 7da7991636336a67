"""The test suite's port helper (tests/ports.py): a test that names several ports before starting any
server must get distinct ones, or two of its servers race for one port (the compose flow test once
connected to deployer-b's signer at deployer-a's address)."""

from __future__ import annotations

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.daemons  # it binds loopback ports


def test_ports_named_before_any_server_binds_are_distinct() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(20_000 <= port < 32_000 for port in ports)  # below the kernel's ephemeral range
