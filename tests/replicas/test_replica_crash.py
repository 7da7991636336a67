"""Crash safety: ``kill -9`` of one verifier replica under load, clients failing over to the others.

What a client may see, precisely: a request in flight on the killed process may or may not have
committed its nonce before the process died (the store decides, not the dead process). Its retry on
another replica therefore answers ACCEPT (it had not committed) or NONCE_REPLAYED (it had). Both are
correct; two ACCEPTs for one path never are. So across the whole run:

* no path is accepted twice (every attempt on every replica, replays included, counts);
* an ACCEPT is never lost: every path a client saw accepted is NONCE_REPLAYED on every replica
  afterwards, the restarted one included;
* a presented path without any ACCEPT is allowed only if one of its attempts was in flight on the
  killed replica (the ambiguous case above); presented again it is consumed (ACCEPT at most once in
  all, then NONCE_REPLAYED everywhere);
* the killed replica restarts on its port and serves again from the same store.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest

from tests.replicas.conftest import Outcome, Presented, ReplicaSet, poll

pytestmark = [pytest.mark.daemons, pytest.mark.postgres, pytest.mark.slow]

REPLICAS = 3
VICTIM = 1
LOAD_THREADS = 6
FRESH_PATHS = 1_500
ACCEPTS_BEFORE_KILL = 60
ACCEPTS_AFTER_KILL = 150
MIN_SECONDS_AFTER_KILL = 1.5


def test_kill_9_of_a_replica_under_load_loses_no_accept_and_accepts_nothing_twice(
    replicas: Callable[..., ReplicaSet],
) -> None:
    replica_set = replicas(REPLICAS)
    failover = replica_set.failover()
    fresh = [replica_set.paths.fresh() for _ in range(FRESH_PATHS)]
    by_name = {item.name: item for item in fresh}
    queue = iter(fresh[:-2])  # the last two are kept to probe the restarted replica
    probes = fresh[-2:]

    lock = threading.Lock()
    attempts: dict[str, list[Outcome]] = defaultdict(list)
    accepted: list[str] = []
    accepts_after_kill = 0
    problems: list[str] = []
    kill_started = threading.Event()
    killed_at = [0.0]
    stop = threading.Event()
    exhausted = threading.Event()

    def record(item: Presented, outcomes: list[Outcome]) -> None:
        nonlocal accepts_after_kill
        with lock:
            attempts[item.name].extend(outcomes)
            if any(o.verdict == "ACCEPT" for o in outcomes):
                accepted.append(item.name)
                if kill_started.is_set():
                    accepts_after_kill += 1
        if outcomes[-1].error:
            problems.append(f"{item.name}: no definite answer after {len(outcomes)} attempts: {outcomes}")

    def load(tid: int) -> None:
        rng = random.Random(tid)
        k = 0
        while not stop.is_set():
            k += 1
            with lock:
                item = next(queue, None)
            if item is None:
                exhausted.set()
                return
            record(item, failover.verify(item, first=tid + k))
            if k % 3 == 0:  # replays of accepted paths, to any replica
                with lock:
                    old = by_name[rng.choice(accepted)] if accepted else None
                if old is not None:
                    record(old, failover.verify(old, first=rng.randrange(REPLICAS)))

    threads = [threading.Thread(target=load, args=(t,), daemon=True) for t in range(LOAD_THREADS)]
    for thread in threads:
        thread.start()
    try:
        poll(lambda: len(accepted) >= ACCEPTS_BEFORE_KILL or exhausted.is_set(), timeout_s=60, what="warm-up")
        killed_at[0] = time.monotonic()
        kill_started.set()
        replica_set.mesh.kill(replica_set.name(VICTIM))

        def enough_after_kill() -> bool:
            elapsed = time.monotonic() - killed_at[0]
            return (accepts_after_kill >= ACCEPTS_AFTER_KILL and elapsed > MIN_SECONDS_AFTER_KILL) or exhausted.is_set()

        poll(enough_after_kill, timeout_s=90, what="load after the kill")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not exhausted.is_set(), f"ran out of fresh paths: raise FRESH_PATHS above {FRESH_PATHS}"
    assert not any(t.is_alive() for t in threads), "a load thread hung"
    victim = replica_set.mesh.daemons[replica_set.name(VICTIM)].process
    assert victim is not None and victim.returncode == -9, "the victim was not killed by SIGKILL"

    everything = [o for seen in attempts.values() for o in seen]
    errors = [o for o in everything if o.error]
    assert not problems, problems[:5]
    # Errors come only from the killed replica, only once it was being killed, and are retryable.
    assert errors, "no request reached the killed replica: the failover was not exercised"
    assert all(o.replica == VICTIM and o.ended >= killed_at[0] for o in errors), errors[:5]
    assert all(o.retry_elsewhere for o in errors), Counter(o.label for o in errors)
    # Only the two verdicts a valid fresh or replayed path can get.
    assert {o.verdict for o in everything} <= {"ACCEPT", "NONCE_REPLAYED", "ERROR"}, Counter(
        o.label for o in everything
    )

    # The killed replica comes back on its port, from the same store, and the same client reaches it.
    replica_set.mesh.start(replica_set.name(VICTIM))
    some_accepted = by_name[accepted[0]]
    poll(
        lambda: replica_set.present(VICTIM, some_accepted, audit=True).verdict == "ACCEPT",
        timeout_s=30,
        interval_s=0.2,
        what="the restarted replica to serve",
    )
    assert replica_set.present(VICTIM, some_accepted).label == "NONCE_REPLAYED"
    for n, probe in enumerate(probes):
        assert replica_set.present(VICTIM, probe).label == "ACCEPT"
        assert replica_set.present((VICTIM + 1 + n) % REPLICAS, probe).label == "NONCE_REPLAYED"

    # Paths that got no ACCEPT: allowed only when an attempt was in flight on the killed replica.
    unanswered = [name for name, seen in attempts.items() if not any(o.verdict == "ACCEPT" for o in seen)]
    unexplained = [name for name in unanswered if not any(o.error and o.replica == VICTIM for o in attempts[name])]
    assert not unexplained, {name: attempts[name] for name in unexplained[:5]}
    for name in unanswered:  # presented again after the crash: consumed, at most one ACCEPT in all
        attempts[name].append(replica_set.present(0, by_name[name]))

    # No accept lost: everything presented is consumed, on every replica.
    final = Counter(replica_set.present(r, by_name[name]).label for name in attempts for r in range(REPLICAS))
    assert final == Counter({"NONCE_REPLAYED": len(attempts) * REPLICAS}), final

    # Nothing accepted twice, across the whole run.
    accepts = Counter(name for name, seen in attempts.items() for o in seen if o.verdict == "ACCEPT")
    twice = {name: n for name, n in accepts.items() if n > 1}
    assert not twice, twice
    # Every path with only definite answers was accepted exactly once.
    definite = [name for name, seen in attempts.items() if not any(o.error for o in seen)]
    lost = [name for name in definite if accepts[name] != 1]
    assert not lost, {name: attempts[name] for name in lost[:5]}
