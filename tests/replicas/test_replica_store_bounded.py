"""The shared store stays bounded through the service: expired entries are collected by the replicas.

Verifiers run with ``collect_interval_ms=200`` and ``clock_skew_ms=300`` (through the environment, as
an operator would override the TOML). Short-lived paths (a few seconds) are accepted; once their
records expire (plus the skew) the replicas' collectors delete their consumed nonces and child-set
entries, so the store's entry count falls back to what the long-lived paths hold, in the PostgreSQL
tables and in every replica's ``countersign_store_entries`` gauge. Nothing is collected early, and
an expired path presented again is rejected as EXPIRED, never accepted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from tests.replicas.conftest import ReplicaSet, now_ms, poll

pytestmark = [pytest.mark.daemons, pytest.mark.postgres, pytest.mark.slow]

REPLICAS = 3
SKEW_MS = 300
COLLECT_MS = 200
SHORT_TTL_MS = 4_000
LONG_PATHS = 5
SHORT_PATHS = 40
WAVES = 2
GAUGE = "countersign_store_entries"


def test_expired_entries_are_collected_and_the_store_returns_to_its_baseline(
    replicas: Callable[..., ReplicaSet],
) -> None:
    replica_set = replicas(
        REPLICAS,
        extra_env={"COUNTERSIGN_COLLECT_INTERVAL_MS": str(COLLECT_MS), "COUNTERSIGN_CLOCK_SKEW_MS": str(SKEW_MS)},
    )
    long_lived = [replica_set.paths.fresh() for _ in range(LONG_PATHS)]
    for n, item in enumerate(long_lived):
        assert replica_set.present(n % REPLICAS, item).label == "ACCEPT"
    # Each accepted two-record path holds one consumed nonce and one child-set entry.
    baseline = (LONG_PATHS, LONG_PATHS)
    assert replica_set.store_counts() == baseline

    def gauges() -> list[float | None]:
        return [replica_set.metric(r, GAUGE) for r in range(REPLICAS)]

    def wave(number: int) -> None:
        issued_ms = now_ms()
        short = [replica_set.paths.fresh(ttl_ms=SHORT_TTL_MS) for _ in range(SHORT_PATHS)]
        outcomes = Counter(replica_set.present(n % REPLICAS, item).label for n, item in enumerate(short))
        assert outcomes == Counter({"ACCEPT": SHORT_PATHS}), (number, outcomes)
        peak = (LONG_PATHS + SHORT_PATHS, LONG_PATHS + SHORT_PATHS)
        assert replica_set.store_counts() == peak
        # Each replica's collector publishes the count; the peak is visible before anything expires.
        poll(
            lambda: gauges() == [float(sum(peak))] * REPLICAS,
            timeout_s=(SHORT_TTL_MS - 1_000) / 1000,
            what=f"{GAUGE} == {sum(peak)} on every replica",
        )
        # The earliest retention in this wave: a leaf expires at issue + ttl - 1, plus the skew.
        earliest_retention_ms = issued_ms + SHORT_TTL_MS - 1 + SKEW_MS

        def collected() -> bool:
            counts = replica_set.store_counts()
            observed_ms = now_ms()
            assert counts == peak or observed_ms > earliest_retention_ms, (
                f"entries collected before their retention ended: {counts} at {observed_ms} < {earliest_retention_ms}"
            )
            assert counts[0] >= baseline[0] and counts[1] >= baseline[1], f"a live entry was collected: {counts}"
            return counts == baseline

        poll(collected, timeout_s=(SHORT_TTL_MS + SKEW_MS) / 1000 + 15, what="the store back at its baseline")
        poll(
            lambda: gauges() == [float(sum(baseline))] * REPLICAS,
            timeout_s=10,
            what=f"{GAUGE} == {sum(baseline)} on every replica",
        )
        # Forgetting an expired nonce is safe: the path itself is now rejected before the store is asked.
        expired = Counter(replica_set.present(n % REPLICAS, item).label for n, item in enumerate(short))
        assert expired == Counter({"EXPIRED": SHORT_PATHS}), expired
        assert replica_set.store_counts() == baseline

    for number in range(WAVES):  # repeated: the store returns to its baseline every time
        wave(number)

    # The long-lived entries were never collected.
    replayed = Counter(replica_set.present(r, item).label for item in long_lived for r in range(REPLICAS))
    assert replayed == Counter({"NONCE_REPLAYED": LONG_PATHS * REPLICAS})
