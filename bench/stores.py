"""Store benchmark: consume latency per backend, and verifier service throughput with 1, 2 and 4 clients.

Backends: SQLite (embedded default), PostgreSQL (the machine's server, a fresh schema), and DynamoDB
through moto in server mode — an emulator, so its figures say nothing about AWS latency. In-process
verification with the same store is measured in the same run as the reference.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path as FilePath
from typing import Any

from bench.mesh import OUTPUT, in_process_throughput, make_paths, percentiles, pinned_launcher, throughput
from countersign.registry import Registry
from countersign.state import ChildEdge, LeafNonce
from countersign.verify import Mode
from countersign_cli.localmesh import LocalMesh
from verifier.stores import open_store

POSTGRES = os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextmanager
def backends(work: FilePath) -> Iterator[dict[str, str]]:
    """Store URLs per backend; cleans up the PostgreSQL schemas and the DynamoDB emulator."""
    import psycopg

    schema = f"bench_{secrets.token_hex(4)}"
    moto = _start_moto()
    try:
        urls = {
            "sqlite": f"sqlite:///{work / 'bench.db'}",
            "postgresql": f"{POSTGRES}?schema={schema}",
        }
        if moto is not None:
            from verifier.stores.dynamodb import ensure_table

            port = moto[1]
            url = f"dynamodb://bench-{secrets.token_hex(4)}?region=us-east-1&endpoint_url=http://127.0.0.1:{port}"
            ensure_table(url)
            urls["dynamodb (emulator)"] = url
        yield urls
    finally:
        if moto is not None:
            moto[0].terminate()
            moto[0].wait(10)
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _start_moto() -> tuple[subprocess.Popen[bytes], int] | None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = FilePath(__file__).resolve().parents[1] / "tests" / "stores" / "moto_serial_server.py"
    command = [sys.executable, str(server), str(port)] if server.exists() else [
        os.path.join(os.path.dirname(sys.executable), "moto_server"), "-p", str(port)
    ]  # fmt: skip
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process, port
        except OSError:
            time.sleep(0.1)
    process.terminate()
    return None


def consume_latency(url: str, count: int) -> dict[str, float]:
    """One accept-mode admit of a depth-5 path (4 edges + the leaf nonce) per call."""
    store = open_store(url)
    parent = f"sha256:{secrets.token_hex(32)}"
    now = time.time_ns() // 1_000_000
    samples = []
    try:
        for i in range(count):
            edges = [
                ChildEdge(parent if k == 0 else f"sha256:{i:032x}{k:032x}", f"d:{i:x}{k}", 65_535, now + 60_000, k + 1)
                for k in range(4)
            ]
            leaf = LeafNonce(f"d:{secrets.token_hex(16)}", now + 60_000, 4)
            started = time.perf_counter()
            assert store.admit(edges, leaf, consume=True, now_ms=now) is None
            samples.append((time.perf_counter() - started) * 1e6)
    finally:
        store.close()
    return percentiles(samples[10:])


def run(quick: bool = False) -> dict[str, Any]:
    work = FilePath(tempfile.mkdtemp(prefix="countersign-bench-stores-"))
    seconds = 3.0 if quick else 8.0
    results: dict[str, Any] = {"backends": {}}
    try:
        with backends(work) as urls:
            for name, url in urls.items():
                results["backends"][name] = _backend(work / name.split()[0], url, seconds, quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def _backend(work: FilePath, url: str, seconds: float, quick: bool) -> dict[str, Any]:
    emulator = "dynamodb" in url
    row: dict[str, Any] = {"consume_us": consume_latency(url, 60 if emulator else (200 if quick else 1_000))}
    mesh = LocalMesh(work, verifier_store_url=url, launcher=pinned_launcher)
    try:
        mesh.setup().start_all()
        mesh.enrol_all()
        os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {0} or {0})
        rate = 4 if emulator else 700
        paths = make_paths(dict(mesh.deployer_keys), int(seconds * rate * 4.5) + 50, 5, f"bench-{secrets.token_hex(3)}")
        from bench.mesh import _registry

        registry = Registry.from_json(_registry(mesh))
        state = open_store(url)
        half = len(paths) // 5
        row["inprocess_accept_per_s"] = in_process_throughput(paths[:half], registry, state, Mode.ACCEPT, seconds / 2)
        state.close()
        remaining = iter(paths[half:])
        clients = [mesh.verifier_client() for _ in range(4)]

        def call(i: int) -> object:
            return clients[i % 4].verify(next(remaining), OUTPUT)

        for count in (1, 2, 4):
            row[f"service_accept_{count}_clients_per_s"] = throughput(call, count, seconds / 3)
        for client in clients:
            client.close()
    finally:
        mesh.stop_all()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return row


def report(results: dict[str, Any]) -> str:
    lines = [
        "## Verifier stores (accept mode, depth-5 SIGNED-DAG paths, verifier pinned to one core)",
        "",
        "| backend | consume p50 µs | consume p99 µs | in-process /s | service, 1 client /s | 2 clients /s "
        "| 4 clients /s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    backends_ = results["backends"]
    for name, row in backends_.items():
        lines.append(
            f"| {name} | {row['consume_us']['p50']:.0f} | {row['consume_us']['p99']:.0f} | "
            f"{row['inprocess_accept_per_s']:.0f} | {row['service_accept_1_clients_per_s']:.0f} | "
            f"{row['service_accept_2_clients_per_s']:.0f} | {row['service_accept_4_clients_per_s']:.0f} |"
        )
    if "sqlite" in backends_ and "postgresql" in backends_:

        def ratio(n: int) -> float:
            key = f"service_accept_{n}_clients_per_s"
            return float(backends_["postgresql"][key] / backends_["sqlite"][key])

        lines += [
            "",
            "PostgreSQL / SQLite service throughput: "
            + ", ".join(f"{n} client{'s' if n > 1 else ''} {ratio(n):.2f}" for n in (1, 2, 4))
            + " (target ≥ 0.60)",
        ]
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    import json

    return json.dumps(results, indent=2)
