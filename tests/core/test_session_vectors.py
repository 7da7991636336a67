"""The committed session vectors (tests/vectors/sessions/) give the verdicts they name."""

from __future__ import annotations

import base64
import json
from pathlib import Path as FilePath
from typing import Any

import pytest

from countersign.errors import MalformedError
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.registry import Registry
from countersign.sessions import (
    SessionEvidence,
    check_session_evidence_bytes,
    session_from_parts,
    verify_session_evidence,
)
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, malformed_result

pytestmark = pytest.mark.offline

SESSIONS = FilePath(__file__).parents[1] / "vectors" / "sessions"
CASES = [sorted((SESSIONS / kind).glob("*.json")) for kind in ("valid", "invalid", "policy", "malformed")]
CASES = [case for cases in CASES for case in cases]
STATE_CASES = sorted((SESSIONS / "state").glob("*.json"))
SESSION_REASONS = {r for r in Reason if r.value.startswith("SESSION_")}


def _outputs(vector: dict[str, Any]) -> list[bytes | None]:
    return [None if o is None else base64.b64decode(o) for o in vector["outputs_base64"]]


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_session_vector_verdict(case: FilePath) -> None:
    vector = json.loads(case.read_text())
    check = check_session_evidence_bytes(
        json.dumps(vector["session"]).encode(),
        _outputs(vector),
        registry=Registry.from_json(vector["registry"]),
        now_ms=vector["now_ms"],
        require_closed=vector["require_closed"],
        policy=VerifierPolicy(clock_skew_ms=vector["clock_skew_ms"]),
        consumer_policy=parse_policy(json.dumps(vector["policy"])) if "policy" in vector else None,
    )
    result = check.result
    got = {"verdict": result.verdict.value, "reason": result.reason and result.reason.value, "index": result.index}
    assert got == vector["expected"], result.detail
    assert (check.admission is not None) == (result.verdict.value == "ACCEPT")


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_session_read_from_its_parts_is_the_session_read_whole(case: FilePath) -> None:
    """The command line reads the agent path and each receipt from files (session_from_parts): the
    evidence, or the malformed verdict, is the one the assembled bytes get (spec 17.1, 2.1)."""
    session = json.loads(case.read_text())["session"]
    agent = json.dumps(session["agent"]).encode()
    receipts = [json.dumps(r).encode() for r in session["receipts"]]

    def read(parse: Any) -> object:
        try:
            return parse()
        except MalformedError as exc:
            found = malformed_result(exc)
            return (found.reason, found.index)

    whole = read(lambda: SessionEvidence.from_bytes(json.dumps(session).encode()))
    assert read(lambda: session_from_parts(agent, receipts)) == whole
    assert read(lambda: session_from_parts(agent, json.dumps(session["receipts"]).encode())) == whole


@pytest.mark.parametrize("case", STATE_CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_session_state_vector_verdict(case: FilePath) -> None:
    """Spec 17.4 against a fresh, empty state: the sessions of ``before`` first, then the session."""
    vector = json.loads(case.read_text())
    state = InMemoryState()
    registry = Registry.from_json(vector["registry"])
    policy = VerifierPolicy(clock_skew_ms=vector["clock_skew_ms"])

    def verify(session: object, mode: Mode, outputs: list[bytes | None] | None = None) -> Any:
        return verify_session_evidence(
            SessionEvidence.from_json(session), outputs, registry=registry, state=state, mode=mode,
            now_ms=vector["now_ms"], require_closed=vector["require_closed"], policy=policy,
        )  # fmt: skip

    for before in vector["before"]:
        assert verify(before, Mode.ACCEPT), "a session of before must be accepted"
    result = verify(vector["session"], Mode(vector["mode"]), _outputs(vector))
    got = {"verdict": result.verdict.value, "reason": result.reason and result.reason.value, "index": result.index}
    assert got == vector["expected"], result.detail
    assert result.attribution is not None  # the session's check held: the verdict names its last receipt


def test_the_policy_vectors_both_allow_and_refuse() -> None:
    expected = {json.loads(c.read_text())["expected"]["verdict"] for c in (SESSIONS / "policy").glob("*.json")}
    assert expected == {"ACCEPT", "REJECT"}


def test_every_session_reason_has_a_vector() -> None:
    covered = {json.loads(c.read_text())["expected"]["reason"] for c in CASES}
    assert {r.value for r in SESSION_REASONS} <= covered
    assert len(list((SESSIONS / "invalid").glob("*.json"))) == len(SESSION_REASONS)
    state = {json.loads(c.read_text())["expected"]["reason"] for c in STATE_CASES}
    assert state >= {"NONCE_REPLAYED", "FANOUT_EXCEEDED"}
