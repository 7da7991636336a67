"""The session parser's fast path (``countersign.sessions._Receipts``) gives exactly the strict parse's
result, for valid sessions and for every mutation of a receipt: the same evidence, or the same error."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.errors import MalformedError
from countersign.records import Construction, Path, StreamUnit, parse_json
from countersign.samples import SampleMesh
from countersign.sessions import (
    MAX_SESSION_INPUT_BYTES,
    SessionEvidence,
    check_session_evidence,
    check_session_evidence_bytes,
)

pytestmark = pytest.mark.offline

NOW_MS = 1_780_000_000_000
MESH = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"session-fast-paths")
_TRUNK = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW_MS)
AGENT = Path(_TRUNK.envelopes[:2])
OUTPUTS = [b"turn %d" % i for i in range(4)]
SESSIONS = {
    "turns": SessionEvidence(AGENT, MESH.issue_session(AGENT, OUTPUTS, now_ms=NOW_MS, closed=True)),
    "stream": SessionEvidence(
        AGENT, MESH.issue_session(AGENT, OUTPUTS, now_ms=NOW_MS, stream=(StreamUnit.BYTES, 8), closed=True)
    ),
}
RECORD_FIELDS = sorted(SESSIONS["turns"].receipts[0].record_json)
# Values that are near misses of the real ones: other JSON types, the bool/int confusion, bounds.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 2**53, 2**53 - 1, "", "x", "deployer-a", "deployer-b", [], {}, [None],
    {"instance": "agent-1-deployer-b", "system": "system-1"}, {"allowed_children": None, "max_depth": None},
    {"allowed_children": None, "max_depth": True}, {"allowed_children": [], "max_depth": 0},
    "signed_dag", "linked_list", "branch", "new", "a" * 32, "A" * 32,
]  # fmt: skip


def strict(data: bytes) -> SessionEvidence | str:
    """The strict parse (``from_json`` never takes the fast path), or its error."""
    try:
        return SessionEvidence.from_json(parse_json(data, MAX_SESSION_INPUT_BYTES))
    except MalformedError as exc:
        return f"{type(exc).__name__}: {exc} @ {exc.index}"


def fast(data: bytes) -> SessionEvidence | str:
    try:
        return SessionEvidence.from_bytes(data)
    except MalformedError as exc:
        return f"{type(exc).__name__}: {exc} @ {exc.index}"


def same(data: bytes) -> None:
    a, b = strict(data), fast(data)
    assert type(a) is type(b)
    if isinstance(a, SessionEvidence):
        assert isinstance(b, SessionEvidence)
        assert a == b and a.to_bytes() == b.to_bytes()
        for x, y in zip(a.receipts, b.receipts, strict=True):
            assert x.record_json == y.record_json and x.record_bytes() == y.record_bytes()
        verdicts = [
            check_session_evidence(s, registry=MESH.registry, now_ms=NOW_MS, require_closed=True).result for s in (a, b)
        ]
        assert verdicts[0] == verdicts[1]
        assert (
            check_session_evidence_bytes(data, registry=MESH.registry, now_ms=NOW_MS, require_closed=True).result
            == (verdicts[0])
        )
    else:
        assert a == b


def test_valid_sessions_parse_the_same_and_verify() -> None:
    for session in SESSIONS.values():
        same(session.to_bytes())
        assert check_session_evidence_bytes(session.to_bytes(), registry=MESH.registry, now_ms=NOW_MS).result


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(sorted(SESSIONS)),
    at=st.integers(1, len(OUTPUTS)),
    where=st.sampled_from(["record", "envelope", "output", "agent", "policy"]),
    field=st.sampled_from([*RECORD_FIELDS, "key_id", "sig", "record", "sha256", "seq", "prev", "session", "extra"]),
    value=st.one_of(st.sampled_from(ODD_VALUES), st.integers(-3, 2**54), st.text(max_size=6)),
    delete=st.booleans(),
)
def test_a_mutated_receipt_parses_as_the_strict_parser_says(
    kind: str, at: int, where: str, field: str, value: Any, delete: bool
) -> None:
    session = json.loads(SESSIONS[kind].to_bytes())
    receipt = session["receipts"][at]
    record = receipt["record"]
    target = {
        "record": record,
        "envelope": receipt,
        "output": record["output"],
        "agent": record["agent"],
        "policy": record["policy"],
    }[where]
    if delete:
        target.pop(field, None)
    else:
        target[field] = copy.deepcopy(value)
    same(json.dumps(session).encode())


@settings(max_examples=100, deadline=None)
@given(at=st.integers(1, len(OUTPUTS)), donor=st.integers(0, len(OUTPUTS)), field=st.sampled_from(RECORD_FIELDS))
def test_a_field_taken_from_another_receipt_parses_as_the_strict_parser_says(at: int, donor: int, field: str) -> None:
    session = json.loads(SESSIONS["turns"].to_bytes())
    session["receipts"][at]["record"][field] = session["receipts"][donor]["record"][field]
    same(json.dumps(session).encode())


def test_the_bool_that_equals_an_integer_is_refused_on_both_paths() -> None:
    for field in ("depth", "max_children", "v"):
        session = json.loads(SESSIONS["turns"].to_bytes())
        first = session["receipts"][0]["record"][field]
        if first not in (0, 1):
            session["receipts"][0]["record"][field] = session["receipts"][2]["record"][field] = 1
        session["receipts"][2]["record"][field] = bool(session["receipts"][0]["record"][field])
        data = json.dumps(session).encode()
        same(data)
        assert isinstance(fast(data), str)
