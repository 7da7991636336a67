"""Races between verifier replicas that share one PostgreSQL store, through the real service.

Three ``countersign verifier serve`` processes, one schema. The same path presented ~100 times at once
across all three is accepted exactly once; the children of one parent presented at once are accepted
exactly ``max_children`` times. Nothing is injected: every request is a real mTLS gRPC call.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.replicas.conftest import Outcome, Presented, ReplicaSet

pytestmark = [pytest.mark.daemons, pytest.mark.postgres]

REPLICAS = 3
PATHS = 30
THREADS_PER_REPLICA = 12
ATTEMPTS_PER_THREAD = 3  # 3 replicas x 12 threads x 3 attempts = 108 presentations of each path
FANOUT_K = 3
CHILDREN_PER_PARENT = 4 * FANOUT_K  # at least 3k + 1
PARENTS = 8


def race(pool: ThreadPoolExecutor, jobs: Sequence[Callable[[], Outcome]]) -> list[Outcome]:
    """Run ``jobs`` on ``pool`` released together: every pool thread waits at one gate first."""
    gate = threading.Event()

    def gated(job: Callable[[], Outcome]) -> Outcome:
        gate.wait(timeout=30)
        return job()

    futures = [pool.submit(gated, job) for job in jobs]
    gate.set()
    return [f.result(timeout=120) for f in futures]


def attempt(replica_set: ReplicaSet, replica: int, item: Presented) -> Callable[[], Outcome]:
    return lambda: replica_set.present(replica, item)


def test_same_path_raced_across_three_replicas_is_accepted_exactly_once(
    replicas: Callable[..., ReplicaSet],
) -> None:
    replica_set = replicas(REPLICAS)
    paths = [replica_set.paths.fresh() for _ in range(PATHS)]
    per_path = REPLICAS * THREADS_PER_REPLICA * ATTEMPTS_PER_THREAD
    results: dict[str, Counter[str]] = {}
    accepted_by: Counter[int] = Counter()

    with ThreadPoolExecutor(REPLICAS * THREADS_PER_REPLICA) as pool:
        for item in paths:
            # Interleaved so that every replica has requests in each wave the pool releases.
            jobs = [attempt(replica_set, n % REPLICAS, item) for n in range(per_path)]
            outcomes = race(pool, jobs)
            results[item.name] = Counter(o.label for o in outcomes)
            accepted_by.update(o.replica for o in outcomes if o.verdict == "ACCEPT")

    total = sum(sum(c.values()) for c in results.values())
    assert total == PATHS * per_path >= 3_000
    expected = {item.name: Counter({"ACCEPT": 1, "NONCE_REPLAYED": per_path - 1}) for item in paths}
    wrong = {name: dict(seen) for name, seen in results.items() if seen != expected[name]}
    assert not wrong, f"paths not accepted exactly once (accepts by replica {dict(accepted_by)}): {wrong}"

    # Afterwards every replica answers NONCE_REPLAYED for every path, and still nothing else.
    after = Counter(replica_set.present(r, item).label for item in paths for r in range(REPLICAS))
    assert after == Counter({"NONCE_REPLAYED": PATHS * REPLICAS})


def test_children_raced_across_three_replicas_respect_max_children(replicas: Callable[..., ReplicaSet]) -> None:
    replica_set = replicas(REPLICAS)
    per_parent: dict[int, dict[str, str]] = {}
    children: dict[int, list[Presented]] = {}
    with ThreadPoolExecutor(CHILDREN_PER_PARENT) as pool:
        for parent_no in range(PARENTS):
            parent = replica_set.paths.parent(max_children=FANOUT_K)
            kids = [replica_set.paths.child(parent) for _ in range(CHILDREN_PER_PARENT)]
            children[parent_no] = kids
            jobs = [attempt(replica_set, (n + parent_no) % REPLICAS, item) for n, item in enumerate(kids)]
            outcomes = race(pool, jobs)
            per_parent[parent_no] = {item.name: o.label for item, o in zip(kids, outcomes, strict=True)}

    expected = Counter({"ACCEPT": FANOUT_K, "FANOUT_EXCEEDED": CHILDREN_PER_PARENT - FANOUT_K})
    wrong = {p: seen for p, seen in per_parent.items() if Counter(seen.values()) != expected}
    assert not wrong, f"parents whose child set does not hold exactly max_children={FANOUT_K}: {wrong}"

    # The decision is durable and shared: an accepted child is a known child (its fan-out check
    # passes) whose nonce is consumed; a refused child stays refused, on every replica.
    for parent_no, kids in children.items():
        for item in kids:
            first = per_parent[parent_no][item.name]
            again = {replica_set.present(r, item).label for r in range(REPLICAS)}
            assert again == {"NONCE_REPLAYED" if first == "ACCEPT" else "FANOUT_EXCEEDED"}, (item.name, first, again)
    # Exactly k child entries per parent and one consumed nonce per accepted child, in the tables.
    assert replica_set.store_counts() == (PARENTS * FANOUT_K, PARENTS * FANOUT_K)
