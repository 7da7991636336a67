"""docker/compose.yaml on HOST NETWORKING, for the container tier (make containers).

The tier's engine has no bridge and no NAT (docker/engine.sh), so the containers share the host's
network namespace and every service needs a loopback port of its own. This module writes a variant
of the real compose file that differs in networking only:

* every service gets ``network_mode: host``; ``networks`` and ``ports`` go (host networking has
  nothing to publish), and ``build`` goes (the tier builds docker/Dockerfile itself, on the local
  stand-in base, and compose runs those images);
* each port a service listens on (a ``0.0.0.0:N`` listen address, a published container port,
  PostgreSQL's 5432) gets a free loopback port, and every address in an environment value or a
  command argument is rewritten: ``0.0.0.0:N`` and ``<service>:N`` become ``127.0.0.1:<its port>``;
* PostgreSQL listens on 127.0.0.1 only, on its port (``PGPORT``), never the machine's 5432;
* the demo job gets one writable bind mount, where it saves the path it saw accepted (for the
  replay after a verifier restart).

Images, users, read-only roots, capabilities, volumes, health checks, restart policies, commands and
start order are the real file's, unchanged (tests/docker/test_compose_host.py holds it to that).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from tests.docker.conftest import COMPOSE_FILE

LOOPBACK = "127.0.0.1"
POSTGRES_PORT = 5432
DEMO_OUT = "/run/countersign/demo-out"
NETWORK_KEYS = ("networks", "ports", "build")

_WILDCARD = re.compile(r"^0\.0\.0\.0:(\d+)$")
_SERVICE_ADDRESS = re.compile(r"\b([a-z][a-z0-9-]*):(\d{2,5})\b")


def raw_compose() -> dict[str, Any]:
    """The compose file as YAML gives it: merge keys resolved, ``x-`` blocks dropped, no interpolation."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("x-")}


def listening_ports(name: str, service: dict[str, Any]) -> set[int]:
    """The container ports a service listens on."""
    ports = {int(str(p).rsplit(":", 1)[1]) for p in service.get("ports", [])}
    for value in (service.get("environment") or {}).values():
        match = _WILDCARD.match(str(value))
        if match:
            ports.add(int(match.group(1)))
    if name == "postgres":
        ports.add(POSTGRES_PORT)
    return ports


@dataclass
class HostNetworkCompose:
    document: dict[str, Any]
    ports: dict[tuple[str, int], int]  # (service, container port) -> loopback port

    def address(self, service: str, container_port: int) -> str:
        return f"{LOOPBACK}:{self.ports[(service, container_port)]}"

    def to_yaml(self) -> str:
        return str(yaml.safe_dump(self.document, sort_keys=False))


def host_network_variant(
    raw: dict[str, Any], allocate: Callable[[], int], demo_out: str | None = None
) -> HostNetworkCompose:
    services: dict[str, dict[str, Any]] = copy.deepcopy(raw["services"])
    ports = {(name, port): allocate() for name, service in services.items() for port in listening_ports(name, service)}

    def rewrite(service: str, value: str) -> str:
        value = _WILDCARD.sub(lambda m: f"{LOOPBACK}:{ports[(service, int(m.group(1)))]}", value)
        return _SERVICE_ADDRESS.sub(
            lambda m: (
                f"{LOOPBACK}:{ports[(m.group(1), int(m.group(2)))]}"
                if (m.group(1), int(m.group(2))) in ports
                else m.group(0)
            ),
            value,
        )

    for name, service in services.items():
        for key in NETWORK_KEYS:
            service.pop(key, None)
        service["network_mode"] = "host"
        environment = service.get("environment")
        if environment:
            service["environment"] = {k: rewrite(name, "" if v is None else str(v)) for k, v in environment.items()}
        if isinstance(service.get("command"), list):
            service["command"] = [rewrite(name, str(part)) for part in service["command"]]

    postgres = services["postgres"]
    postgres.setdefault("environment", {})["PGPORT"] = str(ports[("postgres", POSTGRES_PORT)])
    postgres["command"] = ["postgres", "-c", f"listen_addresses={LOOPBACK}"]
    if demo_out is not None:
        services["demo"].setdefault("volumes", []).append(f"{demo_out}:{DEMO_OUT}")

    document = {"services": services, "volumes": copy.deepcopy(raw.get("volumes", {}))}
    return HostNetworkCompose(document, ports)
