"""Mesh benchmark: VerifyPath over gRPC with mTLS beside the raw costs, and the daemons' memory.
(Co-signed issuance has its own section, bench/issuance.py.)

A local mesh (real daemon processes, mTLS) runs on loopback. The verifier is pinned to CPU 0 and the
benchmark's clients to the other CPUs, so "service throughput" and "in-process verification" are
measured on the same core. Figures are percentiles of individual calls, and requests per second over a
timed window.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path as FilePath
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.keys import Ed25519Signer
from countersign.records import AgentRef, BindingScope, Construction, Envelope, OutputReceipt, Path
from countersign.registry import Registry
from countersign.state import VerifierState
from countersign.verify import Mode, verify_path_bytes
from countersign_cli.localmesh import LocalMesh

OUTPUT = b"benchmark output of the leaf agent\n"
CPUS = sorted(os.sched_getaffinity(0))
SERVICE_CPU = CPUS[0]
CLIENT_CPUS = set(CPUS[1:]) or {CPUS[0]}


def percentiles(samples_us: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_us)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "mean": statistics.fmean(ordered), "n": len(ordered)}


def samples_us(
    fn: Callable[[], object], count: int, warmup: int = 20, before: Callable[[], object] | None = None
) -> list[float]:
    """µs of each of ``count`` calls of ``fn``, after ``warmup`` untimed ones; ``before`` (untimed, for
    example an idle) runs before every call, warm-up included."""
    samples = []
    for index in range(warmup + count):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        if index >= warmup:
            samples.append((time.perf_counter() - started) * 1e6)
    return samples


def timed(
    fn: Callable[[], object], count: int, warmup: int = 20, before: Callable[[], object] | None = None
) -> dict[str, float]:
    return percentiles(samples_us(fn, count, warmup, before))


def pinned_launcher(name: str, argv: list[str]) -> list[str]:
    """Pin every daemon to the service CPU, so client load runs elsewhere."""
    return ["taskset", "-c", str(SERVICE_CPU), *argv] if shutil.which("taskset") else argv


def make_paths(keys: dict[str, Ed25519Signer], count: int, depth: int, system: str) -> list[bytes]:
    """``count`` distinct valid SIGNED-DAG paths of ``depth`` records, every edge cross-deployer."""
    deployers = list(keys)
    now = time.time_ns() // 1_000_000
    paths = []
    for n in range(count):
        envelopes: list[Envelope] = []
        for index in range(depth):
            deployer = deployers[index % len(deployers)]
            leaf = index == depth - 1
            fields = RecordFields(
                deployer=deployer,
                agent=AgentRef(f"agent-{n}-{index}", system),
                created_ms=now,
                expires_ms=now + 3_600_000 - index,
                max_children=65_535,
                output=OutputReceipt(sha256_digest(OUTPUT), BindingScope.PER_TURN, f"s{n}", 0, None) if leaf else None,
            )
            parent = keys[envelopes[-1].record.deployer] if envelopes else None
            envelopes.append(
                issue(
                    Construction.SIGNED_DAG,
                    fields,
                    keys[deployer],
                    envelopes,
                    parent_key_id=None if parent is None else parent.key_id,
                    parent_cosigner=None if parent is None else local_parent_cosigner(parent),
                )
            )
        paths.append(Path(tuple(envelopes)).to_bytes())
    return paths


def throughput(call: Callable[[int], object], clients: int, seconds: float) -> float:
    """Calls per second with ``clients`` threads calling ``call(i)`` with increasing i for ``seconds``."""
    counter = iter(range(10**9))
    lock = threading.Lock()
    done = [0]
    stop = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop:
            with lock:
                i = next(counter)
            call(i)
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0] / (time.monotonic() - started)


def in_process_throughput(
    paths: list[bytes], registry: Registry, state: VerifierState, mode: Mode, seconds: float
) -> float:
    """Single-thread verify-from-bytes rate on the service CPU (the same core the verifier gets)."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {SERVICE_CPU})
    try:
        now = time.time_ns() // 1_000_000
        count = 0
        stop = time.monotonic() + seconds
        started = time.monotonic()
        while time.monotonic() < stop:
            data = paths[count % len(paths)]
            result = verify_path_bytes(data, OUTPUT, registry=registry, state=state, mode=mode, now_ms=now)
            assert result or mode is Mode.ACCEPT, result
            count += 1
        return count / (time.monotonic() - started)
    finally:
        os.sched_setaffinity(0, previous)


def rss_mb(pid: int) -> float:
    for line in FilePath(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def pinned_mesh(prefix: str) -> Iterator[LocalMesh]:
    """A local mesh with mTLS, every daemon on the service CPU and this process on the others while
    it is open; stopped and removed afterwards."""
    work = FilePath(tempfile.mkdtemp(prefix=prefix))
    mesh = LocalMesh(work, tls=True, launcher=pinned_launcher, heartbeat_ms=1_000)
    try:
        mesh.setup().start_all()
        mesh.enrol_all()
        os.sched_setaffinity(0, CLIENT_CPUS)
        yield mesh
    finally:
        mesh.stop_all()
        os.sched_setaffinity(0, set(CPUS))
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"service_cpu": SERVICE_CPU, "client_cpus": sorted(CLIENT_CPUS)}
    with pinned_mesh("countersign-bench-") as mesh:
        results.update(_verification(mesh, quick))
    return results


def _verification(mesh: LocalMesh, quick: bool) -> dict[str, Any]:
    from verifier.stores.sqlite import SqliteState

    seconds = 3.0 if quick else 10.0
    keys = dict(mesh.deployer_keys)
    fresh = make_paths(keys, 800 if quick else 6_000, 5, "bench-verify")
    audit_path = fresh.pop()
    client = mesh.verifier_client()
    raw_channel = client._channel  # the same mTLS channel the VerifyPath calls use
    health = health_pb2_grpc.HealthStub(raw_channel)
    raw = timed(lambda: health.Check(health_pb2.HealthCheckRequest()), 500)
    audit_rtt = timed(lambda: client.verify(audit_path, OUTPUT, audit=True), 500)
    accept_iter = iter(fresh)
    accept_rtt = timed(lambda: client.verify(next(accept_iter), OUTPUT), 300, warmup=10)
    remaining = fresh[310:]

    registry = Registry.from_json(_registry(mesh))
    state_dir = FilePath(tempfile.mkdtemp(prefix="countersign-bench-state-"))
    local_state = SqliteState(state_dir / "inproc.db")
    inproc_audit = in_process_throughput([audit_path], registry, local_state, Mode.AUDIT, seconds)
    inproc_accept = in_process_throughput(
        remaining, registry, local_state, Mode.ACCEPT, min(seconds, len(remaining) / 700)
    )
    local_state.close()
    shutil.rmtree(state_dir, ignore_errors=True)

    clients = [mesh.verifier_client() for _ in range(4)]
    service_audit = throughput(lambda i: clients[i % 4].verify(audit_path, OUTPUT, audit=True), 4, seconds)
    accept_paths = make_paths(keys, 600 if quick else 4_000, 5, "bench-accept")
    service_accept = throughput(
        lambda i: clients[i % 4].verify(accept_paths[i % len(accept_paths)], OUTPUT),
        4,
        min(seconds, len(accept_paths) / 700),
    )
    for c in [*clients, client]:
        c.close()
    return {
        "verifier_raw_grpc_rtt_us": raw,
        "verifypath_audit_rtt_us": audit_rtt,
        "verifypath_accept_rtt_us": accept_rtt,
        "inprocess_audit_per_s": inproc_audit,
        "inprocess_accept_per_s": inproc_accept,
        "service_audit_per_s": service_audit,
        "service_accept_per_s": service_accept,
    }


def _registry(mesh: LocalMesh) -> dict[str, Any]:
    """The registry the verifier folded (from the coordinator's log), in the registry file format."""
    from countersign.admission import AdmissionLog, SignedStatement
    from countersign.client.operator import coordinator_log
    from countersign.keys import PublicKey

    log = AdmissionLog(PublicKey(mesh.operator.public_key))
    log.extend(
        [
            SignedStatement.from_bytes(s)
            for s in coordinator_log(mesh.daemons["coordinator"].address, mesh.tls_for("client"))
        ]
    )
    return log.registry.to_json()


def _memory(mesh: LocalMesh, quick: bool) -> dict[str, Any]:
    """Resident memory of each daemon after warm-up and after ``total`` requests to it."""
    from countersign.client.operator import coordinator_log

    total = 5_000 if quick else 100_000
    warm = total // 10
    keys = dict(mesh.deployer_keys)
    path = make_paths(keys, 1, 5, "bench-memory")[0]
    verifier = [mesh.verifier_client() for _ in range(3)]
    runtime = mesh.runtime("deployer-a")
    parents = [runtime.root(f"emitter-{i}", "bench-memory", max_children=65_535) for i in range(total // 60_000 + 1)]
    coordinator = mesh.daemons["coordinator"].address
    tls = mesh.tls_for("client")
    digest = bytes.fromhex(sha256_digest(OUTPUT)[7:])

    def hammer(kind: str, call: Callable[[int], object], pid: int) -> dict[str, float]:
        for i in range(warm):
            call(i)
        after_warmup = rss_mb(pid)
        done = [warm]
        lock = threading.Lock()

        def worker(offset: int) -> None:
            while True:
                with lock:
                    if done[0] >= total:
                        return
                    i = done[0]
                    done[0] += 1
                call(i + offset)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = rss_mb(pid)
        return {
            "requests": total,
            "rss_after_warmup_mb": after_warmup,
            "rss_final_mb": final,
            "growth_mb": final - after_warmup,
        }

    pids = {name: d.process.pid for name, d in mesh.daemons.items() if d.process is not None}
    return {
        "memory": {
            "verifier-0": hammer(
                "verify", lambda i: verifier[i % 3].verify(path, OUTPUT, audit=True), pids["verifier-0"]
            ),
            "deployer-a": hammer(
                "receipt",
                lambda i: runtime.receipt(parents[i // 60_000], digest, session=f"s{i % 97}"),
                pids["deployer-a"],
            ),
            "coordinator": hammer("getlog", lambda i: coordinator_log(coordinator, tls), pids["coordinator"]),
        }
    }


def report(results: dict[str, Any]) -> str:
    def row(label: str, stats: dict[str, float]) -> str:
        return f"| {label} | {stats['p50']:.0f} | {stats['p99']:.0f} | {stats['mean']:.0f} | {int(stats['n'])} |"

    lines = [
        f"## Mesh over gRPC with mTLS (daemons on CPU {results['service_cpu']}, clients on {results['client_cpus']})",
        "",
        "| call | p50 µs | p99 µs | mean µs | n |",
        "|---|---:|---:|---:|---:|",
        row("raw gRPC round trip (health check, verifier channel)", results["verifier_raw_grpc_rtt_us"]),
        row("VerifyPath depth 5, audit", results["verifypath_audit_rtt_us"]),
        row("VerifyPath depth 5, accept (SQLite, fsync)", results["verifypath_accept_rtt_us"]),
        "",
        "| depth-5 SIGNED-DAG verification | per second | service / in-process |",
        "|---|---:|---:|",
        f"| in-process, audit, one core | {results['inprocess_audit_per_s']:.0f} | |",
        f"| service, audit, 4 clients | {results['service_audit_per_s']:.0f} | "
        f"{results['service_audit_per_s'] / results['inprocess_audit_per_s']:.2f} (target ≥ 0.70) |",
        f"| in-process, accept (SQLite), one core | {results['inprocess_accept_per_s']:.0f} | |",
        f"| service, accept (SQLite), 4 clients | {results['service_accept_per_s']:.0f} | "
        f"{results['service_accept_per_s'] / results['inprocess_accept_per_s']:.2f} |",
    ]
    return "\n".join(lines)


def memory_report(results: dict[str, Any]) -> str:
    """The memory soak's table (``make soak``: ``python -m bench --only soak``)."""
    lines = [
        "## Daemons' memory over a soak (`make soak`)",
        "",
        "| daemon | requests | RSS after warm-up MB | RSS final MB | growth MB |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, memory in results["memory"].items():
        lines.append(
            f"| {name} | {memory['requests']} | {memory['rss_after_warmup_mb']:.1f} | {memory['rss_final_mb']:.1f} | "
            f"{memory['growth_mb']:+.1f} |"
        )
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)
