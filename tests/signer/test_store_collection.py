"""The signer's state collector (ADR 0026) on a real SQLite file: a long run of issuances stays
bounded, and what replay safety needs (a live agent's session seq and closed flag, a live grant, a
live parent's child set) survives collection and a reopen."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from countersign.cosigning import Grant, SessionState
from signer.store import COLLECTED_TABLES, SignerStore, Transaction

pytestmark = pytest.mark.offline

LIFETIME_MS = 500  # every short-lived row expires this long after it was made
ROUND_MS = 1_000  # the fake clock advances this much between collections
PER_ROUND = 25


def digest(name: str) -> str:
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


LONG_AGENT = digest("long-lived agent")


def issue_round(store: SignerStore, round_no: int, now: int) -> None:
    """What a busy round leaves behind: agents with children, sessions, grants and proposals."""

    def work(tx: Transaction) -> None:
        for i in range(PER_ROUND):
            agent = digest(f"agent {round_no}/{i}")
            tx.record_issued(agent, b"x" * 200, now + LIFETIME_MS)
            tx.add_child(agent, f"child-{round_no}-{i}")
            tx.record_issued(digest(f"receipt {round_no}/{i}"), b"y" * 200, now + LIFETIME_MS)
            tx.store_session(SessionState("chat", agent, 0, digest(f"receipt {round_no}/{i}")))
            grant_id = f"g{round_no:04d}{i:04d}"
            tx.open_grant(Grant(grant_id, agent, "deployer-b", now + LIFETIME_MS))
            tx.save_proposal(grant_id, agent, b"{}", "{}", now + LIFETIME_MS)

    store.transaction(work)


def test_a_long_run_stays_bounded_and_keeps_what_is_live(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'signer.db'}"
    store = SignerStore(url)
    end = 10**9  # the long-lived rows outlive the whole run
    closed = SessionState("closed-chat", LONG_AGENT, 4, digest("close receipt"), closed=True)
    open_session = SessionState("open-chat", LONG_AGENT, 7, digest("last receipt"))

    def live(tx: Transaction) -> None:
        tx.record_issued(LONG_AGENT, b"root", end)
        tx.add_child(LONG_AGENT, "kept-child")
        tx.store_session(closed)
        tx.store_session(open_session)
        tx.open_grant(Grant("live-grant", LONG_AGENT, "deployer-b", end))

    store.transaction(live)
    peaks: list[int] = []
    collected = 0
    rounds = 60
    for round_no in range(rounds):
        now = round_no * ROUND_MS
        issue_round(store, round_no, now)
        peaks.append(sum(store.row_counts().values()))
        # The collector runs with a cutoff of now minus its margin: only the previous rounds' rows
        # have expired by then, this round's have not.
        removed = store.collect_expired(now, limit=7)  # small batches: many passes per round
        while max(removed.values()) == 7:
            collected += sum(removed.values())
            removed = store.collect_expired(now, limit=7)
        collected += sum(removed.values())
    counts = store.row_counts()
    # Bounded: the peak of the last round is the peak of the second (one round's rows plus one
    # round not yet expired), not sixty rounds' worth.
    assert max(peaks) == peaks[1]
    assert peaks[-1] == peaks[1]
    assert collected == (rounds - 1) * PER_ROUND * 7  # issued x2, children, counts, session, grant, proposal
    # One round's rows are still live (they expire after the last cutoff) plus the long-lived ones.
    assert counts == {
        "issued": PER_ROUND * 2 + 1,
        "children": PER_ROUND + 1,
        "child_counts": PER_ROUND + 1,
        "agent_sessions": PER_ROUND + 2,
        "grants": PER_ROUND + 1,
        "proposals": PER_ROUND,
    }
    store.close()

    # A restart after collection: the live agent's sessions continue where they were, closed stays
    # closed, its grant and child set are intact; a collected agent is unknown.
    store = SignerStore(url)
    assert set(store.row_counts()) == set(COLLECTED_TABLES)
    assert store.transaction(lambda tx: tx.session(LONG_AGENT, "closed-chat")) == closed
    assert store.transaction(lambda tx: tx.session(LONG_AGENT, "open-chat")) == open_session
    assert store.transaction(lambda tx: tx.child_count(LONG_AGENT)) == 1
    assert store.transaction(lambda tx: tx.grant("live-grant")) == Grant("live-grant", LONG_AGENT, "deployer-b", end)
    gone = digest("agent 0/0")
    assert store.issued_path(gone) is None
    assert store.transaction(lambda tx: tx.session(gone, "chat")) is None
    assert store.transaction(lambda tx: tx.child_count(gone)) == 0
    store.close()


@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_a_row_goes_only_once_its_expiry_is_before_the_cutoff(tmp_path: Path, offset: int) -> None:
    """The boundary: a row expiring at the cutoff itself is kept; one a millisecond earlier goes."""
    store = SignerStore(f"sqlite:///{tmp_path / 'signer.db'}")
    expiry = 5_000
    agent = digest("boundary agent")

    def made(tx: Transaction) -> None:
        tx.record_issued(agent, b"p", expiry)
        tx.add_child(agent, "c")
        tx.store_session(SessionState("s", agent, 2, digest("r"), closed=True))
        tx.open_grant(Grant("g", agent, "deployer-b", expiry))

    store.transaction(made)
    store.collect_expired(expiry + offset)
    kept = offset <= 0
    assert (store.issued_path(agent) is not None) is kept
    assert (store.transaction(lambda tx: tx.session(agent, "s")) is not None) is kept
    assert store.transaction(lambda tx: tx.child_count(agent)) == (1 if kept else 0)
    assert (store.transaction(lambda tx: tx.grant("g")) is not None) is kept
    store.close()


def test_a_batch_is_bounded_by_records_and_takes_what_hangs_off_them(tmp_path: Path) -> None:
    """``limit`` counts expired records; each goes with its whole child set, its count and its
    sessions in the same transaction, so no parent is ever left half collected."""
    store = SignerStore(f"sqlite:///{tmp_path / 'signer.db'}")
    parents = [digest(f"parent {n}") for n in range(5)]

    def made(tx: Transaction) -> None:
        for n, parent in enumerate(parents):
            tx.record_issued(parent, b"p", 100 + n)
            for c in range(4):
                tx.add_child(parent, f"c{n}-{c}")
            tx.store_session(SessionState("s", parent, 1, digest(f"r{n}")))

    store.transaction(made)
    first = store.collect_expired(1_000, limit=3)
    assert first == {"issued": 3, "children": 12, "child_counts": 3, "agent_sessions": 3, "grants": 0, "proposals": 0}
    held = store.row_counts()
    assert (held["issued"], held["children"], held["child_counts"], held["agent_sessions"]) == (2, 8, 2, 2)
    for parent in parents:  # every parent is wholly there or wholly gone
        there = store.issued_path(parent) is not None
        assert store.transaction(lambda tx, p=parent: tx.child_count(p)) == (4 if there else 0)
    second = store.collect_expired(1_000, limit=3)
    assert (second["issued"], second["children"]) == (2, 8)
    assert sum(store.row_counts().values()) == 0
    store.close()
