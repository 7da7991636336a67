"""``python -m tools.zones measure | faults | cleanup | up`` (see docs/zones.md)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _cleanup(argv: list[str]) -> int:
    from tools.zones.mesh import DEFAULT_POSTGRES_URL
    from tools.zones.net import cleanup

    parser = argparse.ArgumentParser(
        prog="python -m tools.zones cleanup",
        description="Remove namespaces, links, processes and schemas left by zone runs whose owner is gone.",
    )
    parser.add_argument("--force", action="store_true", help="also remove runs whose owner process still runs")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    removed = cleanup(force=args.force, postgres_url=args.postgres_url)
    for item in removed:
        print(f"removed {item}")
    print(f"{len(removed)} leftover(s) removed")
    return 0


def _up(argv: list[str]) -> int:
    from tools.zones.mesh import ZoneMesh

    parser = argparse.ArgumentParser(
        prog="python -m tools.zones up", description="Start the three-zone mesh, print its addresses, wait for Ctrl-C."
    )
    parser.add_argument("--delay-ms", type=float, default=0.5)
    parser.add_argument("--loss", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until Ctrl-C)")
    parser.add_argument(
        "--replicas", action="store_true", help="a signer replica of every deployer in every zone, two coordinators"
    )
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="zones-up-"))
    if args.replicas:
        from tools.zones.faults import replica_mesh

        mesh = replica_mesh(workdir, delay_ms=args.delay_ms)
    else:
        mesh = ZoneMesh(workdir, delay_ms=args.delay_ms, loss=args.loss)
    with mesh as zoned:
        print(f"run {zoned.net.run_id}: workdir {workdir}, delay mode {zoned.delay_mode}")
        for letter, zone in zoned.net.zones.items():
            print(f"  zone-{letter}: netns {zone.netns}, address {zone.ip}")
        for name, daemon in zoned.local.daemons.items():
            print(f"  {name}: {daemon.address} (log {daemon.log_file})")
        sys.stdout.flush()
        try:
            deadline = time.monotonic() + args.seconds if args.seconds else None
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    return 0


def main(argv: list[str]) -> int:
    commands = {"measure": None, "faults": None, "cleanup": _cleanup, "up": _up}
    if not argv or argv[0] not in commands:
        print("usage: python -m tools.zones {measure [--quick] | faults | cleanup [--force] | up}", file=sys.stderr)
        return 2
    if argv[0] == "measure":
        from tools.zones.measure import main as measure

        return measure(argv[1:])
    if argv[0] == "faults":
        from tools.zones.faults import main as faults

        return faults(argv[1:])
    handler = commands[argv[0]]
    assert handler is not None
    return handler(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
