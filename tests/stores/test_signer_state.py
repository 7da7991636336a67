"""One conformance suite for every signer-state backend (memory, SQLite, PostgreSQL, DynamoDB emulator),
through the ``SignerStateStore`` contract (countersign/signer_state.py, ADR 0033).

The reference semantics are :class:`countersign.signer_state.SignerStateModel`'s: each test runs
unchanged against each backend, the race tests write one piece of state from many handles at once,
and the last test drives random sequences of writes, reads and collections through a backend and the
reference side by side and requires identical answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from countersign.records import StreamUnit
from countersign.signer_state import (
    COLLECTED_TABLES,
    GrantSpend,
    IssuedRecord,
    NewChild,
    Proposal,
    ProposalSeal,
    RequestRecord,
    SessionState,
    SessionUpdate,
    SignerStateModel,
    StateReads,
    StateView,
    StateWrite,
    StoredGrant,
)
from signer.stores import SignerStateStore, open_signer_state
from tests.stores.conftest import PostgresSchemas, dynamodb_url

NOW = 1_000_000
LATER = NOW + 60_000


def digest(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


# --------------------------------------------------------------------------------------------
# One harness per backend: ``open()`` another handle on the same store


class SignerHarness:
    """``open()``: another handle on the same store; ``fresh()``: an empty store of the same backend."""

    def __init__(self, new_url: Callable[[], str]) -> None:
        self._new_url = new_url
        self.url = new_url()
        self._shared = open_signer_state(self.url) if self.url == "memory:" else None
        self._handles: list[SignerStateStore] = []

    def open(self) -> SignerStateStore:
        if self._shared is not None:  # memory: "the same store" is the same object
            return self._shared
        store = open_signer_state(self.url)
        self._handles.append(store)
        return store

    def fresh(self) -> SignerStateStore:
        store = open_signer_state(self._new_url())
        self._handles.append(store)
        return store

    def close(self) -> None:
        for store in self._handles:
            with contextlib.suppress(Exception):
                store.close()


BACKENDS = [
    pytest.param("memory", id="memory", marks=pytest.mark.offline),
    pytest.param("sqlite", id="sqlite", marks=pytest.mark.offline),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("dynamodb_emulator", id="dynamodb_emulator", marks=pytest.mark.dynamodb_emulator),
]


def _make(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> SignerHarness:
    if kind == "memory":
        return SignerHarness(lambda: "memory:")
    if kind == "sqlite":
        return SignerHarness(lambda: f"sqlite:///{tmp_path / f'signer-{uuid.uuid4().hex[:8]}.db'}")
    if kind == "postgresql":
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        return SignerHarness(lambda: schemas.url(schemas.new()))
    from countersign._daemon.dynamodb import ensure_table

    endpoint = request.getfixturevalue("dynamodb_emulator")

    def new_table() -> str:
        url = dynamodb_url(endpoint, f"cs-signer-{uuid.uuid4().hex[:12]}")
        ensure_table(url)
        return url

    return SignerHarness(new_table)


@pytest.fixture(params=BACKENDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SignerHarness]:
    made = _make(request.param, request, tmp_path)
    yield made
    made.close()


def issued(name: str, expires_ms: int = LATER) -> IssuedRecord:
    return IssuedRecord(digest(name), b'{"path":"' + name.encode() + b'"}', expires_ms)


def session_update(agent: str, seq: int, previous: int | None, *, closed: bool = False) -> SessionUpdate:
    stream = (StreamUnit.TOKENS, 16) if seq % 2 else None
    return SessionUpdate(SessionState("chat", agent, seq, digest(f"{agent}/{seq}"), closed, stream), previous, LATER)


# --------------------------------------------------------------------------------------------
# Each condition, on each backend


def test_each_new_item_is_written_once(harness: SignerHarness) -> None:
    store, other = harness.open(), harness.open()
    grant = StoredGrant("g1", digest("parent"), "deployer-b", LATER)
    proposal = Proposal("g2", digest("parent"), b"{}", '{"role":"child"}', LATER)
    request = RequestRecord("req-1", "sha256:fp", b"answer", LATER)
    for write in (StateWrite(new_grant=grant), StateWrite(proposal=proposal), StateWrite(request=request)):
        assert store.apply([write]) == [True]
        assert other.apply([write]) == [False]
    view = other.read(StateReads(grant="g1", proposal="g2", request="req-1"))
    assert (view.grant, view.proposal, view.request) == (grant, proposal, request)


def test_a_grant_is_spent_once_and_a_proposal_sealed_once(harness: SignerHarness) -> None:
    store, other = harness.open(), harness.open()
    assert store.apply([StateWrite(spend=GrantSpend("missing", "sha256:m", "c"))]) == [False]
    store.apply([StateWrite(new_grant=StoredGrant("g", digest("p"), "deployer-b", LATER))])
    assert store.apply([StateWrite(spend=GrantSpend("g", "sha256:m1", "cosig-1"))]) == [True]
    assert other.apply([StateWrite(spend=GrantSpend("g", "sha256:m2", "cosig-2"))]) == [False]
    assert other.read(StateReads(grant="g")).grant == StoredGrant(
        "g", digest("p"), "deployer-b", LATER, "sha256:m1", "cosig-1"
    )
    assert store.apply([StateWrite(seal=ProposalSeal("g", b"path"))]) == [False]  # no proposal yet
    store.apply([StateWrite(proposal=Proposal("g", digest("p"), b"rec", "cosig", LATER))])
    assert store.apply([StateWrite(seal=ProposalSeal("g", b"path-1"))]) == [True]
    assert other.apply([StateWrite(seal=ProposalSeal("g", b"path-2"))]) == [False]
    sealed = other.read(StateReads(proposal="g")).proposal
    assert sealed is not None and sealed.sealed_path == b"path-1"


def test_a_session_moves_on_only_from_the_seq_it_was_read_at(harness: SignerHarness) -> None:
    store, other = harness.open(), harness.open()
    agent = digest("agent")
    assert store.apply([StateWrite(session=session_update(agent, 0, previous=0))]) == [False]  # not stored yet
    assert store.apply([StateWrite(session=session_update(agent, 0, previous=None))]) == [True]
    assert other.apply([StateWrite(session=session_update(agent, 0, previous=None))]) == [False]  # taken
    assert other.apply([StateWrite(session=session_update(agent, 1, previous=0))]) == [True]
    assert store.apply([StateWrite(session=session_update(agent, 1, previous=0))]) == [False]  # seq 1 is gone
    assert store.apply([StateWrite(session=session_update(agent, 2, previous=1, closed=True))]) == [True]
    assert other.read(StateReads(session=(agent, "chat"))).session == session_update(agent, 2, 1, closed=True).state
    assert other.read(StateReads(session=(digest("another agent"), "chat"))).session is None


def test_child_slots_are_bounded_and_each_nonce_counted_once(harness: SignerHarness) -> None:
    store, other = harness.open(), harness.open()
    parent = digest("parent")
    assert store.apply([StateWrite(child=NewChild(parent, "none-allowed", 0, LATER))]) == [False]
    outcomes = [store.apply([StateWrite(child=NewChild(parent, f"c{i}", 3, LATER))])[0] for i in range(5)]
    assert outcomes == [True, True, True, False, False]
    assert other.apply([StateWrite(child=NewChild(parent, "c0", 5, LATER))]) == [False]  # known nonce
    assert other.read(StateReads(children_of=parent)).child_count == 3
    assert other.read(StateReads(children_of=digest("childless"))).child_count == 0


def test_a_write_is_whole_or_nothing(harness: SignerHarness) -> None:
    """A write whose last condition fails stores none of its other parts (issued records included)."""
    store = harness.open()
    parent, agent = digest("parent"), digest("agent")
    store.apply([StateWrite(request=RequestRecord("taken", "sha256:x", b"a", LATER))])
    doomed = StateWrite(
        issued=(issued("never"),),
        child=NewChild(parent, "n1", 5, LATER),
        session=session_update(agent, 0, previous=None),
        new_grant=StoredGrant("never-grant", parent, "deployer-b", LATER),
        request=RequestRecord("taken", "sha256:y", b"b", LATER),
    )
    assert store.apply([doomed]) == [False]
    view = store.read(
        StateReads(issued=digest("never"), children_of=parent, session=(agent, "chat"), grant="never-grant")
    )
    assert view == StateView(request=None)
    assert store.read(StateReads(request="taken")).request == RequestRecord("taken", "sha256:x", b"a", LATER)


def test_a_batch_applies_each_write_on_its_own(harness: SignerHarness) -> None:
    """One group commit: a conflicting write in the middle changes nothing of the others, and a later
    write in the same batch sees what an earlier one wrote."""
    store = harness.open()
    agent = digest("agent")
    batch = [
        StateWrite(issued=(issued("r0"),), session=session_update(agent, 0, previous=None)),
        StateWrite(issued=(issued("lost"),), session=session_update(agent, 0, previous=None)),  # seq 0 taken
        StateWrite(issued=(issued("r1"),), session=session_update(agent, 1, previous=0)),
    ]
    assert store.apply(batch) == [True, False, True]
    assert store.read(StateReads(issued=digest("r0"))).issued == issued("r0").path
    assert store.read(StateReads(issued=digest("lost"))).issued is None
    assert store.read(StateReads(session=(agent, "chat"))).session == batch[2].session.state  # type: ignore[union-attr]


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_collection_takes_a_row_only_once_its_expiry_is_before_the_cutoff(harness: SignerHarness, offset: int) -> None:
    store = harness.open()
    expiry = NOW
    parent = digest("boundary")
    store.apply([StateWrite(
        issued=(issued("boundary", expiry),), child=NewChild(parent, "c", 2, expiry),
        session=SessionUpdate(SessionState("s", parent, 0, digest("r")), None, expiry),
        new_grant=StoredGrant("g", parent, "deployer-b", expiry), proposal=Proposal("g", parent, b"r", "c", expiry),
        request=RequestRecord("req", "sha256:f", b"a", expiry),
    )])  # fmt: skip
    removed = store.collect_expired(expiry + offset, 100)
    kept = offset <= 0
    assert removed == dict.fromkeys(COLLECTED_TABLES, 0 if kept else 1)
    view = store.read(StateReads(issued=digest("boundary"), children_of=parent, session=(parent, "s"), grant="g",
                                 proposal="g", request="req"))  # fmt: skip
    present = (view.issued, view.session, view.grant, view.proposal, view.request)
    assert [part is not None for part in present] == [kept] * 5
    assert view.child_count == (1 if kept else 0)


# --------------------------------------------------------------------------------------------
# Races: many handles (replicas) write one piece of state at once


def _race(harness: SignerHarness, writers: int, write_of: Any) -> list[bool]:
    handles = [harness.open() for _ in range(writers)]
    barrier = threading.Barrier(writers)

    def run(index: int) -> bool:
        barrier.wait()
        return handles[index].apply([write_of(index)])[0]

    with ThreadPoolExecutor(writers) as pool:
        return list(pool.map(run, range(writers)))


def test_racing_writers_take_a_seq_exactly_once(harness: SignerHarness) -> None:
    agent = digest("raced agent")
    harness.open().apply([StateWrite(session=session_update(agent, 0, previous=None))])
    outcomes = _race(harness, 8, lambda i: StateWrite(issued=(issued(f"r-{i}"),), session=session_update(agent, 1, 0)))
    assert outcomes.count(True) == 1
    winner = outcomes.index(True)
    view = harness.open().read(StateReads(session=(agent, "chat"), issued=digest(f"r-{(winner + 1) % 8}")))
    assert view.session is not None and view.session.last_seq == 1
    assert view.issued is None  # a loser's record was never kept


def test_racing_writers_fill_a_parent_to_its_limit_and_no_further(harness: SignerHarness) -> None:
    parent = digest("raced parent")
    outcomes = _race(harness, 10, lambda i: StateWrite(child=NewChild(parent, f"n{i}", 3, LATER)))
    assert outcomes.count(True) == 3
    assert harness.open().read(StateReads(children_of=parent)).child_count == 3


def test_racing_writers_spend_a_grant_once(harness: SignerHarness) -> None:
    parent = digest("granting parent")
    harness.open().apply([StateWrite(new_grant=StoredGrant("raced", parent, "deployer-b", LATER))])

    def spend(i: int) -> StateWrite:
        return StateWrite(spend=GrantSpend("raced", f"sha256:m{i}", f"c{i}"), child=NewChild(parent, f"n{i}", 8, LATER))

    outcomes = _race(harness, 8, spend)
    assert outcomes.count(True) == 1
    assert harness.open().read(StateReads(children_of=parent)).child_count == 1


# --------------------------------------------------------------------------------------------
# Every backend against the reference


AGENTS = [digest(f"agent-{i}") for i in range(2)]
PARENTS = [digest(f"parent-{i}") for i in range(2)]
GRANTS = ["g0", "g1"]
REQUESTS = ["q0", "q1"]
EXPIRIES = [NOW + 10, NOW + 1_000]


def _writes() -> st.SearchStrategy[StateWrite]:
    """Writes over a small key space, so that conditions collide often (and each kind of item keeps
    one expiry per key, as the signer writes them: a parent's or agent's)."""
    seq = st.integers(0, 3)
    sessions = st.builds(
        lambda agent, s, previous, closed: SessionUpdate(
            SessionState("chat", AGENTS[agent], s, digest(f"{agent}/{s}"), closed), previous, EXPIRIES[agent]
        ),
        st.integers(0, 1), seq, st.none() | seq, st.booleans(),
    )  # fmt: skip
    children = st.builds(
        lambda p, nonce, limit: NewChild(PARENTS[p], f"n{nonce}", limit, EXPIRIES[p]),
        st.integers(0, 1), st.integers(0, 4), st.integers(0, 3),
    )  # fmt: skip
    grants = st.builds(lambda g: StoredGrant(GRANTS[g], PARENTS[g], "deployer-b", EXPIRIES[g]), st.integers(0, 1))
    spends = st.builds(
        lambda g, m: GrantSpend(GRANTS[g], f"sha256:m{m}", f"c{m}"), st.integers(0, 1), st.integers(0, 2)
    )
    proposals = st.builds(lambda g: Proposal(GRANTS[g], PARENTS[g], b"rec", "cosig", EXPIRIES[g]), st.integers(0, 1))
    seals = st.builds(lambda g, p: ProposalSeal(GRANTS[g], b"path-%d" % p), st.integers(0, 1), st.integers(0, 2))
    requests = st.builds(
        lambda r, a: RequestRecord(REQUESTS[r], f"sha256:f{a}", b"answer-%d" % a, EXPIRIES[r]),
        st.integers(0, 1), st.integers(0, 2),
    )  # fmt: skip
    records = st.lists(st.builds(lambda i: issued(f"rec-{i}", EXPIRIES[i % 2]), st.integers(0, 3)), max_size=2)
    return st.builds(
        StateWrite,
        issued=records.map(tuple), child=st.none() | children, session=st.none() | sessions,
        new_grant=st.none() | grants, spend=st.none() | spends, proposal=st.none() | proposals,
        seal=st.none() | seals, request=st.none() | requests,
    )  # fmt: skip


def _every_read() -> list[StateReads]:
    return [
        StateReads(issued=digest(f"rec-{i}"), children_of=PARENTS[i % 2], session=(AGENTS[i % 2], "chat"),
                   grant=GRANTS[i % 2], proposal=GRANTS[i % 2], request=REQUESTS[i % 2])
        for i in range(4)
    ]  # fmt: skip


def test_random_sequences_match_the_reference(harness: SignerHarness) -> None:
    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.model = SignerStateModel()
            self.store = harness.fresh()

        @rule(writes=st.lists(_writes(), min_size=1, max_size=4))
        def apply(self, writes: list[StateWrite]) -> None:
            assert self.store.apply(writes) == self.model.apply_all(writes)

        @rule(past=st.booleans(), which=st.integers(0, 1))
        def collect(self, past: bool, which: int) -> None:
            cutoff = EXPIRIES[which] + (1 if past else 0)
            while True:  # a backend collects in batches: until one comes back empty
                if not any(self.store.collect_expired(cutoff, 1_000).values()):
                    break
            self.model.collect_expired(cutoff)

        def teardown(self) -> None:
            self.store.close()  # one store per example: give its connections back now

        @invariant()
        def same_views(self) -> None:
            for reads in _every_read():
                assert self.store.read(reads) == self.model.read(reads)

    run_state_machine_as_test(Machine, settings=settings(max_examples=25, stateful_step_count=12, deadline=None))
