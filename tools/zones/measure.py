"""``python -m tools.zones measure``: issuance, full verification and revocation propagation across three zones.

With about 1 ms of round trip between zones (0.5 ms one way on every inter-zone route), mTLS on:

1. issuance of a co-signed cross-deployer edge: the child runtime (zone-b) calls its signer
   (zone-b), which asks the parent's signer (zone-a) to co-sign; the time of ``AcceptDelegation``;
2. full verification through the verifier service: a client in one zone, the verifier in another,
   a depth-5 SIGNED-DAG path (13 signatures) in accept mode (nonce consumed in PostgreSQL);
3. revocation propagation: from just before the operator's ``Submit`` (the coordinator accepts it
   on receipt) until EVERY verifier rejects a path signed by the revoked key with ``KEY_REVOKED``.

Each is measured under two storage profiles, because a disk ``fsync`` on this machine has cost
anything from 0.1 to 4 ms, and every issuance and every accept waits for one (the parent signer's
SQLite ``synchronous=FULL``, PostgreSQL ``synchronous_commit=on``):

* ``durable``: daemon state on disk, PostgreSQL as configured;
* ``fast-commit``: daemon state on tmpfs and the verifiers' PostgreSQL sessions with
  ``synchronous_commit=off`` — what a disk with a sub-millisecond fsync would show. Not a
  production setting: a PostgreSQL crash may forget the last consumed nonces.

Each profile also measures, in the same run, this host's raw costs and the daemons' own handlers
called in one process (each part after idling as long as a route's one-way delay, as the daemons
idle; and back to back), and prints every figure beside the two floors they set (``zones/floor.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

from countersign.client import VerifierClient
from countersign.errors import ServiceError
from countersign.keys import Ed25519Signer
from countersign.reasons import Reason
from countersign_cli.localmesh import ISSUANCE_BREAKDOWN, histogram_mean
from tools.zones.evidence import Evidence, Operator, signed_paths
from tools.zones.floor import HandlerCosts, RawCosts, measure_handlers, measure_raw
from tools.zones.mesh import DATABASE_ZONE, DEFAULT_POSTGRES_URL, PLACEMENT, ZoneMesh
from tools.zones.net import check_namespaces
from verifier.daemon import VerifierConfig

PUBLISHED = {
    "issuance": (3.651, 4.384),
    "verification": (5.015, 6.642),
}
REVOCATION_TARGET_P99_MS = 1000.0
# (verifier, the client's zone, label): the three ways a verification can cross zones.
VERIFICATIONS = (
    (0, "b", "client zone-b -> verifier-0 (zone-a, database local)"),
    (1, "b", "client zone-b -> verifier-1 (zone-b, database remote)"),
    (1, "a", "client zone-a -> verifier-1 (zone-b, database remote)"),
)
MEASURE_DEPLOYER = "deployer-rev"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


@dataclass
class Series:
    values_ms: list[float] = field(default_factory=list)
    discarded: int = 0  # attempts that met a store outage (not counted)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values_ms) if self.values_ms else float("nan")

    def p(self, q: float) -> float:
        return percentile(self.values_ms, q)


@dataclass
class ProfileResult:
    name: str
    rtt_direct_ms: float = 0.0
    rtt_route_ms: float = 0.0
    issuance: Series = field(default_factory=Series)
    verification: dict[str, Series] = field(default_factory=dict)
    revocation: Series = field(default_factory=Series)
    revocation_misses: int = 0
    configured_delay_ms: float = 0.0
    breakdown: dict[str, float] = field(default_factory=dict)
    raw: RawCosts | None = None
    handlers: HandlerCosts | None = None  # each part after the route's one-way delay idle: the design floor's
    handlers_hot: HandlerCosts | None = None  # the same back to back, for reference

    def issuance_floors(self) -> tuple[float | None, float | None]:
        """(this host's floor, this design's floor) for issuance; None where not measured."""
        if self.raw is None:
            return None, None
        return self.raw.issuance_floor(), None if self.handlers is None else self.handlers.issuance_floor(self.raw)

    def verification_floors(self, index: int, client_zone: str) -> tuple[float | None, float | None]:
        """The same for verifier ``index`` called from ``client_zone``."""
        if self.raw is None:
            return None, None
        where = PLACEMENT[f"verifier-{index}"]
        placement = {"client_remote": client_zone != where, "database_remote": where != DATABASE_ZONE}
        design = None if self.handlers is None else self.handlers.verification_floor(self.raw, **placement)
        return self.raw.verification_floor(**placement), design


# --- pieces ---------------------------------------------------------------------------------------


def proxies_cpu_s(zoned: ZoneMesh) -> float:
    """CPU seconds the delay proxies have used so far: the emulated network's cost, which a real
    inter-zone link does not take from the machine's CPUs."""
    ticks = 0
    for proxy in zoned.proxies.values():
        pid = json.loads(proxy.ready.read_text())["pid"]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def echo_rtt(address: str, count: int) -> float:
    """Median round trip (ms) of a 64-byte message to an echo server over one kept connection."""
    host, port = address.rsplit(":", 1)
    samples = []
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = b"x" * 64
        for _ in range(count):
            started = time.perf_counter()
            conn.sendall(payload)
            received = b""
            while len(received) < len(payload):
                chunk = conn.recv(len(payload) - len(received))
                if not chunk:
                    raise ConnectionError("echo server closed")
                received += chunk
            samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def calibrate(zoned: ZoneMesh, one_way_ms: float, log: Callable[[str], None], rounds: int = 6) -> float:
    """Adjust the proxies' configured delay so that an inter-zone round trip *adds* ``2 × one_way_ms``
    to a direct one (the proxies' own forwarding time counts against the delay). Returns the
    configured one-way delay. With netem (no proxy hop) the delay is used as given."""
    if not zoned.proxied or one_way_ms <= 0:
        return one_way_ms
    target = 2 * one_way_ms
    configured = one_way_ms
    direct = echo_rtt(zoned.echo_address("a", delayed=False), 200)
    for _ in range(rounds):
        zoned.set_delay(configured)
        time.sleep(0.1)  # the proxies reload on SIGHUP
        added = echo_rtt(zoned.echo_address("a", delayed=True), 200) - direct
        log(f"  configured one-way {configured:.3f} ms -> round trip adds {added:.3f} ms (target {target:.3f})")
        if abs(added - target) < 0.05:
            break
        configured = max(0.0, configured + (target - added) / 2)
    zoned.set_delay(configured)
    time.sleep(0.1)
    return configured


def measure_issuance(zoned: ZoneMesh, count: int, warmup: int) -> Series:
    parent_runtime, child_runtime = zoned.runtime("deployer-a"), zoned.runtime("deployer-b")
    try:
        parent = parent_runtime.root("measure-parent", "zones", max_children=count + warmup + 10)
        address = zoned.signer_address("deployer-a", from_deployer="deployer-b")
        series = Series()
        for index in range(count + warmup):
            grant = parent_runtime.open_grant(parent, "deployer-b")
            started = time.perf_counter()
            child_runtime.accept(parent, grant, address, f"measure-child-{index}")
            elapsed = (time.perf_counter() - started) * 1000
            if index >= warmup:
                series.values_ms.append(elapsed)
        return series
    finally:
        parent_runtime.close()
        child_runtime.close()


def measure_verification(zoned: ZoneMesh, index: int, from_zone: str, count: int, warmup: int) -> Series:
    evidence = signed_paths(zoned.local.deployer_keys, count + warmup, depth=5)
    client = zoned.verifier_client(index, from_zone=from_zone)
    try:
        series = Series()
        for position, item in enumerate(evidence):
            data = item.data
            started = time.perf_counter()
            try:
                result = client.verify(data, item.output).result
            except ServiceError as exc:
                if exc.code != "STATE_UNAVAILABLE":
                    raise
                # The store was unreachable (another suite restarting PostgreSQL): no sample.
                series.discarded += 1
                time.sleep(0.5)
                continue
            elapsed = (time.perf_counter() - started) * 1000
            if not result:
                raise RuntimeError(f"a valid depth-5 path was rejected: {result}")
            if position >= warmup:
                series.values_ms.append(elapsed)
        return series
    finally:
        client.close()


def _wait_all_accept(clients: Sequence[VerifierClient], data: bytes, output: bytes, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for client in clients:
        while True:
            try:
                result = client.verify(data, output, audit=True).result
            except ServiceError as exc:
                if exc.code != "STATE_UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                continue
            if result:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"a path signed by a freshly added key is not accepted: {result}")
            time.sleep(0.005)


def _poll_revoked(
    client: VerifierClient, item: Evidence, go: threading.Event, seen: list[float | None], slot: int, timeout_s: float
) -> None:
    """Once ``go`` is set, ask ``client`` (audit mode) until it rejects ``item`` with KEY_REVOKED."""
    go.wait()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = client.verify(item.data, item.output, audit=True).result
        except ServiceError:
            continue  # a store outage is no answer: ask again
        if not result and result.reason is Reason.KEY_REVOKED:
            seen[slot] = time.monotonic()
            return


def measure_revocation(zoned: ZoneMesh, count: int, *, timeout_s: float = 10.0) -> tuple[Series, int]:
    """Revoke ``count`` fresh keys one after another; per revocation, the time until all verifiers reject."""
    operator = Operator(zoned.local)
    clients = [zoned.verifier_client(i) for i in range(3)]
    series, misses = Series(), 0
    try:
        first = Ed25519Signer.generate()
        operator.enrol(MEASURE_DEPLOYER, first)
        for _ in range(count):
            key = Ed25519Signer.generate()
            operator.add_key(MEASURE_DEPLOYER, key)
            (item,) = signed_paths({MEASURE_DEPLOYER: key}, 1, depth=1)
            _wait_all_accept(clients, item.data, item.output)
            revoke = operator.revoke_statement(MEASURE_DEPLOYER, key)
            go = threading.Event()
            seen: list[float | None] = [None] * len(clients)
            threads = [
                threading.Thread(target=_poll_revoked, args=(c, item, go, seen, i, timeout_s), daemon=True)
                for i, c in enumerate(clients)
            ]
            for thread in threads:
                thread.start()
            sent, _ = operator.submit(revoke)
            go.set()
            for thread in threads:
                thread.join(timeout_s + 5)
            if any(t is None for t in seen):
                misses += 1
                continue
            series.values_ms.append((max(t for t in seen if t is not None) - sent) * 1000)
        return series, misses
    finally:
        for client in clients:
            client.close()
        operator.close()


def run_profile(
    name: str,
    *,
    delay_ms: float,
    issuances: int,
    verifications: int,
    revocations: int,
    warmup: int,
    delay_mode: str,
    base_dir: Path,
    postgres_url: str,
    log: Callable[[str], None],
    calibrate_delay: bool = True,
    signature_threads: int = VerifierConfig.signature_threads,
) -> ProfileResult:
    result = ProfileResult(name)
    workdir = Path(tempfile.mkdtemp(prefix="zones-measure-", dir=base_dir))
    options = {"signature_threads": signature_threads}
    try:
        with ZoneMesh(
            workdir, delay_ms=delay_ms, delay_mode=delay_mode, postgres_url=postgres_url, verifier_options=options
        ) as zoned:
            log(f"[{name}] zones up ({zoned.delay_mode}); calibrating")
            result.configured_delay_ms = calibrate(zoned, delay_ms, log) if calibrate_delay else delay_ms
            result.rtt_direct_ms = echo_rtt(zoned.echo_address("a", delayed=False), 300)
            result.rtt_route_ms = echo_rtt(zoned.echo_address("a", delayed=True), 300)
            log(f"[{name}] raw costs")
            result.raw = measure_raw(zoned, workdir, signature_threads=signature_threads)
            log(f"[{name}] the same handlers in one process, woken and back to back")
            count = min(300, max(issuances, verifications))
            # A daemon's part of a call starts on a CPU that idled at least while the call crossed a
            # route, and runs slower for it on a VM (docs/zones.md): the design floor is timed so.
            result.handlers = measure_handlers(
                zoned, workdir, count=count, signature_threads=signature_threads, idle_ms=delay_ms
            )
            result.handlers_hot = measure_handlers(zoned, workdir, count=count, signature_threads=signature_threads)
            log(f"[{name}] issuance x{issuances}")
            histograms = zoned.local.histogram_totals
            before_all = {label: histograms(d, n, labels) for label, d, n, labels in ISSUANCE_BREAKDOWN}
            cpu_before = proxies_cpu_s(zoned)
            result.issuance = measure_issuance(zoned, issuances, warmup)
            calls = len(result.issuance.values_ms) + warmup
            result.breakdown["the delay proxies' CPU per issuance"] = (proxies_cpu_s(zoned) - cpu_before) / calls * 1000
            for label, daemon, metric, labels in ISSUANCE_BREAKDOWN:
                after = histograms(daemon, metric, labels)
                result.breakdown[f"issuance: {label}"] = histogram_mean(before_all[label], after) * 1000
            log(f"[{name}] verification x{verifications}")
            for index, client_zone, label in VERIFICATIONS:
                service = (f"verifier-{index}", "countersign_verify_seconds")
                before, cpu_before = histograms(*service, {"mode": "accept"}), proxies_cpu_s(zoned)
                result.verification[label] = measure_verification(zoned, index, client_zone, verifications, warmup)
                where = f"verifier-{index} (client zone-{client_zone})"
                after = histograms(*service, {"mode": "accept"})
                result.breakdown[f"verification: inside {where}"] = histogram_mean(before, after) * 1000
                result.breakdown[f"the delay proxies' CPU per verification, {where}"] = (
                    (proxies_cpu_s(zoned) - cpu_before) / (verifications + warmup) * 1000
                )
            log(f"[{name}] revocation x{revocations}")
            result.revocation, result.revocation_misses = measure_revocation(zoned, revocations)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


# --- report ----------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _floor(series: Series, floor_ms: float | None) -> str:
    if floor_ms is None or floor_ms <= 0:
        return "—"
    return f"{floor_ms:.3f} ({series.mean / floor_ms:.2f}×)"


def verdict(value: float, target: float, floor_ms: float | None = None, design_floor_ms: float | None = None) -> str:
    """Whether ``value`` is below the published ``target``. When it is not, the table says which floor
    misses it too: this host's (no implementation meets the target here) or this design's (these
    handlers do not, however thin the serving around them)."""
    if value < target:
        return "below"
    if floor_ms is not None and floor_ms >= target:
        return "ABOVE (so is this host's floor)"
    if design_floor_ms is not None and design_floor_ms >= target:
        return "ABOVE (so is this design's floor here)"
    return "ABOVE"


def report(results: Sequence[ProfileResult], *, command: str, delay_ms: float, mode: str, load: str, cpu: str) -> str:
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {today} on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}),",
        f"`{command}`; target inter-zone one-way delay {delay_ms} ms ({mode}, calibrated so that a round trip"
        f" adds {2 * delay_ms} ms); mTLS on everywhere; {cpu}; load average before the run {load}.",
        "",
    ]
    for result in results:
        parts = ", ".join(f"{label} {value:.3f} ms" for label, value in result.breakdown.items())
        lines.append(f"- {result.name} means: {parts}")
    for result in results:
        lines.append(
            f"- {result.name}: configured one-way delay {result.configured_delay_ms:.3f} ms; echo round trip to"
            f" zone-a direct {result.rtt_direct_ms:.3f} ms, through an inter-zone route {result.rtt_route_ms:.3f} ms"
            f" (the route adds {result.rtt_route_ms - result.rtt_direct_ms:.3f} ms)"
        )
    for result in results:
        if result.raw is not None:
            lines.append(f"- {result.name}, this host's raw costs in this run: " + "; ".join(result.raw.lines()))
        for handlers in (result.handlers, result.handlers_hot):
            if handlers is not None:
                lines.append(
                    f"- {result.name}, the daemons' handlers called in one process (no gRPC) in this run, "
                    + "; ".join(handlers.lines())
                )
    header = (
        "| measurement | published (3 AWS AZs, no TLS) | profile | n | mean ms | p50 ms | p95 ms | p99 ms"
        " | vs published | raw floor ms (mean ÷ floor) | design floor ms (mean ÷ floor) |"
    )
    lines += ["", header, "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    pub_i, pub_v = PUBLISHED["issuance"], PUBLISHED["verification"]
    for result in results:
        s = result.issuance
        floor, design = result.issuance_floors()
        lines.append(
            f"| co-signed cross-deployer issuance (zone-b child, zone-a parent) | {pub_i[0]} mean, p95 {pub_i[1]} "
            f"| {result.name} | {len(s.values_ms)} | {_ms(s.mean)} | {_ms(s.p(50))} | {_ms(s.p(95))} | {_ms(s.p(99))} "
            f"| {verdict(s.mean, pub_i[0], floor, design)} | {_floor(s, floor)} | {_floor(s, design)} |"
        )
    for result in results:
        for index, client_zone, label in VERIFICATIONS:
            if label not in result.verification:
                continue
            s = result.verification[label]
            floor, design = result.verification_floors(index, client_zone)
            note = f" ({s.discarded} calls met a store outage, not counted)" if s.discarded else ""
            lines.append(
                f"| full verification, depth-5 SIGNED-DAG, accept: {label}{note} | {pub_v[0]} mean, p95 {pub_v[1]} "
                f"| {result.name} | {len(s.values_ms)} | {_ms(s.mean)} | {_ms(s.p(50))} | {_ms(s.p(95))} "
                f"| {_ms(s.p(99))} | {verdict(s.mean, pub_v[0], floor, design)} | {_floor(s, floor)} "
                f"| {_floor(s, design)} |"
            )
    for result in results:
        s = result.revocation
        miss = f", {result.revocation_misses} not seen in 10 s" if result.revocation_misses else ""
        lines.append(
            f"| revocation: operator Submit -> every verifier rejects (KEY_REVOKED) | target p99 < 1000 "
            f"| {result.name} | {len(s.values_ms)}{miss} | {_ms(s.mean)} | {_ms(s.p(50))} | {_ms(s.p(95))} "
            f"| {_ms(s.p(99))} | p99 {'below' if s.p(99) < REVOCATION_TARGET_P99_MS else 'ABOVE'} target | — | — |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.zones measure", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few samples")
    parser.add_argument("--issuances", type=int, default=300)
    parser.add_argument("--verifications", type=int, default=300)
    parser.add_argument("--revocations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--delay-ms", type=float, default=0.5, help="one-way delay per inter-zone route")
    parser.add_argument("--delay-mode", choices=("auto", "proxy", "netem"), default="auto")
    parser.add_argument(
        "--profile", choices=("durable", "fast-commit", "both"), default="both", help="storage profile(s)"
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument(
        "--signature-threads",
        type=int,
        default=VerifierConfig.signature_threads,
        help="the verifiers' signature_threads (docs/operations.md; default: the daemon's)",
    )
    parser.add_argument(
        "--poll-idle",
        action="store_true",
        help="hold /dev/cpu_dma_latency at 0 while measuring: idle CPUs poll instead of halting the vCPU"
        " (refused on a kernel with no cpuidle driver, where it would change nothing)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.issuances, args.verifications, args.revocations, args.warmup = 40, 40, 8, 10
    check_namespaces()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    profiles = ["durable", "fast-commit"] if args.profile == "both" else [args.profile]
    with idle_policy(poll=args.poll_idle) as cpu:
        results = run_profiles(args, profiles, log)
    command = "python -m tools.zones measure " + " ".join(argv if argv is not None else sys.argv[2:])
    print(report(results, command=command.strip(), delay_ms=args.delay_ms, mode=args.delay_mode, load=load, cpu=cpu))
    return 0


CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")


def cpuidle_driver(cpuidle: Path = CPUIDLE) -> str:
    """The kernel's cpuidle driver (``none`` when it has none, or the file is missing)."""
    try:
        return (cpuidle / "current_driver").read_text().strip() or "none"
    except OSError:
        return "none"


@contextlib.contextmanager
def idle_policy(*, poll: bool, cpuidle: Path = CPUIDLE) -> Iterator[str]:
    """With ``poll``, ask the kernel (PM QoS) for 0 µs wake-up latency while measuring, so idle CPUs
    poll instead of halting: on a VM with the ``haltpoll`` cpuidle driver and
    ``haltpoll.guest_halt_poll_ns=0``, waking a halted vCPU costs tens to hundreds of microseconds at
    every hand-off between processes. The request lasts while the file stays open, so it ends with this
    process whatever happens. Yields how the CPUs idled, naming the cpuidle driver.

    PM QoS only steers a cpuidle driver's choice of idle state: a kernel with none (``current_driver``
    reads ``none``) halts idle CPUs whatever is asked, so ``poll`` is refused there rather than
    recorded as a setting that changed nothing."""
    driver = cpuidle_driver(cpuidle)
    if not poll:
        yield f"CPUs left to idle (the kernel's default; cpuidle driver: {driver})"
        return
    if driver == "none":
        raise SystemExit(
            f"--poll-idle cannot make idle CPUs poll here: this kernel has no cpuidle driver"
            f" ({cpuidle / 'current_driver'}: none), so idle CPUs halt whatever PM QoS asks; measure without it"
        )
    try:
        handle = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    except OSError as exc:
        raise SystemExit(f"--poll-idle needs /dev/cpu_dma_latency (root, a kernel with PM QoS): {exc}") from None
    try:
        os.write(handle, struct.pack("i", 0))
        yield f"CPUs polling when idle (PM QoS: /dev/cpu_dma_latency held at 0 µs; cpuidle driver: {driver})"
    finally:
        os.close(handle)


def run_profiles(args: argparse.Namespace, profiles: list[str], log: Callable[[str], None]) -> list[ProfileResult]:
    results = []
    for name in profiles:
        if name == "durable":
            base, url = Path(tempfile.gettempdir()), args.postgres_url
        else:
            base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())  # noqa: S108
            sep = "&" if "?" in args.postgres_url else "?"
            url = args.postgres_url + sep + urlencode({"options": "-c synchronous_commit=off"}, quote_via=quote)
        results.append(
            run_profile(
                name,
                delay_ms=args.delay_ms,
                issuances=args.issuances,
                verifications=args.verifications,
                revocations=args.revocations,
                warmup=args.warmup,
                delay_mode=args.delay_mode,
                base_dir=base,
                postgres_url=url,
                log=log,
                signature_threads=args.signature_threads,
            )
        )
    return results
