"""Any rearrangement of a valid session other than the identity is rejected, with its reason and the
index of the first offending receipt (docs/spec.md 17.3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.constructions import seal
from countersign.reasons import Reason, VerificationResult
from countersign.records import AgentRef, Construction, Envelope, NodeRecord, Path, Policy
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, check_session_evidence
from countersign.verify import DEFAULT_POLICY

pytestmark = pytest.mark.offline

NOW_MS = 1_780_000_000_000
MESH = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"session-properties")
_TRUNK = MESH.issue_path(
    Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW_MS, max_children=2
)
AGENT = Path(_TRUNK.envelopes[:2])
_OTHER_TRUNK = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b"], b"", now_ms=NOW_MS)
OTHER_AGENT = Path(_OTHER_TRUNK.envelopes[:1])
OUTPUTS = [b"turn %d" % i for i in range(6)]
CLOSED = MESH.issue_session(AGENT, OUTPUTS, now_ms=NOW_MS, session="chat", closed=True)
OTHER_SESSION = MESH.issue_session(AGENT, OUTPUTS, now_ms=NOW_MS, session="other", closed=True)
OTHER_AGENT_SESSION = MESH.issue_session(OTHER_AGENT, OUTPUTS, now_ms=NOW_MS, session="chat", closed=True)
N = len(CLOSED)


def verdict(receipts: Sequence[Envelope], *, closed: bool = True) -> VerificationResult:
    session = SessionEvidence(AGENT, tuple(receipts))
    return check_session_evidence(session, registry=MESH.registry, now_ms=NOW_MS, require_closed=closed).result


def test_the_valid_session_and_its_open_prefixes_are_accepted() -> None:
    assert verdict(CLOSED)
    for end in range(1, N):
        assert verdict(CLOSED[:end], closed=False)


@settings(max_examples=150, deadline=None)
@given(st.permutations(range(N)))
def test_a_permutation_is_reordered_at_its_first_moved_receipt(order: list[int]) -> None:
    result = verdict([CLOSED[i] for i in order])
    moved = [i for i, j in enumerate(order) if i != j]
    if not moved:
        assert result
        return
    assert (result.reason, result.index) == (Reason.SESSION_REORDERED, moved[0])


@settings(max_examples=150, deadline=None)
@given(st.sets(st.integers(0, N - 1), min_size=1, max_size=N - 1))
def test_a_deletion_is_a_gap_or_a_truncation(dropped: set[int]) -> None:
    kept = [i for i in range(N) if i not in dropped]
    result = verdict([CLOSED[i] for i in kept])
    if kept == list(range(len(kept))):  # a suffix was dropped, the close receipt with it
        assert (result.reason, result.index) == (Reason.SESSION_TRUNCATED, None)
        assert verdict([CLOSED[i] for i in kept], closed=False)
    else:
        first = next(i for i, j in enumerate(kept) if i != j)
        assert (result.reason, result.index) == (Reason.SESSION_GAP, first)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, N - 1), st.integers(0, N), st.booleans())
def test_a_duplicated_receipt_is_a_duplicate_at_its_first_copy(copied: int, at: int, closed: bool) -> None:
    receipts = list(CLOSED)
    receipts.insert(at, CLOSED[copied])
    result = verdict(receipts, closed=closed)
    assert (result.reason, result.index) == (Reason.SESSION_DUPLICATE, at if at <= copied else copied)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, N - 1), st.integers(0, N - 1), st.booleans())
def test_a_receipt_of_another_session_is_a_session_mismatch(at: int, taken: int, insert: bool) -> None:
    receipts = list(CLOSED)
    if insert:
        receipts.insert(at, OTHER_SESSION[taken])
    else:
        receipts[at] = OTHER_SESSION[taken]
    result = verdict(receipts)
    if at > 0:
        assert (result.reason, result.index) == (Reason.SESSION_MISMATCH, at)
    elif taken == 0:  # receipt 0 names the session: receipt 1 is the first that differs from it
        assert (result.reason, result.index) == (Reason.SESSION_MISMATCH, 1)
    else:  # a receipt with seq > 0 in front: the position check of receipt 0 fails first
        expected = Reason.SESSION_REORDERED if insert else Reason.SESSION_GAP
        assert (result.reason, result.index) == (expected, 0)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, N - 1), st.integers(0, N - 1), st.booleans())
def test_a_receipt_of_another_agent_is_an_agent_mismatch(at: int, taken: int, insert: bool) -> None:
    receipts = list(CLOSED)
    if insert:
        receipts.insert(at, OTHER_AGENT_SESSION[taken])
    else:
        receipts[at] = OTHER_AGENT_SESSION[taken]
    result = verdict(receipts)
    assert (result.reason, result.index) == (Reason.SESSION_AGENT_MISMATCH, at)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, N - 2), st.binary(max_size=16))
def test_other_bytes_for_a_turn_are_an_output_mismatch(at: int, other: bytes) -> None:
    presented: list[bytes | None] = [*OUTPUTS, None]
    session = SessionEvidence(AGENT, CLOSED)
    assert check_session_evidence(session, presented, registry=MESH.registry, now_ms=NOW_MS, require_closed=True).result
    if other == OUTPUTS[at]:
        return
    presented[at] = other
    result = check_session_evidence(session, presented, registry=MESH.registry, now_ms=NOW_MS).result
    assert (result.reason, result.index) == (Reason.SESSION_OUTPUT_MISMATCH, at)


def test_an_accepted_session_admits_every_receipt_nonce_and_no_receipt_edge() -> None:
    check = check_session_evidence(SessionEvidence(AGENT, CLOSED), registry=MESH.registry, now_ms=NOW_MS)
    assert check.admission is not None
    assert [leaf.index for leaf in check.admission.leaves] == list(range(N))
    assert len({leaf.nonce for leaf in check.admission.leaves}) == N
    assert len(check.admission.edges) == len(AGENT) - 1  # the agent path's edges; receipts are not counted


def test_session_evidence_round_trips_its_canonical_bytes() -> None:
    session = SessionEvidence(AGENT, CLOSED)
    assert SessionEvidence.from_bytes(session.to_bytes()).to_bytes() == session.to_bytes()


_EDITS = st.sampled_from(
    ["none", "expires", "created", "depth", "parent", "system", "nonce", "max_depth", "key", "cosigs", "construction"]
)


def _edited(receipt: Envelope, edit: str, draw_int: int) -> NodeRecord:
    record = receipt.record
    agent_leaf = AGENT.leaf.record
    cross_edge = AGENT.envelopes[1].record  # deployer-a -> deployer-b: it carries co-signatures
    changes: dict[str, object] = {
        "none": {},
        "expires": {"expires_ms": agent_leaf.expires_ms + 1 + draw_int},
        "created": {"created_ms": NOW_MS + 120_000 + draw_int},
        "depth": {"depth": (record.depth + 1 + draw_int) % 64},
        "parent": {"parent": AGENT.envelopes[0].digest()},
        "system": {"agent": AgentRef(record.agent.instance, "another-system")},
        "nonce": {"nonce": AGENT.envelopes[draw_int % len(AGENT)].record.nonce},
        "max_depth": {"policy": Policy(max_depth=draw_int % len(AGENT))},
        "key": {"key_id": MESH.signers["deployer-a"].key_id},
        "cosigs": {"cosigs": cross_edge.cosigs},
        "construction": {"construction": Construction.LINKED_LIST},
    }[edit]
    return replace(record, **changes)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, N - 1), _EDITS, st.integers(0, 1000), st.sampled_from(["resign", "keep", "garble"]))
def test_the_per_receipt_walk_gives_the_whole_walks_verdict(position: int, edit: str, k: int, signing: str) -> None:
    """Receipts after the first are checked alone (the agent path passed with receipt 0); the verdict
    must be the one the whole path's walk gives, reason, index and detail."""
    from countersign.sessions import _AgentPrefix, _receipt_walk
    from countersign.verify import walk

    record = _edited(CLOSED[position], edit, k)
    signer = MESH.signers["deployer-b"]
    if signing == "resign" and record.key_id == signer.key_id:
        receipt = seal(record, signer)
    else:
        sig = CLOSED[position].sig
        assert sig is not None
        receipt = Envelope.build(record, sig if signing == "keep" else ("A" * 85 + "A"))
    whole, _ = walk(Path((*AGENT.envelopes, receipt)), registry=MESH.registry, now_ms=NOW_MS)
    alone = _receipt_walk(_AgentPrefix.of(AGENT), receipt, MESH.registry, NOW_MS, DEFAULT_POLICY)
    assert (VerificationResult.accept() if alone is None else alone) == whole
    receipts = list(CLOSED)
    receipts[position] = receipt
    session = verdict(receipts, closed=False)
    if receipt.record.parent != CLOSED[0].record.parent:
        assert (session.reason, session.index) == (Reason.SESSION_AGENT_MISMATCH, position)
    elif not whole:
        assert (session.reason, session.index) == (whole.reason, position)
