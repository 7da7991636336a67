"""The committed session vectors (tests/vectors/sessions/) give the verdicts they name."""

from __future__ import annotations

import base64
import json
from pathlib import Path as FilePath

import pytest

from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.registry import Registry
from countersign.sessions import check_session_bytes
from countersign.verify import VerifierPolicy

pytestmark = pytest.mark.offline

SESSIONS = FilePath(__file__).parents[1] / "vectors" / "sessions"
CASES = [sorted((SESSIONS / kind).glob("*.json")) for kind in ("valid", "invalid", "policy")]
CASES = [case for cases in CASES for case in cases]
SESSION_REASONS = {r for r in Reason if r.value.startswith("SESSION_")}


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_session_vector_verdict(case: FilePath) -> None:
    vector = json.loads(case.read_text())
    outputs = [None if o is None else base64.b64decode(o) for o in vector["outputs_base64"]]
    check = check_session_bytes(
        json.dumps(vector["session"]).encode(),
        outputs,
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


def test_the_policy_vectors_both_allow_and_refuse() -> None:
    expected = {json.loads(c.read_text())["expected"]["verdict"] for c in (SESSIONS / "policy").glob("*.json")}
    assert expected == {"ACCEPT", "REJECT"}


def test_every_session_reason_has_a_vector() -> None:
    covered = {json.loads(c.read_text())["expected"]["reason"] for c in CASES}
    assert {r.value for r in SESSION_REASONS} <= covered
    assert len(list((SESSIONS / "invalid").glob("*.json"))) == len(SESSION_REASONS)
