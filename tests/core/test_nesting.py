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
