"""What the reference decides where the spec's rules were silent (docs/spec.md section 10.1): each row
of that table, held here."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from countersign.errors import MalformedError
from countersign.reasons import Reason
from countersign.records import Construction, Path, UnsupportedVersionError, parse_json
from countersign.registry import KeyProblem, Registry
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

NOW = 1_780_000_000_000


def registry_json() -> dict[str, Any]:
    return SampleMesh.create(["d-a"]).registry.to_json()  # type: ignore[return-value]


def test_a_lone_surrogate_parses_and_the_schema_refuses_it_at_its_envelope() -> None:
    assert parse_json(b'"\\ud800"') == "\ud800"
    mesh = SampleMesh.create(["d-a"])
    text = mesh.issue_path(Construction.SIGNED_DAG, ["d-a"], b"x", now_ms=NOW).to_bytes().decode()
    instance = json.loads(text)["envelopes"][0]["record"]["agent"]["instance"]
    with pytest.raises(MalformedError) as raised:
        Path.from_bytes(text.replace(f'"{instance}"', '"\\ud800"', 1).encode())
    assert raised.value.index == 0


def test_the_digit_limit_does_not_count_the_sign() -> None:
    assert parse_json(b"-" + b"1" * 4300) < 0
    with pytest.raises(MalformedError) as raised:
        parse_json(b"1" * 4301)
    assert raised.value.index is None


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(extra=1),
        lambda r: r.pop("sequence"),
        lambda r: r["deployers"]["d-a"].update(extra=[]),
        lambda r: r["deployers"]["d-a"]["keys"][0].pop("revoked_ms"),
        lambda r: r["deployers"]["d-a"]["keys"][0].update(note="x"),
    ],
)
def test_registry_member_sets_are_exact(change: Any) -> None:
    value = registry_json()
    change(value)
    with pytest.raises(MalformedError):
        Registry.from_json(value)


def _key(value: dict[str, Any]) -> dict[str, Any]:
    return value["deployers"]["d-a"]["keys"][0]  # type: ignore[no-any-return]


def test_revoked_before_added_is_allowed_and_the_key_is_refused_at_any_time() -> None:
    value = registry_json()
    _key(value).update(added_ms=1_000, revoked_ms=10)
    registry = Registry.from_json(value)
    key_id = _key(value)["key_id"]
    for at in (0, 500, NOW):
        problem = registry.resolve("d-a", key_id, at)
        assert isinstance(problem, KeyProblem) and problem.reason is Reason.KEY_REVOKED


def test_retired_at_its_added_time_is_allowed_and_valid_for_no_instant() -> None:
    value = registry_json()
    _key(value).update(added_ms=1_000, retired_ms=1_000)
    registry = Registry.from_json(value)
    for at in (999, 1_000, 1_001):
        problem = registry.resolve("d-a", _key(value)["key_id"], at)
        assert isinstance(problem, KeyProblem) and problem.reason is Reason.KEY_NOT_VALID
    earlier = copy.deepcopy(value)
    _key(earlier).update(retired_ms=999)
    with pytest.raises(MalformedError, match="retired before it was added"):
        Registry.from_json(earlier)


def test_an_unsupported_registry_version_is_refused_not_read_as_version_1() -> None:
    value = registry_json()
    value["v"] = 2
    with pytest.raises(UnsupportedVersionError):
        Registry.from_json(value)
