"""The memory soak: each daemon's resident memory over 100,000 requests (``make soak``; kept out of
``make bench`` so that one finishes within ten minutes), against its idle size (issue 29: within 1.3x
idle, every daemon).

Idle is the daemon's resident set once the mesh is up and enrolled and has sat for a moment, before
any of the soak's requests. The verifier is soaked in accept mode with a new receipt each time (a
consumer verifying a stream of outputs: every call consumes a nonce and logs a verdict on a new path),
through three clients' verification lanes; the signer issues receipts; the coordinator serves its log.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.mesh import OUTPUT, SERVICE_CPU, pinned_mesh, rss_mb
from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.keys import Ed25519Signer
from countersign.records import AgentRef, BindingScope, Construction, Envelope, OutputReceipt, Path
from countersign_cli.localmesh import LocalMesh

TARGET_RATIO = 1.3
CHILDREN_PER_PREFIX = 60_000  # under the parent's max_children of 65,535
CLIENTS = 3


def _record(
    keys: dict[str, Ed25519Signer], above: list[Envelope], deployer: str, name: str, leaf: int | None
) -> Envelope:
    now = time.time_ns() // 1_000_000
    fields = RecordFields(
        deployer=deployer,
        agent=AgentRef(name, "soak"),
        created_ms=now,
        expires_ms=above[-1].record.expires_ms - 1 if above else now + 3_600_000,
        max_children=65_535,
        output=None
        if leaf is None
        else OutputReceipt(sha256_digest(OUTPUT), BindingScope.PER_TURN, f"s{leaf}", 0, None),
    )
    parent = keys[above[-1].record.deployer] if above else None
    cross = parent is not None and above[-1].record.deployer != deployer
    return issue(
        Construction.SIGNED_DAG, fields, keys[deployer], above,
        parent_key_id=None if parent is None else parent.key_id,
        parent_cosigner=local_parent_cosigner(parent) if parent is not None and cross else None,
    )  # fmt: skip


def new_receipts(keys: dict[str, Ed25519Signer], count: int) -> Iterator[bytes]:
    """``count`` depth-5 SIGNED-DAG paths, each a new receipt under a depth-4 agent path whose edges
    are all cross-deployer (a new agent path every CHILDREN_PER_PREFIX receipts); made as they are
    needed, one signature each."""
    deployers = list(keys)
    prefix: list[Envelope] = []
    for n in range(count):
        if n % CHILDREN_PER_PREFIX == 0:
            prefix = []
            for index in range(4):
                prefix.append(_record(keys, prefix, deployers[index % len(deployers)], f"agent-{n}-{index}", None))
        leaf = _record(keys, prefix, prefix[-1].record.deployer, f"emitter-{n}", n)
        yield Path((*prefix, leaf)).to_bytes()


def soak(name: str, pid: int, idle_mb: float, total: int, call: Callable[[int], object]) -> dict[str, Any]:
    """``total`` calls of ``call`` from CLIENTS threads; the daemon's RSS at idle, after a tenth, at the end."""
    warm = total // 10
    done = [0]
    lock = threading.Lock()
    after_warmup = [0.0]
    failures: list[BaseException] = []

    def worker() -> None:
        while not failures:
            with lock:
                if done[0] >= total:
                    return
                i = done[0]
                done[0] += 1
            try:
                call(i)
            except Exception as exc:
                failures.append(exc)
            if i == warm:
                after_warmup[0] = rss_mb(pid)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise RuntimeError(f"{name}: {len(failures)} calls failed, the first: {failures[0]!r}")
    seconds = time.monotonic() - started
    final = rss_mb(pid)
    return {
        "requests": total,
        "per_second": total / seconds,
        "rss_idle_mb": idle_mb,
        "rss_after_warmup_mb": after_warmup[0],
        "rss_final_mb": final,
        "ratio_to_idle": final / idle_mb,
    }


def _memory(mesh: LocalMesh, quick: bool) -> dict[str, Any]:
    from countersign.client.operator import coordinator_log

    total = 5_000 if quick else 100_000
    time.sleep(3)  # let start-up settle (the first heartbeats, the checkpoint loop's first rounds)
    pids = {name: d.process.pid for name, d in mesh.daemons.items() if d.process is not None}
    idle = {name: rss_mb(pid) for name, pid in pids.items()}
    keys = dict(mesh.deployer_keys)
    receipts = new_receipts(keys, total)
    receipts_lock = threading.Lock()
    verifiers = [mesh.verifier_client() for _ in range(CLIENTS)]

    def verify(i: int) -> object:
        with receipts_lock:
            path = next(receipts)
        verdict = verifiers[i % CLIENTS].verify(path, OUTPUT)
        assert verdict, verdict.result
        return verdict

    runtime = mesh.runtime("deployer-a")
    parents = [runtime.root(f"emitter-{i}", "soak", max_children=65_535) for i in range(total // 60_000 + 1)]
    digest = bytes.fromhex(sha256_digest(OUTPUT)[7:])
    coordinator, tls = mesh.daemons["coordinator"].address, mesh.tls_for("client")
    try:
        return {
            "verifier-0": soak("verifier-0", pids["verifier-0"], idle["verifier-0"], total, verify),
            "deployer-a": soak(
                "deployer-a",
                pids["deployer-a"],
                idle["deployer-a"],
                total,
                lambda i: runtime.receipt(parents[i // 60_000], digest, session=f"s{i % 97}"),
            ),
            "coordinator": soak(
                "coordinator",
                pids["coordinator"],
                idle["coordinator"],
                total,
                lambda i: coordinator_log(coordinator, tls),
            ),
        }
    finally:
        for client in verifiers:
            client.close()
        runtime.close()


def run(quick: bool = False) -> dict[str, Any]:
    with pinned_mesh("countersign-soak-") as mesh:
        return {"service_cpu": SERVICE_CPU, "target_ratio": TARGET_RATIO, "memory": _memory(mesh, quick)}


def report(results: dict[str, Any]) -> str:
    lines = [
        "## Daemons' memory over a soak (`make soak`)",
        "",
        f"Target: RSS at the end within {results['target_ratio']}x idle, every daemon.",
        "",
        "| daemon | requests | per second | RSS idle MB | after a tenth MB | final MB | final / idle |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, memory in results["memory"].items():
        lines.append(
            f"| {name} | {memory['requests']} | {memory['per_second']:.0f} | {memory['rss_idle_mb']:.1f} | "
            f"{memory['rss_after_warmup_mb']:.1f} | {memory['rss_final_mb']:.1f} | {memory['ratio_to_idle']:.2f}x |"
        )
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)
