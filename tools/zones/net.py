"""Three (or more) network namespaces joined by veth pairs to a bridge in the root namespace.

Address plan for a run (``N`` chosen per run so parallel runs do not collide)::

    root namespace  csz-<run>   (bridge)  10.77.N.1/24   "local": the test process talking to a
                                                         daemon as if from the daemon's own zone
                                          10.77.N.2/24   "wan": the root proxy's inter-zone routes
                                                         (zone -> PostgreSQL)
                                          10.77.N.21/24  "client in zone-a": the root proxy's routes
                                          10.77.N.22/24  from a client in that zone to a daemon in
                                          10.77.N.23/24  another (verifiers, signer replicas)
    zone-a          csz-<run>-a (netns)   10.77.N.11/24  eth0 <-> veth csz-<run>-a on the bridge
    zone-b          csz-<run>-b           10.77.N.12/24
    zone-c          csz-<run>-c           10.77.N.13/24

All zones sit on one layer-2 segment, so they reach each other and the root namespace without any
forwarding (the host's ``ip_forward`` and firewall are not touched). Zones have no default route: a
zone can reach nothing but the bridge subnet.

Faults live *inside* the zones' namespaces (their own netfilter tables), never in the root
namespace: a partition adds ``DROP`` rules on the INPUT chain of both ends, for the zones' own addresses
and for their client addresses (a client in a partitioned zone is cut off with it); random loss adds
``-m statistic --mode random --probability p`` DROP rules for packets from other zones and from or to
the "wan" address and other zones' client addresses (so root-namespace traffic that stands for an
inter-zone route is lossy too, and the "local" address is not); a link cut sets the host side of a
zone's veth down. Deleting a
namespace deletes its rules and its veth with it.

Everything a run creates is recorded in ``<state root>/<run>/run.json`` *before* it is created, so
``python -m tools.zones cleanup`` can remove what a crashed run left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFIX = "csz"
SUBNET_BASE = "10.77"
STATE_ROOT = Path(os.environ.get("COUNTERSIGN_ZONES_STATE", "/tmp/countersign-zones"))  # noqa: S108
ZONE_LETTERS = ("a", "b", "c")
PARTITION_CHAIN = "CSZ-PARTITION"
LOSS_CHAIN = "CSZ-LOSS"
LOSS_OUT_CHAIN = "CSZ-LOSS-OUT"
REQUIREMENTS_HINT = "run tools/zones/requirements.sh (as root) to install it"


_LIVE_NETWORKS: weakref.WeakSet[ZoneNetwork] = weakref.WeakSet()


@atexit.register
def _down_all() -> None:
    for network in list(_LIVE_NETWORKS):
        network.down()


def trap_sigterm() -> None:
    """Make SIGTERM (and SIGHUP) raise SystemExit in the main thread, so ``finally`` blocks and atexit
    handlers tear the zones down — unless the program already handles these signals itself."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, stop)


class ZonesUnavailable(RuntimeError):
    """This machine cannot host zones (not root, or no network namespaces)."""


class ZonesError(RuntimeError):
    """A harness command failed."""


def _run(argv: Sequence[str], *, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    # Every command is ip/iptables/tc with names and addresses this module built: nothing untrusted.
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
    if check and result.returncode != 0:
        raise ZonesError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def ip_command() -> str:
    found = shutil.which("ip")
    if found is None:
        raise ZonesUnavailable("the `ip` command (iproute2) is missing: " + REQUIREMENTS_HINT)
    return found


def iptables_command() -> str:
    found = shutil.which("iptables")
    if found is None:
        raise ZonesError("iptables is not installed: " + REQUIREMENTS_HINT)
    return found


def check_namespaces() -> None:
    """Raise ZonesUnavailable unless we are root and ``ip netns add`` works here."""
    if os.geteuid() != 0:
        raise ZonesUnavailable("zones need root (network namespaces, veth, bridge)")
    ip = ip_command()
    probe = f"{PREFIX}-probe-{secrets.token_hex(3)}"
    result = _run([ip, "netns", "add", probe], check=False)
    if result.returncode != 0:
        raise ZonesUnavailable(f"`ip netns add` does not work here: {result.stderr.strip()}")
    _run([ip, "netns", "del", probe], check=False)


def netem_available() -> bool:
    """Whether ``tc qdisc add … netem`` works (tried on the loopback of a throwaway namespace)."""
    tc = shutil.which("tc")
    if tc is None or os.geteuid() != 0:
        return False
    ip = ip_command()
    probe = f"{PREFIX}-probe-{secrets.token_hex(3)}"
    if _run([ip, "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        result = _run([ip, "netns", "exec", probe, tc, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
    except ZonesError:
        return False
    finally:
        _run([ip, "netns", "del", probe], check=False)
    return result.returncode == 0


@dataclass(frozen=True)
class Zone:
    letter: str
    netns: str
    veth: str  # host side, on the bridge
    ip: str
    client_ip: str = ""  # in the root namespace: where a client in this zone comes from on another zone's routes

    @property
    def name(self) -> str:
        return f"zone-{self.letter}"


def _used_third_octets() -> set[int]:
    out = _run([ip_command(), "-4", "-o", "addr", "show"], check=False).stdout
    used = set()
    for line in out.splitlines():
        for word in line.split():
            if word.startswith(SUBNET_BASE + "."):
                with contextlib.suppress(ValueError, IndexError):
                    used.add(int(word.split(".")[2]))
    return used


@dataclass(eq=False)
class ZoneNetwork:
    """The namespaces, veths, bridge and fault rules of one run. Use as a context manager."""

    letters: Sequence[str] = ZONE_LETTERS
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    state_root: Path = STATE_ROOT
    zones: dict[str, Zone] = field(default_factory=dict, init=False)
    bridge: str = field(init=False)
    root_ip: str = field(init=False)
    wan_ip: str = field(init=False)
    subnet: int = field(init=False, default=0)
    _record: dict[str, Any] = field(default_factory=dict, init=False)
    _up: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.bridge = f"{PREFIX}-{self.run_id}"
        self.state_dir = self.state_root / self.run_id

    # --- bookkeeping --------------------------------------------------------------------------------

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.state_dir / "run.json.tmp"
        temporary.write_text(json.dumps(self._record, indent=1))
        os.replace(temporary, self.state_dir / "run.json")

    def record(self, key: str, value: Any) -> None:
        """Note something this run created (a pid, a schema), for cleanup after a crash."""
        items = self._record.setdefault(key, [])
        if value not in items:
            items.append(value)
        self._save()

    def forget(self, key: str, value: Any) -> None:
        items = self._record.get(key, [])
        if value in items:
            items.remove(value)
            self._save()

    # --- set-up and teardown ------------------------------------------------------------------------

    def up(self) -> ZoneNetwork:
        check_namespaces()
        trap_sigterm()
        _LIVE_NETWORKS.add(self)
        ip = ip_command()
        used = _used_third_octets()
        free = [n for n in range(1, 255) if n not in used]
        if not free:
            raise ZonesError(f"no free {SUBNET_BASE}.N.0/24 subnet")
        self.subnet = secrets.choice(free)
        base = f"{SUBNET_BASE}.{self.subnet}"
        self.root_ip = f"{base}.1"
        self.wan_ip = f"{base}.2"
        for index, letter in enumerate(self.letters):
            self.zones[letter] = Zone(
                letter,
                f"{PREFIX}-{self.run_id}-{letter}",
                f"{PREFIX}-{self.run_id}-{letter}",
                f"{base}.{11 + index}",
                f"{base}.{21 + index}",
            )
        self._record = {
            "run_id": self.run_id,
            "owner_pid": os.getpid(),
            "owner_start": _start_time(os.getpid()),
            "bridge": self.bridge,
            "subnet": f"{base}.0/24",
            "netns": [z.netns for z in self.zones.values()],
            "veths": [z.veth for z in self.zones.values()],
            "pids": [],
            "schemas": [],
        }
        self._save()
        self._up = True
        _run([ip, "link", "add", self.bridge, "type", "bridge"])
        _run([ip, "addr", "add", f"{self.root_ip}/24", "dev", self.bridge])
        _run([ip, "addr", "add", f"{self.wan_ip}/24", "dev", self.bridge])
        for zone in self.zones.values():
            _run([ip, "addr", "add", f"{zone.client_ip}/24", "dev", self.bridge])
        _run([ip, "link", "set", self.bridge, "up"])
        for zone in self.zones.values():
            peer = zone.veth + "p"
            _run([ip, "netns", "add", zone.netns])
            _run([ip, "link", "add", zone.veth, "type", "veth", "peer", "name", peer])
            _run([ip, "link", "set", peer, "netns", zone.netns])
            _run([ip, "-n", zone.netns, "link", "set", peer, "name", "eth0"])
            _run([ip, "-n", zone.netns, "addr", "add", f"{zone.ip}/24", "dev", "eth0"])
            _run([ip, "-n", zone.netns, "link", "set", "eth0", "up"])
            _run([ip, "-n", zone.netns, "link", "set", "lo", "up"])
            _run([ip, "link", "set", zone.veth, "master", self.bridge])
            _run([ip, "link", "set", zone.veth, "up"])
        self._wait_reachable()
        return self

    def _wait_reachable(self, timeout_s: float = 5.0) -> None:
        """Wait until each zone's address answers (duplicate address detection, bridge learning)."""
        deadline = time.monotonic() + timeout_s
        for zone in self.zones.values():
            while True:
                state = _run([ip_command(), "-n", zone.netns, "-o", "link", "show", "eth0"]).stdout
                if "LOWER_UP" in state:
                    break
                if time.monotonic() > deadline:
                    raise ZonesError(f"{zone.name}: eth0 did not come up")
                time.sleep(0.02)

    def down(self) -> None:
        """Remove everything this run created. Safe to call twice and after a partial ``up``."""
        if not self._record:
            return
        teardown_run(self._record)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.state_dir)
        self._record = {}
        self._up = False
        _LIVE_NETWORKS.discard(self)

    def __enter__(self) -> ZoneNetwork:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- running things in a zone ---------------------------------------------------------------------

    def zone(self, letter_or_name: str) -> Zone:
        return self.zones[letter_or_name.removeprefix("zone-")]

    def exec_argv(self, letter: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the zone's namespace (``ip netns exec`` execs it: same pid)."""
        return [ip_command(), "netns", "exec", self.zone(letter).netns, *argv]

    def run_in(self, letter: str, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(self.exec_argv(letter, argv), check=check)

    # --- faults -------------------------------------------------------------------------------------

    def _iptables(self, letter: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run_in(letter, [iptables_command(), "-w", "5", *args], check=check)

    def _chain(self, letter: str, chain: str, hook: str = "INPUT") -> None:
        """Create ``chain`` in the zone (once) and jump to it first thing from ``hook``."""
        if self._iptables(letter, "-n", "-L", chain, check=False).returncode == 0:
            return
        self._iptables(letter, "-N", chain)
        self._iptables(letter, "-I", hook, "1", "-j", chain)

    def partition(self, letter: str, others: Iterable[str] | None = None) -> None:
        """Cut zone ``letter`` off from the other zones (or only from ``others``), both directions,
        clients in those zones included (the root proxy's routes from their client addresses).

        Packets are dropped silently on arrival (INPUT of both ends), as a lost link would: senders
        see timeouts, not errors. The root namespace (test process, PostgreSQL forwarder) stays
        reachable from every zone; use :meth:`link_down` to cut a zone off from everything.
        """
        iptables_command()
        targets = [o for o in (others if others is not None else self.zones) if o != letter]
        me = self.zone(letter)
        for other in targets:
            peer = self.zone(other)
            self._chain(letter, PARTITION_CHAIN)
            self._chain(other, PARTITION_CHAIN)
            for source in (peer.ip, peer.client_ip):
                self._iptables(letter, "-A", PARTITION_CHAIN, "-s", source, "-j", "DROP")
            for source in (me.ip, me.client_ip):
                self._iptables(other, "-A", PARTITION_CHAIN, "-s", source, "-j", "DROP")

    def drop_one_way(self, source: str, destination: str) -> None:
        """Lose every packet from zone ``source`` arriving in zone ``destination`` (one direction only:
        requests get through, answers do not)."""
        iptables_command()
        self._chain(destination, PARTITION_CHAIN)
        self._iptables(destination, "-A", PARTITION_CHAIN, "-s", self.zone(source).ip, "-j", "DROP")

    def heal(self) -> None:
        """Remove every partition rule in every zone."""
        for letter in self.zones:
            if self._iptables(letter, "-n", "-L", PARTITION_CHAIN, check=False).returncode == 0:
                self._iptables(letter, "-F", PARTITION_CHAIN)

    def set_loss(self, probability: float) -> None:
        """Drop each packet between zones (and between a zone and the root namespace's "wan" address)
        with ``probability``, independently per packet and per direction. ``0`` removes the rules."""
        iptables_command()
        if not 0 <= probability < 1:
            raise ValueError("loss probability must be in [0, 1)")
        chance = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.6f}", "-j", "DROP"]
        for letter in self.zones:
            self._chain(letter, LOSS_CHAIN)
            self._chain(letter, LOSS_OUT_CHAIN, "OUTPUT")
            self._iptables(letter, "-F", LOSS_CHAIN)
            self._iptables(letter, "-F", LOSS_OUT_CHAIN)
            if probability <= 0:
                continue
            others = [z for z in self.zones.values() if z.letter != letter]
            remote = [self.wan_ip, *(z.client_ip for z in others)]  # the root proxy's inter-zone routes
            for source in [z.ip for z in others] + remote:
                self._iptables(letter, "-A", LOSS_CHAIN, "-i", "eth0", "-s", source, *chance)
            # The root namespace has no rules of its own: its direction is dropped on the way out.
            for destination in remote:
                self._iptables(letter, "-A", LOSS_OUT_CHAIN, "-o", "eth0", "-d", destination, *chance)

    def link_down(self, letter: str) -> None:
        """Cut the zone's cable: its veth goes down (nothing reaches it, root namespace included)."""
        _run([ip_command(), "link", "set", self.zone(letter).veth, "down"])

    def link_up(self, letter: str) -> None:
        _run([ip_command(), "link", "set", self.zone(letter).veth, "up"])

    def dropped(self, letter: str, chains: Sequence[str] = (LOSS_CHAIN, LOSS_OUT_CHAIN)) -> int:
        """Packets dropped so far by ``chains`` in the zone (to check that a fault really bit)."""
        dropped = 0
        for chain in chains:
            out = self._iptables(letter, "-n", "-v", "-x", "-L", chain, check=False).stdout
            for line in out.splitlines():
                words = line.split()
                if len(words) > 2 and words[2] == "DROP" and words[0].isdigit():
                    dropped += int(words[0])
        return dropped

    def netem(self, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay every packet leaving each zone, and each packet entering it from the bridge, by half
        of ``delay_ms`` (so zone to zone is ``delay_ms`` one way). Only where netem exists."""
        tc = shutil.which("tc")
        if tc is None:
            raise ZonesError("tc is missing")
        half = f"{delay_ms / 2:.3f}ms"
        jitter = [f"{jitter_ms / 2:.3f}ms"] if jitter_ms else []
        for zone in self.zones.values():
            self.run_in(zone.letter, [tc, "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", half, *jitter])
            _run([tc, "qdisc", "replace", "dev", zone.veth, "root", "netem", "delay", half, *jitter])


# --- cleanup ------------------------------------------------------------------------------------------


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int, start: str) -> bool:
    return bool(start) and _start_time(pid) == start


def _terminate(pids: Iterable[int], timeout_s: float = 5.0) -> None:
    """SIGTERM these process ids, then SIGKILL those still there after ``timeout_s``."""
    pending = {pid: _start_time(pid) for pid in pids}
    pending = {pid: start for pid, start in pending.items() if start}
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending = {pid: start for pid, start in pending.items() if _alive(pid, start)}
        time.sleep(0.05)
    for pid, start in pending.items():
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def namespace_pids(netns: str) -> list[int]:
    result = _run([ip_command(), "netns", "pids", netns], check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def _process_is_ours(pid: int) -> bool:
    """A recorded root-namespace pid is only killed if it still runs one of our commands."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"zones.proxy" in command or b"countersign" in command


def teardown_run(record: dict[str, Any]) -> list[str]:
    """Stop the processes of a run, delete its namespaces, bridge and schemas. Returns what was removed."""
    ip = ip_command()
    removed: list[str] = []
    namespaces = set(_run([ip, "netns", "list"], check=False).stdout.split())
    # 1. processes first: nothing may try to reach a zone address once its route is gone.
    pids = [p for p in record.get("pids", []) if _process_is_ours(p)]
    for netns in record.get("netns", []):
        if netns in namespaces:
            pids += namespace_pids(netns)
    _terminate(sorted(set(pids)))
    removed += [f"pid {p}" for p in sorted(set(pids))]
    # 2. veths (deleting one end deletes both, at once: a deleted namespace frees its devices later),
    #    namespaces (their addresses and netfilter rules go with them), then the bridge.
    for veth in record.get("veths", []):
        if _run([ip, "link", "show", veth], check=False).returncode == 0:
            _run([ip, "link", "del", veth], check=False)
    for netns in record.get("netns", []):
        if netns in namespaces:
            _run([ip, "netns", "del", netns], check=False)
            removed.append(f"netns {netns}")
    bridge = record.get("bridge")
    if bridge and _run([ip, "link", "show", bridge], check=False).returncode == 0:
        _run([ip, "link", "del", bridge], check=False)
        removed.append(f"bridge {bridge}")
    # 3. database schemas.
    for url, schema in record.get("schemas", []):
        if drop_schema(url, schema):
            removed.append(f"schema {schema}")
    return removed


def drop_schema(base_url: str, schema: str) -> bool:
    try:
        import psycopg
        from psycopg import sql

        with psycopg.connect(base_url, connect_timeout=5, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    except Exception:  # cleanup goes on whatever the database says
        return False
    return True


def cleanup(*, force: bool = False, state_root: Path = STATE_ROOT, postgres_url: str | None = None) -> list[str]:
    """Remove leftovers of runs whose owner process is gone (all runs with ``force``).

    Runs are found by their state directory and, for anything a state directory does not list, by
    name prefix: namespaces and links named ``csz-…`` and PostgreSQL schemas named ``csz_…``.
    """
    removed: list[str] = []
    live_prefixes: set[str] = set()
    if state_root.is_dir():
        for run_dir in sorted(state_root.iterdir()):
            try:
                record = json.loads((run_dir / "run.json").read_text())
            except (OSError, ValueError):
                with contextlib.suppress(OSError):
                    shutil.rmtree(run_dir)
                continue
            if not force and _alive(int(record.get("owner_pid", 0)), str(record.get("owner_start", ""))):
                live_prefixes.add(f"{PREFIX}-{record.get('run_id')}")
                continue
            removed += teardown_run(record)
            shutil.rmtree(run_dir, ignore_errors=True)
    ip = ip_command()
    for netns in _run([ip, "netns", "list"], check=False).stdout.split():
        if netns.startswith(PREFIX + "-") and not any(netns.startswith(p) for p in live_prefixes):
            _terminate(namespace_pids(netns))
            _run([ip, "netns", "del", netns], check=False)
            removed.append(f"netns {netns}")
    for line in _run([ip, "-o", "link", "show"], check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        if name.startswith(PREFIX + "-") and not any(name.startswith(p) for p in live_prefixes):
            _run([ip, "link", "del", name], check=False)
            removed.append(f"link {name}")
    if postgres_url:
        removed += _drop_leftover_schemas(postgres_url, {p.replace("-", "_") for p in live_prefixes})
    return removed


def _drop_leftover_schemas(base_url: str, live: set[str]) -> list[str]:
    try:
        import psycopg

        with psycopg.connect(base_url, connect_timeout=5, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s", (PREFIX + "\\_%",)
            ).fetchall()
    except Exception:
        return []
    removed = []
    for (schema,) in rows:
        if not any(schema.startswith(p) for p in live) and drop_schema(base_url, schema):
            removed.append(f"schema {schema}")
    return removed


__all__ = [
    "PREFIX",
    "STATE_ROOT",
    "Zone",
    "ZoneNetwork",
    "ZonesError",
    "ZonesUnavailable",
    "check_namespaces",
    "cleanup",
    "netem_available",
]
