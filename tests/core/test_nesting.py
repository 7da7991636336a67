"""The nesting limit (spec 2.1): input nested deeper than MAX_NESTING is MALFORMED at index null,
whatever else is wrong with it and however deep the caller's own stack is."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.errors import MalformedError
from countersign.records import MAX_NESTING, Construction, Path, nesting_exceeds
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

# Strings that try to confuse a bracket count: brackets, quotes and backslashes inside them.
tricky_text = st.text(alphabet='[]{}"\\ab', max_size=6)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


def nested(levels: int, inner: Any = 0) -> Any:
    value = inner
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


@settings(max_examples=400, deadline=None)
@given(json_values, st.integers(1, 12))
def test_the_measure_equals_the_depth_of_any_json(value: Any, limit: int) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, separators=(",", ":"))):
        assert nesting_exceeds(text.encode(), limit) == (depth(value) > limit), text


@pytest.mark.parametrize("levels", [MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 64])
def test_both_sides_of_the_limit(levels: int) -> None:
    value = nested(levels)
    assert depth(value) == levels
    assert nesting_exceeds(json.dumps(value).encode()) == (levels > MAX_NESTING)


def _valid_path_with_deep_agent(levels: int) -> bytes:
    """A valid path whose leaf agent's ``instance`` holds ``levels`` nested arrays."""
    mesh = SampleMesh.create(["d-a"])
    path = mesh.issue_path(Construction.SIGNED_DAG, ["d-a"], b"x", now_ms=1_780_000_000_000)
    value = json.loads(path.to_bytes())
    value["envelopes"][0]["record"]["agent"]["instance"] = "PLACEHOLDER"
    text = json.dumps(value).replace('"PLACEHOLDER"', "[" * levels + "0" + "]" * levels)
    return text.encode()


def _at_stack_depth(frames: int, call: Callable[[], Any]) -> Any:
    if frames == 0:
        return call()
    return _at_stack_depth(frames - 1, call)


@pytest.mark.parametrize("frames", [0, 50, 400])
@pytest.mark.parametrize("levels", [28, 29, 500, 990, 2_000])
def test_a_path_nested_too_deep_is_malformed_at_index_null_at_any_stack_depth(frames: int, levels: int) -> None:
    # path, envelopes, envelope, record and agent are five levels above the instance's value
    data = _valid_path_with_deep_agent(levels)
    total = 5 + levels
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3_000))
    try:
        with pytest.raises(MalformedError) as raised:
            _at_stack_depth(frames, lambda: Path.from_bytes(data))
    finally:
        sys.setrecursionlimit(limit)
    # At or under the limit the schema refuses the instance at its envelope; over it, index null.
    assert raised.value.index == (None if total > MAX_NESTING else 0), (total, str(raised.value))


# --- session evidence read from its parts (the command line's files) -----------------------------

SESSION_MESH = SampleMesh.create(["d-a"])
SESSION_AGENT = SESSION_MESH.issue_path(Construction.SIGNED_DAG, ["d-a"], b"", now_ms=1_780_000_000_000)
SESSION_AGENT = Path((SESSION_AGENT.envelopes[0],))
SESSION_RECEIPTS = SESSION_MESH.issue_session(SESSION_AGENT, [b"a", b"b", b"c"], now_ms=1_780_000_000_000, label="n")


def _read(parse: Callable[[], Any]) -> object:
    try:
        return parse()
    except MalformedError as exc:
        return (type(exc).__name__, exc.index, "nested deeper" in str(exc))


@settings(max_examples=150, deadline=None)
@given(st.integers(-1, len(SESSION_RECEIPTS) - 1), st.integers(0, 40), st.booleans(), st.integers(0, 300))
def test_session_parts_read_as_the_assembled_session_at_any_nesting_and_stack(
    part: int, levels: int, as_array: bool, frames: int
) -> None:
    """``session_from_parts`` (verify-session's files) gives what ``SessionEvidence.from_bytes`` gives
    the assembled evidence, for a value nested ``levels`` deep in the agent path (part -1) or a
    receipt, whatever the caller's stack."""
    from countersign.sessions import SessionEvidence, session_from_parts

    agent = json.loads(SESSION_AGENT.to_bytes())
    receipts = [json.loads(r.canonical_bytes()) for r in SESSION_RECEIPTS]
    target = agent["envelopes"][0] if part < 0 else receipts[part]
    target["record"]["agent"]["instance"] = "PLACEHOLDER"
    deep = "[" * levels + "0" + "]" * levels if levels else '"deep-enough"'

    def text(value: Any) -> bytes:
        return json.dumps(value).replace('"PLACEHOLDER"', deep).encode()

    agent_bytes, receipt_bytes = text(agent), [text(r) for r in receipts]
    whole = b'{"v":1,"agent":' + agent_bytes + b',"receipts":[' + b",".join(receipt_bytes) + b"]}"
    receipts_arg: bytes | list[bytes] = b"[" + b",".join(receipt_bytes) + b"]" if as_array else receipt_bytes
    expected = _read(lambda: SessionEvidence.from_bytes(whole))
    assert _at_stack_depth(frames, lambda: _read(lambda: session_from_parts(agent_bytes, receipts_arg))) == expected
    if levels == 0:
        assert isinstance(expected, SessionEvidence)
    elif 5 + levels + (part < 0) > MAX_NESTING:
        assert expected == ("MalformedError", None, True)
