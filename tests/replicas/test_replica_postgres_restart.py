"""Crash safety: the shared PostgreSQL server stops and starts again while three replicas serve load.

During the outage every VerifyPath that needs the store answers the typed, retryable error
STATE_UNAVAILABLE: never an ACCEPT, never a REJECT caused by the outage. Once the server is back, the
same verifier processes (not restarted) reconnect by themselves, accept fresh paths and reject
replays, and nothing consumed before the restart is forgotten.

The outage lasts OUTAGE_S (~16 s) on purpose: a connection pool whose reconnection backoff grows
without bound would stay down for many seconds after the server is back (the delay grows with the
outage). Every replica must serve again within RECOVERY_BOUND_S of ``pg_isready``.

This restarts this machine's PostgreSQL cluster (root, ``pg_ctlcluster``): run it alone
(``-m exclusive``). The server is started again even when the test fails.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest

from tests.replicas.conftest import Outcome, PgCluster, Presented, ReplicaSet, poll

pytestmark = [pytest.mark.daemons, pytest.mark.postgres, pytest.mark.slow, pytest.mark.exclusive]

REPLICAS = 3
THREADS_PER_REPLICA = 2
BEFORE = 30
ACCEPTS_TO_RECOVER = 3
OUTAGE_S = 16.0
RECOVERY_BOUND_S = 5.0
FANOUT_K = 2


def test_postgres_restart_under_load_is_typed_retryable_and_forgets_nothing(
    replicas: Callable[..., ReplicaSet], pg_cluster: PgCluster
) -> None:
    # connect_timeout=2: while the server is down a request fails after at most ~2 s.
    replica_set = replicas(REPLICAS, connect_timeout=2)
    pids = [replica_set.pid(r) for r in range(REPLICAS)]

    before = [replica_set.paths.fresh() for _ in range(BEFORE)]
    for n, item in enumerate(before):
        assert replica_set.present(n % REPLICAS, item).label == "ACCEPT"
    parent = replica_set.paths.parent(max_children=FANOUT_K)
    for n in range(FANOUT_K):
        assert replica_set.present(n % REPLICAS, replica_set.paths.child(parent)).label == "ACCEPT"

    lock = threading.Lock()
    fresh_seen: dict[str, tuple[Presented, Outcome]] = {}
    replays: list[Outcome] = []
    warmed = threading.Semaphore(0)
    marks: dict[str, float] = {}  # monotonic times: stopping, down, starting, up
    unavailable_while_down: dict[int, int] = defaultdict(int)
    recovered = [threading.Event() for _ in range(REPLICAS * THREADS_PER_REPLICA)]
    recovered_at: dict[int, float] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def timeline() -> str:
        """The outage as the test saw it, in seconds from the stop, for failure messages."""
        zero = marks.get("stopping", 0.0)
        with lock:
            errs = sorted(
                (round(o.started - zero, 2), round(o.ended - zero, 2), o.replica)
                for _, o in fresh_seen.values()
                if o.error
            )
        shown = {k: round(v - zero, 2) for k, v in marks.items()}
        back = {t: round(v - zero, 2) for t, v in sorted(recovered_at.items())}
        return f"marks {shown}; recovered (thread: time) {back}; errors (start, end, replica) {errs}"

    def load(tid: int) -> None:
        replica = tid % REPLICAS  # no failover here: each replica's own answers are observed
        accepts_after_up = 0
        k = 0
        try:
            while not stop.is_set():
                k += 1
                item = replica_set.paths.fresh()
                outcome = replica_set.present(replica, item)
                with lock:
                    fresh_seen[item.name] = (item, outcome)
                    # Requests begun once the server was down (not only those it cut off in flight).
                    if (
                        outcome.error
                        and "down" in marks
                        and outcome.started > marks["down"]
                        and ("starting" not in marks or outcome.ended < marks["starting"])
                    ):
                        unavailable_while_down[replica] += 1
                if k % 4 == 0:  # a path consumed before the load is never accepted again
                    again = replica_set.present(replica, before[(tid * 7 + k) % BEFORE])
                    with lock:
                        replays.append(again)
                if k == 5:
                    warmed.release()
                if "up" in marks and outcome.verdict == "ACCEPT" and outcome.started > marks["up"]:
                    accepts_after_up += 1
                    if accepts_after_up >= ACCEPTS_TO_RECOVER:
                        recovered_at[tid] = time.monotonic()
                        recovered[tid].set()
                        return
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=load, args=(t,), daemon=True) for t in range(len(recovered))]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert warmed.acquire(timeout=60), "the load did not start"
        try:
            marks["stopping"] = time.monotonic()
            stopped = pg_cluster.ctl("stop")
            assert stopped.returncode == 0, stopped.stderr
            marks["down"] = time.monotonic()
            assert not pg_cluster.ready(), "pg_isready still answers after the stop"
            poll(
                lambda: all(unavailable_while_down[r] >= 2 for r in range(REPLICAS)),
                timeout_s=30,
                what="every replica to answer new requests with STATE_UNAVAILABLE while PostgreSQL is down",
            )
            # The load keeps running against the stopped server for the rest of the outage.
            poll(lambda: time.monotonic() - marks["down"] >= OUTAGE_S, timeout_s=OUTAGE_S + 1, what="the outage")
        finally:
            marks["starting"] = time.monotonic()
            pg_cluster.ensure_running()  # starts the cluster and waits for pg_isready
            marks["up"] = time.monotonic()
        for tid, event in enumerate(recovered):
            assert event.wait(timeout=90), f"replica {tid % REPLICAS} did not reconnect by itself ({timeline()})"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a load thread hung"

    # The same processes served throughout: nothing was restarted.
    assert [replica_set.pid(r) for r in range(REPLICAS)] == pids
    assert all(replica_set.mesh.daemons[replica_set.name(r)].alive for r in range(REPLICAS))

    outcomes = [outcome for _, outcome in fresh_seen.values()]

    labels = Counter(o.label for o in outcomes)
    # A fresh valid path gets ACCEPT or the typed retryable STATE_UNAVAILABLE: no other answer.
    assert set(labels) <= {"ACCEPT", "ERROR:STATE_UNAVAILABLE"}, labels
    assert all(o.retryable for o in outcomes if o.error)
    assert labels["ERROR:STATE_UNAVAILABLE"] > 0, "the outage was never seen"
    # Every error is explained by the outage: none ended before the stop began, none began later than
    # the recovery bound after the server was up again and ready.
    # Reconnection is prompt, whatever the outage's length.
    slowest = max(recovered_at.values()) - marks["up"]
    assert slowest <= RECOVERY_BOUND_S, f"a replica served again only {slowest:.1f} s after pg_isready: {timeline()}"
    late = marks["up"] + RECOVERY_BOUND_S
    misplaced = [o for o in outcomes if o.error and (o.ended < marks["stopping"] or o.started > late)]
    assert not misplaced, f"errors not explained by the outage: {misplaced[:5]}; {timeline()}"
    # A replay of a path consumed before the restart: NONCE_REPLAYED, or unavailable; never ACCEPT.
    assert {o.label for o in replays} <= {"NONCE_REPLAYED", "ERROR:STATE_UNAVAILABLE"}, Counter(
        o.label for o in replays
    )
    assert any(o.verdict == "NONCE_REPLAYED" for o in replays)

    # Nothing consumed is forgotten: before the restart, or during the load.
    accepted = [item for item, o in fresh_seen.values() if o.verdict == "ACCEPT"]
    final = Counter(replica_set.present(r, item).label for item in before + accepted for r in range(REPLICAS))
    assert final == Counter({"NONCE_REPLAYED": (len(before) + len(accepted)) * REPLICAS}), final
    # A request that failed during the outage may or may not have committed: presented again it is
    # accepted at most once, then replayed everywhere.
    unknown = [item for item, o in fresh_seen.values() if o.error]
    retried = Counter(replica_set.present(0, item).label for item in unknown)
    assert set(retried) <= {"ACCEPT", "NONCE_REPLAYED"}, retried
    again = Counter(replica_set.present(r, item).label for item in unknown for r in range(REPLICAS))
    assert again == Counter({"NONCE_REPLAYED": len(unknown) * REPLICAS}), again
    # The parent's child set survived: one more child is still over its max_children.
    assert replica_set.present(2, replica_set.paths.child(parent)).label == "FANOUT_EXCEEDED"
    # And every replica accepts a fresh path once, which the others then reject as a replay.
    for r in range(REPLICAS):
        item = replica_set.paths.fresh()
        assert replica_set.present(r, item).label == "ACCEPT"
        assert {replica_set.present(o, item).label for o in range(REPLICAS) if o != r} == {"NONCE_REPLAYED"}
