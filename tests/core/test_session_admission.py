"""The core's session verdict with durable state (countersign.sessions.verify_session), offline: for
every set of receipts consumed before, a session is accepted exactly when none of them was, and a
rejected session consumes nothing; audit consumes nothing; the verdict names the last receipt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.canonical import JsonValue
from countersign.policy import ConsumerPolicy, PolicyViolation, parse_policy
from countersign.reasons import Attribution, Reason
from countersign.records import Construction, Path
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, SessionSummary, verify_session_evidence
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
    result = verify_session_evidence(SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.ACCEPT,
                                     now_ms=NOW, require_closed=True)  # fmt: skip
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
        assert verify_session_evidence(
            SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.AUDIT, now_ms=NOW
        )
    assert state.entry_count() == 0
    assert SessionSummary.of(SESSION) == SessionSummary("chat", len(RECEIPTS), True)
    swapped = SessionEvidence(AGENT, (RECEIPTS[1], RECEIPTS[0], *RECEIPTS[2:]))
    result = verify_session_evidence(swapped, registry=MESH.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW)
    assert (result.reason, result.index, result.attribution) == (Reason.SESSION_REORDERED, 0, None)
    assert state.entry_count() == 0


@dataclass(frozen=True, slots=True)
class RefuseReceipt(ConsumerPolicy):
    """A test clause that refuses the path whose leaf is the receipt at session position ``seq``."""

    seq: int
    clause: ClassVar[str] = "refuse_receipt"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        if attribution.emitter.seq == self.seq:
            return PolicyViolation(self.clause, attribution.emitter.index, f"receipt {self.seq}")
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: self.seq}


@pytest.mark.parametrize("seq", range(len(RECEIPTS)))
def test_a_consumer_policy_refuses_the_session_at_its_first_refused_receipt_and_consumes_nothing(seq: int) -> None:
    state = InMemoryState()
    result = verify_session_evidence(SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.ACCEPT,
                                     now_ms=NOW, consumer_policy=RefuseReceipt(seq))  # fmt: skip
    assert (result.reason, result.index) == (Reason.CONSUMER_POLICY_VIOLATION, seq)
    assert result.detail == f"path envelope {len(AGENT)}: refuse_receipt: receipt {seq}"
    assert result.attribution is not None and result.attribution.emitter.seq == len(RECEIPTS) - 1
    assert state.entry_count() == 0  # step C runs before the state: the same session can be accepted after
    assert verify_session_evidence(
        SESSION, PRESENTED, registry=MESH.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW
    )


def test_require_closed_session_allows_a_closed_session_and_refuses_an_open_one_or_a_single_path() -> None:
    closed_only = parse_policy('{"v": 1, "policy": {"require_closed_session": true}}')
    assert verify_session_evidence(SESSION, PRESENTED, registry=MESH.registry, state=InMemoryState(),
                                   mode=Mode.AUDIT, now_ms=NOW, consumer_policy=closed_only)  # fmt: skip
    opened = SessionEvidence(AGENT, RECEIPTS[:-1])
    refused = verify_session_evidence(opened, PRESENTED[:-1], registry=MESH.registry, state=InMemoryState(),
                                      mode=Mode.AUDIT, now_ms=NOW, consumer_policy=closed_only)  # fmt: skip
    assert (refused.reason, refused.index) == (Reason.CONSUMER_POLICY_VIOLATION, 0)
    # The close receipt shown alone is one path: it proves nothing of the receipts around it.
    close = Path((*AGENT.envelopes, RECEIPTS[-1]))
    alone = verify_path(close, b"", registry=MESH.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW,
                        consumer_policy=closed_only)  # fmt: skip
    assert (alone.reason, alone.index) == (Reason.CONSUMER_POLICY_VIOLATION, len(AGENT))  # its output is b""
