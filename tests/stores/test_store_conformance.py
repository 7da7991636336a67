"""One conformance suite for every verifier-state backend (memory, SQLite, PostgreSQL, DynamoDB
emulator): each test runs unchanged against each backend, through the ``ReplayState`` interface.

The reference semantics are :class:`countersign.state.InMemoryReplayState`'s; the last test drives random
sequences of admits, audits, clock steps and collections through a backend and the reference side by
side and requires identical answers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from countersign.errors import StateUnavailable
from countersign.reasons import Reason
from countersign.state import ChildEdge, EarlierAcceptance, InMemoryReplayState, LeafNonce, ReplayState, StateRejection
from tests.stores.conftest import StoreHarness

NOW = 1_000_000


def edge(parent: str, child: str, max_children: int = 3, retain: int = NOW + 60_000, index: int = 1) -> ChildEdge:
    return ChildEdge(parent, child, max_children, retain, index)


def leaf(nonce: str, retain: int = NOW + 60_000, index: int = 2) -> LeafNonce:
    return LeafNonce(nonce, retain, index)


def chain(*links: tuple[str, str, int], nonce: str, retain: int = NOW + 60_000) -> tuple[list[ChildEdge], LeafNonce]:
    """A path's edges (parent, child, max_children), indexed as verify_path does: edge i at i + 1."""
    edges = [edge(p, c, m, retain, i + 1) for i, (p, c, m) in enumerate(links)]
    return edges, leaf(nonce, retain, len(links))


def replayed(index: int) -> StateRejection:
    return StateRejection(Reason.NONCE_REPLAYED, index)


def fanout(index: int) -> StateRejection:
    return StateRejection(Reason.FANOUT_EXCEEDED, index)


def test_accept_then_replay_across_handles(harness: StoreHarness) -> None:
    store, other = harness.open(), harness.open()
    edges, nonce = chain(("root", "a1", 4), ("a1", "leaf1", 4), nonce="leaf1")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) is None
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(2)
    assert other.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(2)
    # A path of one record (no edge) consumes its nonce just the same.
    assert other.admit([], leaf("solo", index=0), consume=True, now_ms=NOW) is None
    assert store.admit([], leaf("solo", index=0), consume=True, now_ms=NOW) == replayed(0)
    assert store.entry_count() == 2 + 2  # two children, two nonces


def test_a_retried_request_is_accepted_again_and_nothing_else_is(harness: StoreHarness) -> None:
    """The idempotency key: the same request retried (on any handle) after a lost answer gets its
    acceptance again, as a retry naming that acceptance's time; another key, or none, is a replay."""
    store, other = harness.open(), harness.open()
    edges, _ = chain(("root", "a1", 4), ("a1", "leaf1", 4), nonce="leaf1")
    first = LeafNonce("leaf1", NOW + 60_000, 2, "client-1|request-7")
    assert store.admit(edges, first, consume=True, now_ms=NOW) is None
    assert other.admit(edges, first, consume=True, now_ms=NOW + 5) == EarlierAcceptance(NOW)
    assert store.admit(edges, first, consume=True, now_ms=NOW + 9) == EarlierAcceptance(NOW)
    for intruder in ("client-2|request-7", "client-1|request-8", ""):
        retry = LeafNonce("leaf1", NOW + 60_000, 2, intruder)
        assert other.admit(edges, retry, consume=True, now_ms=NOW) == replayed(2)
    # A nonce first consumed without a key never matches a later keyed request.
    assert store.admit([], leaf("solo", index=0), consume=True, now_ms=NOW) is None
    assert store.admit([], LeafNonce("solo", NOW + 60_000, 0, "client-1|r"), consume=True, now_ms=NOW) == replayed(0)
    # Without edges (the DynamoDB backend's single conditional put) the key works the same way.
    keyed = LeafNonce("solo2", NOW + 60_000, 0, "client-1|r2")
    assert store.admit([], keyed, consume=True, now_ms=NOW + 1) is None
    assert other.admit([], keyed, consume=True, now_ms=NOW + 2) == EarlierAcceptance(NOW + 1)
    assert other.admit([], LeafNonce("solo2", NOW + 60_000, 0, "client-2|r2"), consume=True, now_ms=NOW) == replayed(0)
    assert store.entry_count() == 2 + 3


def test_audit_records_nothing_and_ignores_consumed_nonces(harness: StoreHarness) -> None:
    store = harness.open()
    edges, nonce = chain(("p", "c1", 1), nonce="c1")
    assert store.admit(edges, nonce, consume=False, now_ms=NOW) is None
    assert store.admit(edges, nonce, consume=False, now_ms=NOW) is None
    assert store.entry_count() == 0
    # The audited child was not recorded: a different child still fits under max_children=1.
    other_edges, other_nonce = chain(("p", "c2", 1), nonce="c2")
    assert store.admit(other_edges, other_nonce, consume=True, now_ms=NOW) is None
    assert store.admit(edges, nonce, consume=False, now_ms=NOW) == fanout(1)
    # Audit does not look at consumed nonces: a consumed path still audits as valid.
    assert store.admit(other_edges, other_nonce, consume=False, now_ms=NOW) is None
    assert store.entry_count() == 2


def test_fanout_limit_and_known_child(harness: StoreHarness) -> None:
    store = harness.open()
    for i in range(2):
        edges, nonce = chain(("parent", f"kid{i}", 2), nonce=f"n{i}")
        assert store.admit(edges, nonce, consume=True, now_ms=NOW) is None
    edges, nonce = chain(("parent", "kid2", 2), nonce="n2")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == fanout(1)
    assert store.admit(edges, nonce, consume=False, now_ms=NOW) == fanout(1)
    # The rejected path consumed nothing: its nonce is still free once its edge fits.
    assert store.admit([], leaf("n2", index=0), consume=True, now_ms=NOW) is None
    # A child already in the set always passes, even when the set is full.
    known, fresh_nonce = chain(("parent", "kid0", 2), nonce="n-again")
    assert store.admit(known, fresh_nonce, consume=True, now_ms=NOW) is None
    assert store.admit(known, leaf("n-audit"), consume=False, now_ms=NOW) is None
    assert store.entry_count() == 2 + 4  # two children, four nonces (n0, n1, n2, n-again)


def test_zero_max_children_rejects_any_child(harness: StoreHarness) -> None:
    store = harness.open()
    edges, nonce = chain(("barren", "x", 0), nonce="x")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == fanout(1)
    assert store.admit(edges, nonce, consume=False, now_ms=NOW) == fanout(1)
    assert store.entry_count() == 0


def test_fanout_rejection_is_all_or_nothing_and_reports_first_edge(harness: StoreHarness) -> None:
    store = harness.open()
    full, full_nonce = chain(("mid", "taken", 1), nonce="taken")
    assert store.admit(full, full_nonce, consume=True, now_ms=NOW) is None
    # Edge 1 (root -> mid) would fit, edge 2 (mid -> other) would not: FANOUT at 2, nothing recorded.
    edges, nonce = chain(("root", "mid", 1), ("mid", "other", 1), nonce="other")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == fanout(2)
    assert store.entry_count() == 2
    sibling, sibling_nonce = chain(("root", "sibling", 1), nonce="sibling")
    assert store.admit(sibling, sibling_nonce, consume=True, now_ms=NOW) is None
    # Both edges over their limit: the first one in path order is reported.
    both, both_nonce = chain(("root", "third", 1), ("mid", "fourth", 1), nonce="fourth")
    assert store.admit(both, both_nonce, consume=True, now_ms=NOW) == fanout(1)


def test_fanout_is_checked_before_replay(harness: StoreHarness) -> None:
    store = harness.open()
    edges, nonce = chain(("p", "c", 1), nonce="c")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) is None
    over, _ = chain(("p", "d", 1), nonce="c")
    assert store.admit(over, nonce, consume=True, now_ms=NOW) == fanout(1)


def test_replayed_path_records_its_children(harness: StoreHarness) -> None:
    store = harness.open()
    assert store.admit([], leaf("used", index=1), consume=True, now_ms=NOW) is None
    edges, nonce = chain(("p", "c", 1), nonce="used")
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(1)
    other, other_nonce = chain(("p", "d", 1), nonce="d")
    assert store.admit(other, other_nonce, consume=True, now_ms=NOW) == fanout(1)


def test_collect_expired_respects_retention(harness: StoreHarness) -> None:
    store = harness.open()
    edges, nonce = chain(("p", "c", 1), nonce="c", retain=NOW + 1_000)
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) is None
    assert store.collect_expired(NOW + 1_000) == 0  # retention ends AFTER retain_until_ms
    assert store.entry_count() == 2
    assert store.collect_expired(NOW + 1_001) == 2
    assert store.entry_count() == 0
    # Forgotten child-set member: the parent's slot is free again.
    other, other_nonce = chain(("p", "d", 1), nonce="d", retain=NOW + 5_000)
    assert store.admit(other, other_nonce, consume=True, now_ms=NOW + 1_001) is None
    assert store.collect_expired(NOW + 1_002, limit=0) == 0


def test_store_stays_bounded_under_sustained_traffic(harness: StoreHarness) -> None:
    """Ten paths a round, each with a fresh child and nonce retained 100-150 ms; the clock moves
    100 ms a round and the collector drains with a small limit. Every call removes at most the limit,
    the limit is reached (so it binds), and the store holds exactly the last round's entries."""
    store = harness.open()
    limit = 7
    now = NOW
    calls: list[int] = []
    for round_no in range(12):
        for i in range(10):
            edges, nonce = chain((f"p{round_no}", f"c{round_no}-{i}", 100), nonce=f"n{round_no}-{i}", retain=now + 100)
            edges = [ChildEdge(e.parent_digest, e.child_nonce, e.max_children, now + 150, e.index) for e in edges]
            assert store.admit(edges, nonce, consume=True, now_ms=now) is None
        now += 100
        while True:
            removed = store.collect_expired(now, limit)
            calls.append(removed)
            assert 0 <= removed <= limit
            if removed < limit:
                break
        assert store.entry_count() == 20, f"round {round_no}: only the live round may remain"
    assert max(calls) == limit
    assert sum(calls) == 11 * 20
    now += 1_000
    while store.collect_expired(now, limit) == limit:
        pass
    assert store.entry_count() == 0


def test_migrations_are_idempotent_open_twice(harness: StoreHarness) -> None:
    edges, nonce = chain(("p", "c", 2), nonce="c")
    first = harness.open()
    assert first.admit(edges, nonce, consume=True, now_ms=NOW) is None
    # Opening the same, already migrated store again changes nothing and sees the same data.
    second = harness.open()
    assert second.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(1)
    assert second.entry_count() == first.entry_count() == 2


def test_migrations_race_safely_when_starters_open_concurrently(harness: StoreHarness) -> None:
    handles = harness.open_many_concurrently(4)
    edges, nonce = chain(("p", "c", 2), nonce="c")
    assert handles[0].admit(edges, nonce, consume=True, now_ms=NOW) is None
    for handle in handles[1:]:
        assert handle.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(1)


def test_outage_raises_state_unavailable_then_recovers(outage_harness: StoreHarness) -> None:
    harness = outage_harness
    outage = harness.outage()
    assert outage is not None, f"{harness.name} has no way to take its store away"
    store = harness.open_for_outage()
    warm, warm_nonce = chain(("p", "warm", 4), nonce="warm")
    assert store.admit(warm, warm_nonce, consume=True, now_ms=NOW) is None
    edges, nonce = chain(("p", "during", 4), nonce="during")
    with outage:
        for _ in range(3):  # every attempt, not just the first, must fail closed
            with pytest.raises(StateUnavailable):
                store.admit(edges, nonce, consume=True, now_ms=NOW)
    # Back up: the store reconnects by itself; nothing of the failed attempts was recorded.
    result = _admit_until_reachable(store, edges, nonce)
    assert result is None
    assert store.admit(edges, nonce, consume=True, now_ms=NOW) == replayed(1)


def _admit_until_reachable(store: ReplayState, edges: list[ChildEdge], nonce: LeafNonce) -> StateRejection | None:
    """The first answer the store gives once reachable again (a pooled connection that died in the
    outage may fail one more call; a store that never comes back fails the test)."""
    failures: list[StateUnavailable] = []
    for _ in range(20):
        try:
            return store.admit(edges, nonce, consume=True, now_ms=NOW)
        except StateUnavailable as exc:
            failures.append(exc)
            threading.Event().wait(0.1)
    pytest.fail(f"store did not come back after the outage: {failures[-1]}")


# --------------------------------------------------------------------------------------------
# Random sequences against the reference model


@dataclass(frozen=True)
class _Parent:
    digest: str
    max_children: int
    retain_ms: int  # per parent, as verify_path derives it (parent expiry + skew)


PARENTS = [_Parent(f"sha256:parent{i}", max_children=i, retain_ms=NOW + 1_000 * (i + 1)) for i in range(4)]
CHILDREN = [f"child{i}" for i in range(5)]
NONCES = [f"nonce{i}" for i in range(6)]
NONCE_RETAIN = {n: NOW + 700 * (i + 1) for i, n in enumerate(NONCES)}

BOUNDARIES = sorted({p.retain_ms for p in PARENTS} | set(NONCE_RETAIN.values()))
EXAMPLES = {"memory": 60, "sqlite": 40, "postgresql": 30, "dynamodb_emulator": 12}


def test_random_sequences_match_reference_model(harness: StoreHarness) -> None:
    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.store = harness.fresh()
            self.model = InMemoryReplayState()
            self.now = NOW

        @rule(
            parents=st.lists(st.sampled_from(PARENTS), max_size=3, unique_by=lambda p: p.digest),
            children=st.lists(st.sampled_from(CHILDREN), min_size=3, max_size=3),
            nonce=st.sampled_from(NONCES),
            consume=st.booleans(),
        )
        def admit(self, parents: list[_Parent], children: list[str], nonce: str, consume: bool) -> None:
            edges = [
                ChildEdge(p.digest, children[i], p.max_children, p.retain_ms, i + 1) for i, p in enumerate(parents)
            ]
            leaf_nonce = LeafNonce(nonce, NONCE_RETAIN[nonce], len(edges))
            expected = self.model.admit(edges, leaf_nonce, consume=consume, now_ms=self.now)
            got = self.store.admit(edges, leaf_nonce, consume=consume, now_ms=self.now)
            assert got == expected

        @rule(step=st.integers(min_value=0, max_value=2_000))
        def advance(self, step: int) -> None:
            self.now += step

        @rule(boundary=st.sampled_from(BOUNDARIES), past=st.booleans())
        def advance_to_retention_boundary(self, boundary: int, past: bool) -> None:
            self.now = max(self.now, boundary + int(past))  # exactly at, or 1 ms after, a retention end

        @rule()
        def collect(self) -> None:
            assert self.store.collect_expired(self.now, 10_000) == self.model.collect_expired(self.now, 10_000)

        @invariant()
        def same_size(self) -> None:
            assert self.store.entry_count() == self.model.entry_count()

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=EXAMPLES[harness.name], stateful_step_count=25, deadline=None),
    )
