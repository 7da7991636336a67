"""Atomicity of the stores shared between verifiers, under real concurrency: many threads (with
their own connections, and sharing one handle) and several OS processes, released together.

For SQLite and PostgreSQL: the same leaf nonce admitted concurrently is accepted exactly once; distinct
children of one parent admitted concurrently never exceed max_children (and reach it exactly); paths
sharing parents in opposite orders all go through (no deadlock surfaces as an outage).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from countersign.state import ReplayState
from tests.stores.conftest import PostgresSchemas
from tests.stores.store_worker import outcome_of
from verifier.stores import open_store

pytestmark = pytest.mark.daemons  # worker processes

WORKER = Path(__file__).with_name("store_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
RETAIN = 10**13

CONCURRENT_BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=CONCURRENT_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        url = schemas.url(schemas.new())
    open_store(url).close()  # migrate once up front; the races under test are the admits
    return url


def path(parent: str, child: str, max_children: int, nonce: str) -> dict[str, Any]:
    return {"edges": [[parent, child, max_children, RETAIN, 1]], "leaf": [nonce, RETAIN, 1]}


def run_threads(url: str, paths: list[dict[str, Any]], *, share_handle: bool = False) -> list[str]:
    """Admit every path from its own thread, all released at once by a barrier."""
    shared = open_store(url) if share_handle else None
    stores: list[ReplayState] = [shared or open_store(url) for _ in paths]
    barrier = threading.Barrier(len(paths))

    def run(i: int) -> str:
        barrier.wait()
        return outcome_of(stores[i], paths[i])

    try:
        with ThreadPoolExecutor(len(paths)) as pool:
            return list(pool.map(run, range(len(paths))))
    finally:
        for store in {id(s): s for s in stores}.values():
            store.close()


def run_processes(url: str, per_process: list[list[dict[str, Any]]]) -> list[str]:
    """Start one worker process per list of paths; once every worker has opened its store, say go."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        for _ in per_process
    ]
    try:
        for proc, paths in zip(procs, per_process, strict=True):
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(json.dumps({"url": url, "paths": paths}) + "\n")
            proc.stdin.flush()
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", "worker failed to open the store"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outcomes: list[str] = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out
            outcomes.extend(json.loads(out.strip().splitlines()[-1]))
        return outcomes
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_same_nonce_from_many_threads_is_accepted_once(store_url: str) -> None:
    paths = [path("parent", "leaf", 4, "the-nonce") for _ in range(16)]
    own = run_threads(store_url, paths)
    assert Counter(own) == {"accept": 1, "NONCE_REPLAYED@1": 15}, own
    again = [path("parent", "leaf2", 4, "other-nonce") for _ in range(16)]
    shared = run_threads(store_url, again, share_handle=True)
    assert Counter(shared) == {"accept": 1, "NONCE_REPLAYED@1": 15}, shared


def test_one_request_id_sent_nine_times_at_once_is_one_acceptance_and_eight_retries(store_url: str) -> None:
    """The answer to a retry says it is one, with the time of the acceptance it repeats (each thread
    admits at its own time, so the retries' time names the one that consumed the nonce)."""
    for share_handle, nonce in ((False, "keyed-nonce"), (True, "keyed-nonce-2")):
        paths = [
            {**path("parent", nonce, 4, nonce), "leaf": [nonce, RETAIN, 1, "client|order-1"], "now_ms": 1000 + i}
            for i in range(9)
        ]
        outcomes = run_threads(store_url, paths, share_handle=share_handle)
        assert outcomes.count("accept") == 1, outcomes
        winner = 1000 + outcomes.index("accept")
        assert Counter(outcomes) == {"accept": 1, f"retry@{winner}": 8}, outcomes


def test_same_nonce_from_many_processes_is_accepted_once(store_url: str) -> None:
    per_process = [[path("parent", "leaf", 4, "the-nonce") for _ in range(4)] for _ in range(4)]
    outcomes = run_processes(store_url, per_process)
    assert Counter(outcomes) == {"accept": 1, "NONCE_REPLAYED@1": 15}, outcomes


def record_first_child(url: str, parent: str, max_children: int) -> None:
    """One child recorded up front, so the parent's bookkeeping exists before the race (the case a
    check-then-insert without a lock on the existing parent gets wrong)."""
    store = open_store(url)
    try:
        assert outcome_of(store, path(parent, "first", max_children, "first")) == "accept"
    finally:
        store.close()


def test_children_of_one_parent_from_many_threads_stop_at_the_limit(store_url: str) -> None:
    record_first_child(store_url, "parent", 5)
    paths = [path("parent", f"child{i}", 5, f"nonce{i}") for i in range(16)]
    outcomes = run_threads(store_url, paths)
    assert Counter(outcomes) == {"accept": 4, "FANOUT_EXCEEDED@1": 12}, outcomes
    # A parent seen for the first time by all threads at once: the limit holds as well.
    fresh = run_threads(store_url, [path("new-parent", f"kid{i}", 3, f"kid-nonce{i}") for i in range(16)])
    assert Counter(fresh) == {"accept": 3, "FANOUT_EXCEEDED@1": 13}, fresh
    store = open_store(store_url)
    try:
        assert store.entry_count() == (1 + 4) * 2 + 3 * 2
    finally:
        store.close()


def test_children_of_one_parent_from_many_processes_stop_at_the_limit(store_url: str) -> None:
    record_first_child(store_url, "parent", 4)
    per_process = [[path("parent", f"child{p}-{t}", 4, f"nonce{p}-{t}") for t in range(4)] for p in range(4)]
    outcomes = run_processes(store_url, per_process)
    assert Counter(outcomes) == {"accept": 3, "FANOUT_EXCEEDED@1": 13}, outcomes
    # Every process saw the same limit: a fresh child now fails in audit mode too.
    store = open_store(store_url)
    try:
        assert outcome_of(store, {**path("parent", "late", 4, "late"), "consume": False}) == "FANOUT_EXCEEDED@1"
        assert store.entry_count() == 4 + 4
    finally:
        store.close()


def test_paths_sharing_parents_in_opposite_orders_all_go_through(store_url: str) -> None:
    def crossing(i: int) -> dict[str, Any]:
        first, second = ("A", "B") if i % 2 else ("B", "A")
        return {
            "edges": [[first, f"x{i}", 1000, RETAIN, 1], [second, f"y{i}", 1000, RETAIN, 2]],
            "leaf": [f"n{i}", RETAIN, 2],
        }

    outcomes = run_threads(store_url, [crossing(i) for i in range(16)])
    assert outcomes == ["accept"] * 16
