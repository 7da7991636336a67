"""``admit_session`` on every backend (memory, SQLite, PostgreSQL, DynamoDB emulator): a session's
receipt nonces and its agent path's edges are admitted ALL OR NOTHING, across handles and at once.

The reference is :class:`countersign.state.InMemoryState`; the last test compares each backend with it
over random pre-consumed nonces, request ids and sessions.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from countersign.reasons import Reason
from countersign.state import ChildEdge, EarlierAcceptance, InMemoryState, LeafNonce, StateRejection, VerifierState
from tests.stores.conftest import StoreHarness

NOW = 1_000_000
RETAIN = NOW + 60_000


def agent_edges(prefix: str = "s", max_children: int = 4) -> list[ChildEdge]:
    """The edges of an agent path root -> planner -> agent (indexes 1 and 2, as verify_path gives them)."""
    return [
        ChildEdge(f"{prefix}-root", f"{prefix}-planner", max_children, RETAIN, 1),
        ChildEdge(f"{prefix}-planner", f"{prefix}-agent", max_children, RETAIN, 2),
    ]


def receipts(prefix: str, n: int, request_id: str = "") -> list[LeafNonce]:
    """One leaf nonce per receipt, indexed by position in the session (as check_session_evidence gives them)."""
    return [LeafNonce(f"{prefix}:r{i}", RETAIN, i, request_id) for i in range(n)]


def replayed(index: int) -> StateRejection:
    return StateRejection(Reason.NONCE_REPLAYED, index)


def consumed(store: VerifierState, leaves: list[LeafNonce]) -> list[bool]:
    """Which of ``leaves`` are consumed now, asked one by one (a fresh consume succeeds only if not).
    This consumes the ones that were not: call it last."""
    return [store.admit([], leaf, consume=True, now_ms=NOW) is not None for leaf in leaves]


def test_a_session_is_consumed_once_across_handles(harness: StoreHarness) -> None:
    store, other = harness.open(), harness.open()
    edges, leaves = agent_edges(), receipts("a", 5)
    assert store.admit_session(edges, leaves, consume=True, now_ms=NOW) is None
    assert store.admit_session(edges, leaves, consume=True, now_ms=NOW) == replayed(0)
    assert other.admit_session(edges, leaves, consume=True, now_ms=NOW) == replayed(0)
    # Each receipt is consumed as a single path's leaf would be: VerifyPath on one of them is a replay.
    assert consumed(other, leaves) == [True] * 5
    assert store.entry_count() == 2 + 5


def test_a_session_whose_third_receipt_was_consumed_consumes_nothing(harness: StoreHarness) -> None:
    store, other = harness.open(), harness.open()
    edges, leaves = agent_edges(), receipts("b", 5)
    # The third receipt was accepted alone before (VerifyPath on agent path + receipt 2).
    assert store.admit([], LeafNonce(leaves[2].nonce, RETAIN, 2), consume=True, now_ms=NOW) is None
    before = store.entry_count()
    assert other.admit_session(edges, leaves, consume=True, now_ms=NOW) == replayed(2)
    assert store.entry_count() == before  # no nonce and no child recorded
    assert consumed(store, leaves) == [False, False, True, False, False]


def test_the_first_consumed_receipt_is_reported(harness: StoreHarness) -> None:
    store = harness.open()
    leaves = receipts("c", 6)
    for position in (4, 1):
        assert store.admit([], leaves[position], consume=True, now_ms=NOW) is None
    assert store.admit_session(agent_edges("c"), leaves, consume=True, now_ms=NOW) == replayed(1)


def test_a_nonce_repeated_inside_the_session_is_a_replay_and_consumes_nothing(harness: StoreHarness) -> None:
    store = harness.open()
    leaves = receipts("d", 4)
    leaves[3] = LeafNonce(leaves[1].nonce, RETAIN, 3)
    assert store.admit_session(agent_edges("d"), leaves, consume=True, now_ms=NOW) == replayed(3)
    assert store.entry_count() == 0


def test_audit_consumes_nothing_and_ignores_consumed_nonces(harness: StoreHarness) -> None:
    store = harness.open()
    edges, leaves = agent_edges("e"), receipts("e", 3)
    assert store.admit_session(edges, leaves, consume=False, now_ms=NOW) is None
    assert store.entry_count() == 0
    assert store.admit_session(edges, leaves, consume=True, now_ms=NOW) is None
    assert store.admit_session(edges, leaves, consume=False, now_ms=NOW) is None  # audit: still verifiable


def test_fan_out_is_checked_before_anything_is_consumed(harness: StoreHarness) -> None:
    store = harness.open()
    # The root already has its one allowed child (another planner).
    assert store.admit([ChildEdge("f-root", "f-other", 1, RETAIN, 1)], LeafNonce("f:x", RETAIN, 1), consume=True,
                       now_ms=NOW) is None  # fmt: skip
    edges, leaves = agent_edges("f", max_children=1), receipts("f", 3)
    rejection = StateRejection(Reason.FANOUT_EXCEEDED, 1)
    assert store.admit_session(edges, leaves, consume=False, now_ms=NOW) == rejection
    assert store.admit_session(edges, leaves, consume=True, now_ms=NOW) == rejection
    assert consumed(store, leaves) == [False] * 3


def test_a_retried_session_is_accepted_again_and_no_other_presentation_is(harness: StoreHarness) -> None:
    store, other = harness.open(), harness.open()
    edges = agent_edges("g")
    keyed = receipts("g", 4, "client-1|session-9")
    assert store.admit_session(edges, keyed, consume=True, now_ms=NOW) is None
    # The retry consumes nothing and says which acceptance it repeats (the first one's time, not its own).
    assert other.admit_session(edges, keyed, consume=True, now_ms=NOW + 5) == EarlierAcceptance(NOW)
    for intruder in ("client-2|session-9", "client-1|session-10", ""):
        assert other.admit_session(edges, receipts("g", 4, intruder), consume=True, now_ms=NOW) == replayed(0)
    # A longer session under the same key: the four consumed receipts pass, the new fifth is consumed,
    # so this is an acceptance of its own, not a retry; retried whole, it repeats that one.
    longer = receipts("g", 5, "client-1|session-9")
    assert store.admit_session(edges, longer, consume=True, now_ms=NOW + 7) is None
    assert other.admit_session(edges, longer, consume=True, now_ms=NOW + 9) == EarlierAcceptance(NOW + 7)
    assert store.entry_count() == 2 + 5


def test_concurrent_admissions_of_one_session_accept_exactly_once(harness: StoreHarness) -> None:
    handles = [harness.open() for _ in range(4)]
    edges, leaves = agent_edges("h"), receipts("h", 20)
    barrier = threading.Barrier(len(handles))

    def admit(store: VerifierState) -> StateRejection | None:
        barrier.wait()
        return store.admit_session(edges, leaves, consume=True, now_ms=NOW)

    with ThreadPoolExecutor(len(handles)) as pool:
        answers = list(pool.map(admit, handles))
    assert answers.count(None) == 1, answers
    assert all(a == replayed(0) for a in answers if a is not None), answers
    assert handles[0].entry_count() == 2 + 20


def test_a_session_as_large_as_the_store_admits_at_once(harness: StoreHarness) -> None:
    """The store's atomic bound (DynamoDB: one transaction of 100 items; ADR 0022), with the agent
    path's new children on top; one more receipt is refused before anything is written."""
    store = harness.open()
    bound = store.max_session_leaves
    if harness.name == "dynamodb_emulator":
        assert bound == 100
    n = min(bound, 300)
    leaves = receipts("i", n)
    assert store.admit_session(agent_edges("i"), leaves, consume=True, now_ms=NOW) is None
    assert store.entry_count() == 2 + n
    with pytest.raises(ValueError, match="receipts"):
        store.admit_session(agent_edges("i"), receipts("j", bound + 1), consume=True, now_ms=NOW)
    if bound < 1_000:  # audit writes nothing, so the store's atomic bound does not apply to it
        assert store.admit_session(agent_edges("i"), receipts("j", bound + 1), consume=False, now_ms=NOW) is None
    assert store.entry_count() == 2 + n
    with pytest.raises(ValueError, match="receipts"):
        store.admit_session(agent_edges("i"), [], consume=True, now_ms=NOW)


@st.composite
def session_cases(draw: st.DrawFn) -> tuple[list[int], int, str, str, bool]:
    n = draw(st.integers(1, 8))
    # Sometimes every receipt of the session was consumed before: a retry when the keys match.
    before = draw(st.lists(st.integers(0, 9), max_size=4, unique=True) | st.just(list(range(n))))
    return before, n, draw(st.sampled_from(["", "k1"])), draw(st.sampled_from(["", "k1", "k2"])), draw(st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=session_cases())
def test_every_backend_answers_as_the_reference(
    harness: StoreHarness, case: tuple[list[int], int, str, str, bool]
) -> None:
    """Receipts consumed before (alone, under one key), then a session (under another key, accept or
    audit): the same answer as the in-memory reference (a retry naming the same acceptance time), and
    the same receipts consumed after."""
    before, n, key_before, key_session, consume = case
    store, reference = harness.fresh(), InMemoryState()
    edges = agent_edges("p")
    for position in before:  # each at its own time, so a retry's answer shows which time it names
        leaf = LeafNonce(f"p:r{position}", RETAIN, position, key_before)
        at = NOW - 10 + position
        assert store.admit([], leaf, consume=True, now_ms=at) == reference.admit([], leaf, consume=True, now_ms=at)
    leaves = receipts("p", n, key_session)
    expected = reference.admit_session(edges, leaves, consume=consume, now_ms=NOW)
    assert store.admit_session(edges, leaves, consume=consume, now_ms=NOW) == expected
    assert store.entry_count() == reference.entry_count()
    probe = receipts("p", 10)
    assert consumed(store, probe) == consumed(reference, probe)
