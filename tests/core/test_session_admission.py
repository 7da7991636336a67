"""The core's session verdict with durable state (countersign.sessions.verify_session), offline: for
every set of receipts consumed before, a session is accepted exactly when none of them was, and a
rejected session consumes nothing; audit consumes nothing; the verdict names the last receipt."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.reasons import Reason
from countersign.records import Construction, Path
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, SessionSummary, verify_session
from countersign.state import InMemoryState
from countersign.verify import Mode, verify_path

pytestmark = pytest.mark.offline

NOW = 1_800_000_000_000
MESH = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"session-admission")
TRUNK = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW)
AGENT = Path(TRUNK.envelopes[:2])
OUTPUTS = [b"turn %d" % i for i in range(6)]
RECEIPTS = MESH.issue_session(AGENT, OUTPUTS, now_ms=NOW, session="chat", closed=True, label="admission")
SESSION = SessionEvidence(AGENT, RECEIPTS)
PRESENTED: list[bytes | None] = [*OUTPUTS, None]


def alone(position: int, state: InMemoryState) -> Reason | None:
    """VerifyPath on receipt ``position`` alone: None on accept, else the reason."""
    path = Path((*AGENT.envelopes, RECEIPTS[position]))
    result = verify_path(path, PRESENTED[position] or b"", registry=MESH.registry, state=state, mode=Mode.ACCEPT,
                         now_ms=NOW)  # fmt: skip
    return None if result else result.reason


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, len(RECEIPTS) - 1), max_size=3))
def test_a_session_is_accepted_exactly_when_none_of_its_receipts_was_consumed(before: set[int]) -> None:
    state = InMemoryState()
    for position in before:
        assert alone(position, state) is None
    held = state.entry_count()
    result = verify_session(SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW,
                            require_closed=True)  # fmt: skip
    assert result.attribution is not None and result.attribution.emitter.seq == len(RECEIPTS) - 1
    if not before:
        assert result
        assert state.entry_count() == held + 1 + len(RECEIPTS)  # the agent's edge and every receipt
        assert {alone(p, state) for p in range(len(RECEIPTS))} == {Reason.NONCE_REPLAYED}
    else:
        assert (result.reason, result.index) == (Reason.NONCE_REPLAYED, min(before))
        assert state.entry_count() == held  # nothing consumed, no edge recorded
        for position in set(range(len(RECEIPTS))) - before:
            assert alone(position, state) is None


def test_audit_consumes_nothing_and_the_summary_reads_the_session() -> None:
    state = InMemoryState()
    for _ in range(2):
        assert verify_session(SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.AUDIT, now_ms=NOW)
    assert state.entry_count() == 0
    assert SessionSummary.of(SESSION) == SessionSummary("chat", len(RECEIPTS), True)
    swapped = SessionEvidence(AGENT, (RECEIPTS[1], RECEIPTS[0], *RECEIPTS[2:]))
    result = verify_session(swapped, registry=MESH.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW)
    assert (result.reason, result.index, result.attribution) == (Reason.SESSION_REORDERED, 0, None)
    assert state.entry_count() == 0
