"""The Countersign mesh spread over three zones, with delay proxies on every inter-zone route.

Placement (``PLACEMENT``, the default: one signer per deployer, one coordinator)::

    zone-a: coordinator, deployer-a's signer, verifier-0   (+ PostgreSQL, logically)
    zone-b: deployer-b's signer, verifier-1
    zone-c: deployer-c's signer, verifier-2

With replicas (``ZoneMesh(signer_replicas=3, coordinators=2)``, :func:`placement`): every deployer's
signer has a replica in each zone (``deployer-a`` in zone-a, ``deployer-a-r1`` in zone-b,
``deployer-a-r2`` in zone-c; deployer-b's start in zone-b, deployer-c's in zone-c), the replicas of one
deployer on one PostgreSQL schema (through the forwarder of their own zone), and the coordinators
(``coordinator`` in zone-a, ``coordinator-1`` in zone-b) on one PostgreSQL log store. Followers name
every coordinator, their own zone's first; a runtime in a zone (:meth:`ZoneMesh.runtime`) names its
deployer's replicas, its own zone's first, the others through the routes.

Each zone runs one proxy process (``tools.zones.proxy``) listening on the zone's address, one route per
service in another zone (the coordinator, the other zones' signers): a daemon in zone X dials a
service in zone Y at ``<X address>:<route port of Y's service>`` and the proxy forwards to the
service with the configured one-way delay each way. Daemons are pointed at those addresses through
the launcher (``COUNTERSIGN_COORDINATOR``, ``COUNTERSIGN_STORE_URL``) and, for co-signing, through
the ``parent_signer`` address a runtime passes in ``AcceptDelegation`` (:meth:`ZoneMesh.signer_address`).

The root namespace runs one more proxy process: the PostgreSQL forwarder (one listener per zone on
the "wan" address, forwarding to ``127.0.0.1:5432``; delayed for zones other than the database's)
and the client routes (the test process acting as a client in zone X reaching verifier-i in zone
Y ≠ X). When the kernel has netem, the zone proxies are not used: every zone's link is delayed by
netem instead, and the root proxy only forwards PostgreSQL.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from countersign.client import OperatorClient, SignerClient, VerifierClient
from countersign.client.failover import RetryPolicy
from countersign_cli.localmesh import LocalMesh
from tools.zones.net import ZoneNetwork, ZonesError, netem_available, trap_sigterm
from tools.zones.proxy import Route

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
ZONES = ("a", "b", "c")
VERIFIERS = 3
DATABASE_ZONE = "a"
DEFAULT_POSTGRES_URL = os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
# Fixed ports inside the zones: every zone is a fresh namespace with its own address, so nothing
# else can hold them, and every address is known before any daemon starts.
DAEMON_PORTS = {"coordinator": 7100, "signer": 7200, "verifier": 7300}
METRICS_OFFSET = 2000
# PostgreSQL connections per replica (the server's max_connections is shared by the whole machine).
SIGNER_POOL = 4
COORDINATOR_POOL = 2
ROUTE_BASE_PORT = 8100
ECHO_PORT = 8999
ECHO_ROUTE_BASE_PORT = 8900
REPO_ROOT = Path(__file__).resolve().parents[2]  # tools/zones/mesh.py -> the repository


def kind_of(name: str) -> str:
    if name == "coordinator" or name.startswith("coordinator-"):
        return "coordinator"
    return "verifier" if name.startswith("verifier-") else "signer"


def deployer_of(name: str) -> str:
    """The deployer a signer replica serves (``deployer-a-r2`` -> ``deployer-a``)."""
    return re.sub(r"-r[0-9]+$", "", name)


def coordinator_names(count: int) -> list[str]:
    """As LocalMesh names them: ``coordinator``, ``coordinator-1``, ..."""
    return ["coordinator", *(f"coordinator-{i}" for i in range(1, count))]


def signer_names(deployer: str, replicas: int) -> list[str]:
    """As LocalMesh names them: ``deployer-a``, ``deployer-a-r1``, ..."""
    return [deployer, *(f"{deployer}-r{i}" for i in range(1, replicas))]


def placement(signer_replicas: int = 1, coordinators: int = 1) -> dict[str, str]:
    """Daemon name -> zone letter. A deployer's first replica is in its home zone (deployer-a: zone-a, and
    so on), its next ones in the zones after it; coordinator ``i`` in the ``i``-th zone; verifier ``i``
    in the ``i``-th zone. At most one replica of a deployer, and one coordinator, per zone."""
    if not 1 <= signer_replicas <= len(ZONES) or not 1 <= coordinators <= len(ZONES):
        raise ValueError(f"signer_replicas and coordinators must be between 1 and {len(ZONES)} (one per zone)")
    places = {name: ZONES[i] for i, name in enumerate(coordinator_names(coordinators))}
    for home, deployer in enumerate(DEPLOYERS):
        for i, name in enumerate(signer_names(deployer, signer_replicas)):
            places[name] = ZONES[(home + i) % len(ZONES)]
    places.update({f"verifier-{i}": ZONES[i % len(ZONES)] for i in range(VERIFIERS)})
    return places


PLACEMENT: dict[str, str] = placement()


def daemon_port(name: str) -> int:
    """The daemon's port in its zone: fixed, distinct among what can share a zone."""
    kind = kind_of(name)
    if kind == "signer":
        return DAEMON_PORTS["signer"] + DEPLOYERS.index(deployer_of(name))
    if kind == "coordinator":
        return DAEMON_PORTS["coordinator"] + coordinator_names(len(ZONES)).index(name)
    return DAEMON_PORTS["verifier"]


@dataclass
class ProxyProcess:
    name: str
    zone: str | None  # None: the root namespace
    spec: Path
    ready: Path
    log: Path
    process: subprocess.Popen[bytes]
    ports: dict[str, int]


_LIVE: weakref.WeakSet[ZoneMesh] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for zoned in list(_LIVE):
        zoned.close()


class ZoneMesh:
    """Zones, proxies and a whole LocalMesh; everything is torn down by :meth:`close` (context manager).

    ``delay_ms`` is the one-way delay of every inter-zone route (a round trip costs twice that);
    ``jitter_ms`` adds a uniform ±jitter per chunk without reordering. ``delay_mode`` is ``auto``
    (netem when the kernel has it, else the proxies), ``proxy`` or ``netem``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        loss: float = 0.0,
        staleness_ms: int = 30_000,
        heartbeat_ms: int = 1_000,
        cosign_timeout_ms: int = 2_000,
        delay_mode: str = "auto",
        postgres_url: str = DEFAULT_POSTGRES_URL,
        connect_timeout_s: float = 3.0,
        store_connect_timeout_s: int = 3,
        enrol: bool = True,
        verifier_options: Mapping[str, Any] | None = None,
        signer_options: Mapping[str, Any] | None = None,
        signer_replicas: int = 1,
        coordinators: int = 1,
    ) -> None:
        self.workdir = workdir
        self.placement = placement(signer_replicas, coordinators)
        self.signer_replicas = signer_replicas
        self.coordinators = coordinators
        self.signer_options = dict(signer_options or {})
        self.verifier_options = dict(verifier_options or {})
        self.delay_ms = delay_ms
        self.jitter_ms = jitter_ms
        self.loss = loss
        self.staleness_ms = staleness_ms
        self.heartbeat_ms = heartbeat_ms
        self.cosign_timeout_ms = cosign_timeout_ms
        self.postgres_url = postgres_url
        self.connect_timeout_s = connect_timeout_s
        self.store_connect_timeout_s = store_connect_timeout_s
        self.enrol = enrol
        if delay_mode not in ("auto", "proxy", "netem"):
            raise ValueError("delay_mode must be auto, proxy or netem")
        self.requested_mode = delay_mode
        self.delay_mode = "proxy"
        self.net = ZoneNetwork()
        self.schema = f"csz_{self.net.run_id}"
        self.proxies: dict[str, ProxyProcess] = {}
        self.mesh: LocalMesh | None = None
        self._closed = False
        self._lock = threading.Lock()

    # --- life cycle -----------------------------------------------------------------------------

    def __enter__(self) -> ZoneMesh:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ZoneMesh:
        _LIVE.add(self)
        trap_sigterm()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.requested_mode == "netem" or (self.requested_mode == "auto" and self.delay_ms and netem_available()):
            self.delay_mode = "netem"
        self.net.up()
        if self.delay_mode == "netem" and self.delay_ms:
            self.net.netem(self.delay_ms, self.jitter_ms)
        for schema in self.schemas:
            self.net.record("schemas", [self.postgres_url, schema])
        wait_for_postgres(self.postgres_url)
        self._start_proxies()
        if self.loss:
            self.net.set_loss(self.loss)
        self.mesh = LocalMesh(
            self.workdir / "mesh",
            deployers=DEPLOYERS,
            verifiers=VERIFIERS,
            tls=True,
            hosts={name: self.net.zone(zone).ip for name, zone in self.placement.items()},
            verifier_store_url=self.store_url(DATABASE_ZONE),
            staleness_ms=self.staleness_ms,
            heartbeat_ms=self.heartbeat_ms,
            cosign_timeout_ms=self.cosign_timeout_ms,
            signer_options=self.signer_options,
            verifier_options=self.verifier_options,
            launcher=self._launch,
            signer_replicas=dict.fromkeys(DEPLOYERS, self.signer_replicas),
            # The configs name the database's zone; each replica's launcher names its own zone's route.
            signer_state_urls={d: self.signer_state_url(d, DATABASE_ZONE) for d in DEPLOYERS if self.shared_signers},
            coordinators=self.coordinators,
            log_store_url=self.log_store_url(DATABASE_ZONE) if self.shared_log else None,
        ).setup()
        self.mesh.start_all()
        if self.enrol:
            self.mesh.enrol_all()
        return self

    @property
    def shared_signers(self) -> bool:
        """Whether each deployer's signer replicas share one PostgreSQL schema (else one SQLite file)."""
        return self.signer_replicas > 1

    @property
    def shared_log(self) -> bool:
        """Whether the coordinators share one PostgreSQL log store (else one SQLite file)."""
        return self.coordinators > 1

    @property
    def schemas(self) -> list[str]:
        """Every PostgreSQL schema this run uses (dropped at teardown)."""
        found = [self.schema]
        if self.shared_signers:
            found += [self.signer_schema(d) for d in DEPLOYERS]
        if self.shared_log:
            found.append(f"{self.schema}_log")
        return found

    def signer_schema(self, deployer: str) -> str:
        """The schema ``deployer``'s signer replicas share (one per deployer, as each would own its database)."""
        return f"{self.schema}_{deployer.replace('-', '_')}"

    def close(self) -> None:
        """Stop every process, then remove namespaces, bridge, rules and the schema. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.net.zones:
                # Faults off first: daemons drain and stop faster on a healthy network.
                with contextlib.suppress(Exception):
                    self.net.heal()
                    if self.loss:
                        self.net.set_loss(0)
            if self.mesh is not None:
                with contextlib.suppress(Exception):
                    self.mesh.stop_all()
            for proxy in self.proxies.values():
                _stop(proxy.process)
        finally:
            self.net.down()
            _LIVE.discard(self)

    # --- proxies --------------------------------------------------------------------------------

    @property
    def proxied(self) -> bool:
        return self.delay_mode == "proxy"

    def _start_proxies(self) -> None:
        specs: dict[str, tuple[str | None, list[Route]]] = {}
        delay = self.delay_ms if self.proxied else 0.0
        jitter = self.jitter_ms if self.proxied else 0.0
        timeout = self.connect_timeout_s
        if self.proxied:
            for letter, zone in self.net.zones.items():
                routes = [Route(f"echo-{letter}", zone.ip, ECHO_PORT, echo=True)]
                for name, where in self.placement.items():
                    if where != letter and kind_of(name) != "verifier":
                        target = self.net.zone(where).ip
                        routes.append(
                            Route(
                                name,
                                zone.ip,
                                self.route_port(name),
                                target,
                                daemon_port(name),
                                delay,
                                jitter,
                                timeout,
                            )
                        )
                for index, other in enumerate(self.net.zones):
                    if other != letter:
                        routes.append(
                            Route(
                                f"echo-to-{other}",
                                zone.ip,
                                ECHO_ROUTE_BASE_PORT + index,
                                self.net.zone(other).ip,
                                ECHO_PORT,
                                delay,
                                jitter,
                                timeout,
                            )
                        )
                specs[f"zone-{letter}"] = (letter, routes)
        pg = urlsplit(self.postgres_url)
        pg_host, pg_port = pg.hostname or "127.0.0.1", pg.port or 5432
        root: list[Route] = []
        for letter in self.net.zones:
            pg_delay = 0.0 if letter == DATABASE_ZONE else delay
            pg_jitter = 0.0 if letter == DATABASE_ZONE else jitter
            root.append(Route(f"pg-{letter}", self.net.wan_ip, 0, pg_host, pg_port, pg_delay, pg_jitter, timeout))
        # The test process as a client in zone X reaching a verifier or a signer replica in zone Y != X.
        for name, where in self.placement.items():
            if kind_of(name) == "coordinator":
                continue
            for letter in self.net.zones:
                if letter != where:
                    root.append(
                        Route(
                            f"client-{letter}-{name}",
                            self.net.root_ip,
                            0,
                            self.net.zone(where).ip,
                            daemon_port(name),
                            delay,
                            jitter,
                            timeout,
                            source_host=self.net.zone(letter).client_ip,  # partitioned with its zone
                        )
                    )
        for letter in self.net.zones:
            root.append(
                Route(
                    f"echo-{letter}",
                    self.net.root_ip,
                    0,
                    self.net.zone(letter).ip,
                    ECHO_PORT,
                    delay,
                    jitter,
                    timeout,
                    source_host=self.net.wan_ip,
                )
            )
        if not self.proxied:
            # netem mode: the echo servers still run (in each zone), for calibration.
            for letter, place in self.net.zones.items():
                specs[f"zone-{letter}"] = (letter, [Route(f"echo-{letter}", place.ip, ECHO_PORT, echo=True)])
        specs["root"] = (None, root)
        directory = self.workdir / "proxies"
        directory.mkdir(parents=True, exist_ok=True)
        for name, (letter_or_root, routes) in specs.items():
            spec = directory / f"{name}.json"
            spec.write_text(json.dumps({"routes": [r.to_json() for r in routes]}, indent=1))
            ready = directory / f"{name}.ready"
            ready.unlink(missing_ok=True)
            log = directory / f"{name}.log"
            argv = [sys.executable, "-m", "tools.zones.proxy", str(spec), str(ready)]
            if letter_or_root is not None:
                argv = self.net.exec_argv(letter_or_root, argv)
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            }
            with log.open("ab") as out:
                # Our own interpreter, module and files: nothing untrusted in the command.
                process = subprocess.Popen(argv, stdout=out, stderr=out, env=env, cwd=REPO_ROOT)  # noqa: S603
            if letter_or_root is None:
                self.net.record("pids", process.pid)
            self.proxies[name] = ProxyProcess(name, letter_or_root, spec, ready, log, process, {})
        for proxy in self.proxies.values():
            proxy.ports = _wait_ready(proxy)

    def set_delay(self, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Change the one-way delay of every inter-zone route from now on (proxies reload on SIGHUP)."""
        self.delay_ms, self.jitter_ms = delay_ms, jitter_ms
        if not self.proxied:
            self.net.netem(delay_ms, jitter_ms)
            return
        for proxy in self.proxies.values():
            body = json.loads(proxy.spec.read_text())
            for route in body["routes"]:
                if route.get("echo") or (route["name"] == f"pg-{DATABASE_ZONE}"):
                    continue
                route["delay_ms"], route["jitter_ms"] = delay_ms, jitter_ms
            proxy.spec.write_text(json.dumps(body, indent=1))
            proxy.process.send_signal(signal.SIGHUP)

    # --- addresses ------------------------------------------------------------------------------

    def zone_of(self, name: str) -> str:
        return self.placement[name]

    def route_port(self, name: str) -> int:
        """The port, in every other zone, of the proxy route to daemon ``name``."""
        return ROUTE_BASE_PORT + sorted(self.placement).index(name)

    def signer_names(self, deployer: str) -> list[str]:
        """``deployer``'s signer replicas, the first in its home zone."""
        return signer_names(deployer, self.signer_replicas)

    def replica_in(self, deployer: str, zone: str) -> str | None:
        """The name of ``deployer``'s replica in ``zone`` (None: it has none there)."""
        zone = zone.removeprefix("zone-")
        return next((n for n in self.signer_names(deployer) if self.placement[n] == zone), None)

    def _own_zone_first(self, names: list[str], zone: str) -> list[str]:
        return sorted(names, key=lambda name: self.placement[name] != zone)  # stable: the rest keep their order

    def _daemon_address(self, name: str) -> str:
        return f"{self.net.zone(self.placement[name]).ip}:{daemon_port(name)}"

    def address(self, name: str, *, from_zone: str) -> str:
        """Where a process in ``from_zone`` dials daemon ``name`` (a coordinator or a signer)."""
        from_zone = from_zone.removeprefix("zone-")
        if not self.proxied or self.placement[name] == from_zone:
            return self._daemon_address(name)
        if kind_of(name) == "verifier":
            return self.verifier_address(int(name.rsplit("-", 1)[1]), from_zone=from_zone)
        return f"{self.net.zone(from_zone).ip}:{self.route_port(name)}"

    def signer_address(self, deployer: str, *, from_deployer: str) -> str:
        """The ``parent_signer`` address ``from_deployer``'s runtime passes to reach ``deployer``'s signer
        (its first replica, from ``from_deployer``'s home zone)."""
        return self.address(deployer, from_zone=self.placement[from_deployer])

    def signer_addresses(self, deployer: str, *, from_zone: str, own_zone_first: bool = True) -> str:
        """Every replica of ``deployer``'s signer as a daemon in ``from_zone`` reaches it, its own zone's
        first (comma-separated): the ``parent_signer`` a runtime in that zone passes. Without
        ``own_zone_first``, in the replicas' own order (home zone first), as a zone-unaware client would."""
        from_zone = from_zone.removeprefix("zone-")
        names = self.signer_names(deployer)
        if own_zone_first:
            names = self._own_zone_first(names, from_zone)
        return ",".join(self.address(name, from_zone=from_zone) for name in names)

    def coordinator_addresses(self, *, from_zone: str) -> str:
        """Every coordinator as a follower in ``from_zone`` reaches it, its own zone's first."""
        names = self._own_zone_first(coordinator_names(self.coordinators), from_zone.removeprefix("zone-"))
        return ",".join(self.address(name, from_zone=from_zone) for name in names)

    def client_address(self, name: str, *, from_zone: str) -> str:
        """Daemon ``name`` (a verifier or a signer replica) as the test process reaches it acting as a
        client in ``from_zone``: directly in its own zone, else through the root proxy's delayed route."""
        from_zone = from_zone.removeprefix("zone-")
        if from_zone == self.placement[name] or not self.proxied:
            return self._daemon_address(name)
        return f"{self.net.root_ip}:{self.proxies['root'].ports[f'client-{from_zone}-{name}']}"

    def runtime_addresses(self, deployer: str, *, zone: str, own_zone_first: bool = True) -> list[str]:
        """``deployer``'s replicas as its runtime in ``zone`` names them: its own zone's first (else in
        the replicas' own order, as a zone-unaware client would)."""
        names = self.signer_names(deployer)
        if own_zone_first:
            names = self._own_zone_first(names, zone.removeprefix("zone-"))
        return [self.client_address(name, from_zone=zone) for name in names]

    def verifier_address(self, index: int, *, from_zone: str | None = None) -> str:
        """Verifier ``index`` as a client in ``from_zone`` reaches it (None: directly, no delay)."""
        name = f"verifier-{index}"
        if from_zone is None:
            return self._daemon_address(name)
        return self.client_address(name, from_zone=from_zone)

    def store_url(self, zone: str, *, schema: str | None = None, **params: str) -> str:
        """The PostgreSQL URL a daemon in ``zone`` uses (through the root forwarder; by default the
        per-run verifier schema), with more URL ``params`` (``pool_max_size`` ...)."""
        parts = urlsplit(self.postgres_url)
        port = self.proxies["root"].ports[f"pg-{zone}"] if self.proxies else 0
        netloc = f"{parts.username or 'postgres'}@{self.net.wan_ip}:{port}"
        query = dict(parse_qsl(parts.query))
        query.update({"schema": schema or self.schema, "connect_timeout": str(self.store_connect_timeout_s)})
        query.update(params)
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, quote_via=quote), ""))

    def signer_state_url(self, deployer: str, zone: str) -> str:
        """The state ``deployer``'s replica in ``zone`` names: the deployer's schema, through its zone's route."""
        return self.store_url(zone, schema=self.signer_schema(deployer), pool_max_size=str(SIGNER_POOL))

    def log_store_url(self, zone: str) -> str:
        """The log store a coordinator in ``zone`` names."""
        return self.store_url(zone, schema=f"{self.schema}_log", pool_max_size=str(COORDINATOR_POOL))

    def echo_address(self, zone: str, *, delayed: bool) -> str:
        """The zone's echo server, directly or through an inter-zone route (calibration)."""
        zone = zone.removeprefix("zone-")
        if delayed and self.proxied:
            return f"{self.net.root_ip}:{self.proxies['root'].ports[f'echo-{zone}']}"
        return f"{self.net.zone(zone).ip}:{ECHO_PORT}"

    def _launch(self, name: str, argv: list[str]) -> list[str]:
        zone = self.placement[name]
        kind = kind_of(name)
        ip, port = self.net.zone(zone).ip, daemon_port(name)
        env = [f"COUNTERSIGN_LISTEN={ip}:{port}", f"COUNTERSIGN_METRICS_LISTEN={ip}:{port + METRICS_OFFSET}"]
        if kind != "coordinator":
            env.append(f"COUNTERSIGN_COORDINATOR={self.coordinator_addresses(from_zone=zone)}")
        if kind == "verifier":
            env.append(f"COUNTERSIGN_STORE_URL={self.store_url(zone)}")
        if kind == "signer" and self.shared_signers:
            env.append(f"COUNTERSIGN_STATE_URL={self.signer_state_url(deployer_of(name), zone)}")
        if kind == "coordinator" and self.shared_log:
            env.append(f"COUNTERSIGN_LOG_STORE={self.log_store_url(zone)}")
        return self.net.exec_argv(zone, ["env", *env, *argv])

    # --- clients --------------------------------------------------------------------------------

    @property
    def local(self) -> LocalMesh:
        if self.mesh is None:
            raise ZonesError("the mesh is not started")
        return self.mesh

    def runtime(
        self,
        deployer: str,
        *,
        zone: str | None = None,
        retry: RetryPolicy | None = None,
        lanes: int = 4,
        own_zone_first: bool = True,
    ) -> SignerClient:
        """The deployer's runtime. Without ``zone``: in its home zone, naming every replica directly (no
        delay); with ``zone``: a runtime in that zone, naming its own zone's replica first (unless not
        ``own_zone_first``) and the others through the delayed routes. ``retry``: the SDK's failover
        policy (default: the SDK's own)."""
        tls = self.local.tls_for(f"{deployer}-runtime")
        if zone is None:
            return SignerClient(
                self.local.signer_addresses(deployer), tls, deployer, lanes=lanes, retry=retry or RetryPolicy()
            )
        addresses = self.runtime_addresses(deployer, zone=zone, own_zone_first=own_zone_first)
        return SignerClient(addresses, tls, deployer, lanes=lanes, retry=retry or RetryPolicy())

    def verifier_client(self, index: int, *, from_zone: str | None = None) -> VerifierClient:
        return VerifierClient(self.verifier_address(index, from_zone=from_zone), self.local.tls_for("client"))

    def operator_client(self) -> OperatorClient:
        """The operator, next to the coordinator (zone-a)."""
        return self.local.operator_client()

    def registry_sequence(self, name: str) -> int:
        """Statements in daemon ``name``'s persisted registry copy (0 if it has none yet)."""
        cache = self.local.workdir / "state" / f"{name}-registry.json"
        try:
            return len(json.loads(cache.read_text())["statements"])
        except (OSError, ValueError, KeyError):
            return 0

    def pids(self) -> Mapping[str, int | None]:
        return {n: (d.process.pid if d.process else None) for n, d in self.local.daemons.items()}

    def log_tails(self, lines: int = 15) -> str:
        parts = [f"--- {name} ---\n{self.local.log_tail(name, lines)}" for name in self.local.daemons]
        for proxy in self.proxies.values():
            with contextlib.suppress(OSError):
                tail = proxy.log.read_text(errors="replace").splitlines()[-lines:]
                if tail:
                    parts.append(f"--- proxy {proxy.name} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    @contextlib.contextmanager
    def partitioned(self, zone: str) -> Iterator[None]:
        """Zone cut off from the other zones for the duration of the block (healed even on error)."""
        self.net.partition(zone.removeprefix("zone-"))
        try:
            yield
        finally:
            self.net.heal()


def wait_for_postgres(url: str, timeout_s: float = 60.0) -> None:
    """Wait until PostgreSQL accepts connections (other suites on this machine may restart it)."""
    import psycopg

    base = urlunsplit((*urlsplit(url)[:3], "", ""))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(base, connect_timeout=3, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error as exc:
            if time.monotonic() > deadline:
                raise ZonesError(f"PostgreSQL at {base} is not reachable: {exc}") from None
            time.sleep(0.5)


def _wait_ready(proxy: ProxyProcess, timeout_s: float = 15.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while not proxy.ready.exists():
        if proxy.process.poll() is not None:
            tail = proxy.log.read_text(errors="replace")[-2000:]
            raise ZonesError(f"proxy {proxy.name} exited with {proxy.process.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            raise ZonesError(f"proxy {proxy.name} did not become ready in {timeout_s} s")
        time.sleep(0.02)
    ports: dict[str, int] = json.loads(proxy.ready.read_text())["ports"]
    return ports


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
