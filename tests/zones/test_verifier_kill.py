"""Scenario 4: a verifier replica is killed (SIGKILL) in the middle of load; clients fail over to the
replicas in the other zones (policy: countersign/client/retry.py, docs/zones.md).

* No double accept: no path is ever ACCEPTed twice, across all attempts and replicas.
* No lost accept: every path ends admitted exactly once in the shared store; its client either got
  the ACCEPT, or — only for requests in flight on the killed replica — a retry answered
  ``NONCE_REPLAYED`` after an attempt whose outcome is unknown (the killed replica consumed the
  nonce and died before answering). Those are at most the number of concurrent clients.
* The replica restarts on its port and serves again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from countersign.client.retry import RetryPolicy, VerifyOutcome, verify_with_failover
from countersign.reasons import Reason
from tests.zones.helpers import code_of, consumed, poll, verdict
from tools.zones.evidence import Evidence, signed_paths

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

WORKERS = 4
PATHS = 240
POLICY = RetryPolicy(attempts=8, attempt_timeout_s=3.0, deadline_s=30.0, backoff_base_s=0.02, backoff_max_s=0.3)


def test_killing_a_verifier_under_load_loses_and_doubles_nothing(make_zones) -> None:
    zoned = make_zones(delay_ms=0.5)
    keys = zoned.local.deployer_keys
    evidence = signed_paths(keys, PATHS, depth=3)
    victim = "verifier-1"  # zone-b, the clients' own zone: their first choice
    # Clients in zone-b: their own zone's replica first, then the others (through the inter-zone routes).
    order = [1, 2, 0]
    done = Counter[str]()
    lock = threading.Lock()
    killed, restarted = threading.Event(), threading.Event()

    def work(chunk: list[Evidence]) -> list[tuple[Evidence, VerifyOutcome]]:
        clients = [zoned.verifier_client(i, from_zone="b") for i in order]
        results = []
        try:
            for item in chunk:
                results.append((item, verify_with_failover(clients, item.data, item.output, POLICY)))
                with lock:
                    done["paths"] += 1
        finally:
            for client in clients:
                client.close()
        return results

    def chaos() -> None:
        while done["paths"] < PATHS // 3:
            time.sleep(0.005)
        zoned.local.kill(victim)
        killed.set()
        while done["paths"] < 2 * PATHS // 3:
            time.sleep(0.005)
        zoned.local.start(victim)
        restarted.set()

    chunks = [evidence[i::WORKERS] for i in range(WORKERS)]
    saboteur = threading.Thread(target=chaos, daemon=True)
    saboteur.start()
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = [pair for part in pool.map(work, chunks) for pair in part]
    saboteur.join(30)
    assert killed.is_set() and restarted.is_set(), "the replica was not killed and restarted during the load"
    assert len(outcomes) == PATHS

    victim_address = zoned.verifier_address(1, from_zone="b")
    failed_over = [o for _, o in outcomes if any(a.error and a.target == victim_address for a in o.attempts)]
    assert failed_over, "no request saw the killed replica fail: the kill did not happen under load"
    double = [(item.replay_key, o.attempts) for item, o in outcomes if o.accept_count > 1]
    assert not double, f"double accepts: {double}"
    accepted = [item for item, o in outcomes if o.accepted]
    unknown = [item for item, o in outcomes if o.replayed_after_unknown]
    other = [
        (code_of(o.result) if o.result else None, o.attempts)
        for _, o in outcomes
        if not o.accepted and not o.replayed_after_unknown
    ]
    assert not other, f"paths neither accepted nor explained by the kill: {other[:5]}"
    # No lost accept: a call whose attempt was consumed by the killed replica is answered ACCEPT by
    # the replica it fails over to (same request_id), not NONCE_REPLAYED.
    assert not unknown, f"{len(unknown)} calls lost their accept: {[o.attempts for _, o in outcomes][:3]}"
    # No lost accept: the shared store admitted every path, exactly once (a replay key is unique).
    keys_all = {item.replay_key for item, _ in outcomes}
    assert consumed(zoned, keys_all) == keys_all
    print(
        f"{len(accepted)} accepted, {len(unknown)} admitted by the killed replica without an answer, "
        f"{len(failed_over)} failed over"
    )

    # The restarted replica serves again, on its old port.
    fresh = signed_paths(keys, 1, depth=3)[0]
    client = zoned.verifier_client(1)
    try:
        poll(lambda: verdict(client, fresh, audit=True), timeout_s=10, what="the restarted replica to serve")
        # Presenting every path again, anywhere, is a replay.
        replays = [code_of(verdict(client, item)) for item in evidence[:60]]
        assert set(replays) == {str(Reason.NONCE_REPLAYED)}, Counter(replays)
    finally:
        client.close()
    other_zone = zoned.verifier_client(2, from_zone="b")
    try:
        replays = [code_of(verdict(other_zone, item)) for item in evidence[60:120]]
        assert set(replays) == {str(Reason.NONCE_REPLAYED)}, Counter(replays)
    finally:
        other_zone.close()
