"""Container health probe: ``grpc.health.v1.Health/Check`` against this container's own daemon.

Exit status 0 when the daemon answers SERVING, 1 otherwise (the contract of Docker's HEALTHCHECK,
Compose's ``healthcheck`` and an ECS container ``healthCheck``). One line on stdout says why; no key
material is ever printed.

How it knows what to ask, without a configuration of its own:

1. the daemon process: the one whose command line is ``countersign <daemon> serve [--config FILE]``
   (or ``python -m countersign_cli <daemon> serve ...``, as from a source checkout)
   (``--pid`` names it explicitly);
2. its settings: loaded exactly as the daemon loads them, from its TOML file and its own
   ``COUNTERSIGN_*`` environment (read from ``/proc/<pid>/environ``), relative paths resolved in its
   working directory: the same TLS files or inline PEM, listen address and ready file;
3. the port: from the ready file when the daemon writes one, else from ``listen``; a wildcard host
   (``0.0.0.0``, ``::``) is dialled on loopback;
4. the server name it pins: the daemon's DNS name (``coordinator.countersign.local``,
   ``<deployer>.signer.countersign.local``, ``verifier.countersign.local``), with the daemon's own
   certificate as the client certificate. Daemon certificates therefore need the clientAuth usage
   as well as serverAuth (``countersign pki issue`` sets both; signers and verifiers need it anyway
   to reach the coordinator).

Usage: ``python healthcheck.py [--pid PID] [--timeout SECONDS]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

KINDS = ("coordinator", "signer", "verifier")
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}  # noqa: S104


class Unhealthy(Exception):
    """The daemon is not (yet) serving, or cannot be asked."""


def read_argv(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def daemon_of(argv: list[str]) -> tuple[str, str | None] | None:
    """``(kind, config path)`` if ``argv`` runs ``countersign <kind> serve``, else None."""
    # The console script (the image), or the module (`python -m countersign_cli`, a source checkout).
    module = any(part == "-m" and following == "countersign_cli" for part, following in itertools.pairwise(argv))
    if not module and not any(Path(part).name == "countersign" for part in argv):
        return None
    for index, part in enumerate(argv[:-1]):
        if part in KINDS and argv[index + 1] == "serve":
            config: str | None = None
            rest = argv[index + 2 :]
            for position, option in enumerate(rest):
                if option == "--config" and position + 1 < len(rest):
                    config = rest[position + 1]
                elif option.startswith("--config="):
                    config = option.split("=", 1)[1]
            return part, config
    return None


def find_daemon(pid: int | None) -> tuple[int, str, str | None]:
    """The daemon's pid, kind and config path."""
    candidates = [pid] if pid is not None else sorted(int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    for candidate in candidates:
        if candidate == os.getpid():
            continue
        try:
            found = daemon_of(read_argv(candidate))
        except OSError:
            continue
        if found is not None:
            return candidate, found[0], found[1]
    raise Unhealthy("no `countersign <daemon> serve` process found" if pid is None else f"pid {pid} is not a daemon")


def read_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs if name}


def load_settings(kind: str, config_path: str | None, environ: dict[str, str]) -> Any:
    from countersign._daemon.config import load_config
    from countersign.errors import ConfigError

    settings_class: type
    if kind == "coordinator":
        from coordinator.daemon import CoordinatorConfig

        settings_class = CoordinatorConfig
    elif kind == "signer":
        from signer.config import SignerConfig

        settings_class = SignerConfig
    else:
        from verifier.daemon import VerifierConfig

        settings_class = VerifierConfig
    try:
        return load_config(settings_class, config_path, environ)
    except ConfigError as exc:
        raise Unhealthy(f"cannot read the {kind}'s settings: {exc}") from None


def target(settings: Any) -> str:
    from countersign._daemon.config import parse_address

    host, port = parse_address(settings.listen, "listen")
    if settings.ready_file and Path(settings.ready_file).is_file():
        try:
            port = int(json.loads(Path(settings.ready_file).read_text())["grpc_port"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise Unhealthy(f"unreadable ready file {settings.ready_file}: {exc}") from None
    if port == 0:
        raise Unhealthy("listen port 0 and no ready file yet: not serving")
    host = WILDCARD_HOSTS.get(host, f"[{host}]" if ":" in host else host)
    return f"{host}:{port}"


def server_name(kind: str, settings: Any) -> str:
    from countersign.client.tls import coordinator_dns, signer_dns, verifier_dns

    if kind == "coordinator":
        return coordinator_dns()
    if kind == "signer":
        return signer_dns(settings.deployer)
    return verifier_dns()


def check(pid: int | None, timeout_s: float) -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from countersign.client.tls import open_channel

    daemon_pid, kind, config_path = find_daemon(pid)
    try:
        environ = read_environ(daemon_pid)
        os.chdir(os.readlink(f"/proc/{daemon_pid}/cwd"))
    except OSError as exc:
        raise Unhealthy(f"cannot inspect pid {daemon_pid}: {exc.strerror}") from None
    settings = load_settings(kind, config_path, environ)
    address = target(settings)
    channel = open_channel(address, settings.tls, server_name(kind, settings))
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
    except grpc.RpcError as exc:
        raise Unhealthy(f"{kind} at {address}: {exc.code().name} {exc.details() or ''}".rstrip()) from None
    finally:
        channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise Unhealthy(f"{kind} at {address}: {status}")
    return f"{kind} at {address}: {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gRPC health probe of this container's countersign daemon")
    parser.add_argument("--pid", type=int, help="the daemon's process id (default: find it in /proc)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    try:
        print(check(args.pid, args.timeout))
    except Unhealthy as exc:
        print(f"unhealthy: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
