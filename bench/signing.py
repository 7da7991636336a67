"""Signing throughput of one signer replica with concurrent streams (issue 28; ``python -m bench --only signing``).

One signer daemon on the service CPU (mTLS, SQLite state), the benchmark's runtimes on the other CPUs.
``STREAMS`` concurrent ``StreamReceipts`` calls, each sending one chunk's bytes after another as fast as
its receipts come back (lock-step: the way a model emits tokens), each chunk one receipt: receipts per
second over a timed window. Two signers run side by side in the same rounds, with the same load:

* **group commit** (the default ``commit_batch``): concurrent receipts share one durable commit;
* **one commit per receipt** (``commit_batch = 1``): the floor this design had, each receipt its own
  durable commit on the one SQLite file every stream waits for;
* **group commit on PostgreSQL** (this machine's server, when reachable): the store replicas share
  across hosts;
* **no durable state** (``memory:``): the ceiling of one replica on one core, signing, records and gRPC
  with no commit at all.

Rounds alternate between the two, so a busy neighbour costs both alike; each figure is the median of
its rounds. A single stream's figure is printed too. The target (issue 28): group commit with 16 streams
at least 3x the design before as the issue measured it (one commit per receipt, one stream), in the same
rounds; the ratio over one commit per receipt with the same 16 streams is printed beside it.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path as FilePath
from typing import Any

from bench.mesh import CLIENT_CPUS, SERVICE_CPU, pinned_launcher
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.tls import open_channel, signer_dns
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh

STREAMS = 16
CHUNK_BYTES = 256
TARGET = 3.0
FLOOR = "no durable state (the ceiling)"
DEPLOYER = "deployer-a"


POSTGRES_URL = os.environ.get("COUNTERSIGN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _postgres_reachable() -> bool:
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception:  # no server, or no driver: the PostgreSQL row is left out and the report says so
        return False
    return True


def _drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_URL, connect_timeout=3, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class _LockStep:
    """One StreamReceipts call whose chunks are sent one at a time, each after the previous receipt."""

    def __init__(self, stub: signer_pb2_grpc.SignerStub, agent: Path, session: str) -> None:
        self._queue: queue.SimpleQueue[signer_pb2.OutputChunk | None] = queue.SimpleQueue()
        self._queue.put(signer_pb2.OutputChunk(parent_path=agent.to_bytes(), session=session, unit="bytes",
                                               n=CHUNK_BYTES))  # fmt: skip
        self._answers: Iterator[signer_pb2.ChunkReceipt] = stub.StreamReceipts(self._messages(), timeout=600)
        self._piece = signer_pb2.OutputChunk(data=b"t" * CHUNK_BYTES)

    def _messages(self) -> Iterator[signer_pb2.OutputChunk]:
        while (message := self._queue.get()) is not None:
            yield message

    def run(self, until: float) -> int:
        """Send chunks until ``until`` (monotonic); the number of receipts received."""
        received = 0
        while time.monotonic() < until:
            self._queue.put(self._piece)
            next(self._answers)
            received += 1
        return received

    def end(self) -> None:
        self._queue.put(None)
        for _ in self._answers:
            pass


def _throughput(mesh: LocalMesh, agent: Path, streams: int, seconds: float, round_no: int) -> float:
    """Receipts per second from ``streams`` concurrent lock-step streams over ``seconds``."""
    tls = mesh.tls_for(f"{DEPLOYER}-runtime")
    channels = [open_channel(mesh.daemons[DEPLOYER].address, tls, signer_dns(DEPLOYER)) for _ in range(streams)]
    try:
        lanes = [
            _LockStep(signer_pb2_grpc.SignerStub(channel), agent, f"r{round_no}-s{i}")
            for i, channel in enumerate(channels)
        ]
        counts = [0] * streams
        barrier = threading.Barrier(streams + 1)

        def drive(index: int) -> None:
            barrier.wait()
            counts[index] = lanes[index].run(started + seconds)

        threads = [threading.Thread(target=drive, args=(i,)) for i in range(streams)]
        for thread in threads:
            thread.start()
        started = time.monotonic()
        barrier.wait()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        for lane in lanes:
            lane.end()
        return sum(counts) / elapsed
    finally:
        for channel in channels:
            channel.close()


def run(quick: bool = False) -> dict[str, Any]:
    seconds, rounds = (2.0, 2) if quick else (5.0, 5)
    configs: dict[str, dict[str, Any]] = {
        "group commit": {},
        "one commit per receipt": {"commit_batch": 1},
        # The ceiling: the same replica keeping its state in memory (no commit at all). Whatever a
        # commit strategy does, it cannot sign faster than this on one core.
        FLOOR: {"state_url": "memory:"},
    }
    schema = f"cs_bench_signing_{os.getpid()}"
    if _postgres_reachable():  # the store replicas share across hosts, on this machine's server
        configs["group commit, PostgreSQL state"] = {"state_url": f"{POSTGRES_URL}?schema={schema}"}
    figures: dict[str, dict[int, list[float]]] = {name: {STREAMS: [], 1: []} for name in configs}
    with ExitStack() as stack:
        meshes: dict[str, tuple[LocalMesh, Path]] = {}
        for index, (name, options) in enumerate(configs.items()):
            work = FilePath(
                stack.enter_context(tempfile.TemporaryDirectory(prefix=f"countersign-bench-signing-{index}-"))
            )
            mesh = LocalMesh(work, deployers=(DEPLOYER,), verifiers=0, launcher=pinned_launcher, signer_options=options)
            stack.callback(mesh.stop_all)
            mesh.setup().start_all()
            mesh.enrol_all()
            runtime = mesh.runtime(DEPLOYER)
            stack.callback(runtime.close)
            meshes[name] = (mesh, runtime.root("streamer", "bench-signing"))
        stack.callback(os.sched_setaffinity, 0, os.sched_getaffinity(0))
        os.sched_setaffinity(0, CLIENT_CPUS)
        for mesh, agent in meshes.values():  # warm-up: connections, caches
            _throughput(mesh, agent, STREAMS, 0.5, -1)
        for round_no in range(rounds):
            for name, (mesh, agent) in meshes.items():
                figures[name][STREAMS].append(_throughput(mesh, agent, STREAMS, seconds, round_no))
                figures[name][1].append(_throughput(mesh, agent, 1, seconds / 2, round_no))
    if "group commit, PostgreSQL state" in configs:
        _drop_schema(schema)
    medians = {name: {n: statistics.median(v) for n, v in by.items()} for name, by in figures.items()}
    group, before = figures["group commit"][STREAMS], figures["one commit per receipt"]
    # The target's base: the design before, measured in the same rounds as the issue measured it
    # (one commit per receipt, one stream); beside it, the same commit with the same 16 streams.
    ratios = [g / o for g, o in zip(group, before[1], strict=True)]
    same_streams = [g / o for g, o in zip(group, before[STREAMS], strict=True)]
    return {
        "streams": STREAMS,
        "chunk_bytes": CHUNK_BYTES,
        "seconds": seconds,
        "rounds": rounds,
        "receipts_per_s": medians,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_same_streams": statistics.median(same_streams),
        "service_cpu": SERVICE_CPU,
    }


def report(results: dict[str, Any]) -> str:
    streams = results["streams"]
    figures = results["receipts_per_s"]
    mark = "met" if results["ratio"] >= TARGET else "missed"
    lines = [
        f"Signing throughput of one signer replica (daemon on CPU {results['service_cpu']}, mTLS, SQLite state),"
        f" {results['chunk_bytes']}-byte chunks in lock-step, median of {results['rounds']} interleaved rounds of"
        f" {results['seconds']:g} s",
        "",
        f"| commit | receipts/s, {streams} streams | receipts/s, 1 stream |",
        "|---|---:|---:|",
    ]
    for name, by in figures.items():
        lines.append(f"| {name} | {by[streams]:,.0f} | {by[1]:,.0f} |")
    if "group commit, PostgreSQL state" not in figures:
        lines.append("| group commit, PostgreSQL state | (no PostgreSQL server reachable) | |")
    ceiling = figures[FLOOR][streams] / figures["one commit per receipt"][1]
    lines += [
        "",
        f"Group commit with {streams} streams over the design before (one commit per receipt, one stream, these"
        f" rounds): {results['ratio']:.2f}x (lowest round {results['ratio_min']:.2f}x); target ≥ {TARGET:g}x: {mark}."
        f" Over one commit per receipt with the same {streams} streams: {results['ratio_same_streams']:.2f}x."
        f" The ceiling (no commit at all) is {ceiling:.2f}x the design before"
        + (": the target is above it." if ceiling < TARGET else "."),
    ]
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2, default=str)
