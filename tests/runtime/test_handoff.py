"""The Delegation handoff string: round trips, strict parsing with one typed error, the size bound."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.canonical import canonicalize
from countersign.client import Delegation, ErrorCode, Grant, HandoffError, ServiceError
from countersign.handoff import HANDOFF_PREFIX, MAX_HANDOFF_CHARS
from countersign.records import Construction, Path
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

NOW = 1_767_225_600_000
SAMPLE = SampleMesh.create(["deployer-a", "deployer-b", "deployer-c"], seed=b"handoff")


def parent_path(depth: int = 1) -> Path:
    route = ["deployer-a", "deployer-c"] * depth
    return SAMPLE.issue_path(Construction.SIGNED_DAG, route[:depth], b"unused", now_ms=NOW)


def delegation(parent: Path | None = None, **grant: object) -> Delegation:
    parent = parent or parent_path()
    fields = {
        "grant_id": "0f" * 16, "parent_digest": parent.leaf.digest(), "parent_key_id": parent.leaf.key_id,
        "child_deployer": "deployer-b", "expires_ms": NOW + 60_000, **grant,
    }  # fmt: skip
    return Delegation(parent, Grant(**fields), "127.0.0.1:7401")  # type: ignore[arg-type]


def encode(value: object) -> str:
    """Canonical JSON (the standard library's, which also writes what RFC 8785 cannot hold)."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return HANDOFF_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def refused(text: object) -> HandoffError:
    with pytest.raises(HandoffError) as caught:
        Delegation.from_string(text)  # type: ignore[arg-type]
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT
    return caught.value


def test_a_handoff_round_trips_and_is_compact() -> None:
    original = delegation()
    text = original.to_string()
    assert text.startswith("cs1.") and str(original) == text
    assert Delegation.from_string(text) == original
    assert len(text) < 2 * len(original.parent.to_bytes())  # base64 of the path plus a few fields
    assert original.child_deployer == "deployer-b" and original.parent_deployer == "deployer-a"
    assert not original.expired(NOW) and original.expired(NOW + 60_000)


def test_it_carries_nothing_but_the_named_fields() -> None:
    body = json.loads(base64.urlsafe_b64decode(delegation().to_string()[4:] + "=="))
    assert set(body) == {"v", "parent_path", "grant_id", "parent_digest", "parent_key_id", "parent_signer",
                         "child_deployer", "expires_ms"}  # fmt: skip
    assert "seed" not in json.dumps(body) and "private" not in json.dumps(body)


def test_a_handoff_error_is_a_service_error_with_a_closed_code() -> None:
    error = refused("cs1.!!")
    assert isinstance(error, ServiceError) and "malformed delegation handoff" in str(error)


@pytest.mark.parametrize(
    "text",
    [
        "", "cs1.", "cs2." + delegation().to_string()[4:], delegation().to_string()[4:], "cs1.a", "cs1.ab=c",
        "cs1.ab+/", delegation().to_string() + "=", delegation().to_string()[:-3], 12,
    ],
    ids=["empty", "prefix only", "other version", "no prefix", "one char", "padding", "not url-safe",
         "padded", "truncated", "not a string"],
)  # fmt: skip
def test_strings_that_are_not_handoffs_are_refused(text: object) -> None:
    refused(text)


def test_a_non_canonical_encoding_of_the_same_bytes_is_refused() -> None:
    text = delegation().to_string()
    # The last character carries unused bits: a different character there decodes to the same bytes.
    body = text[4:]
    decoded = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    assert len(body) % 4 != 0, "the sample must have unused bits"
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for other in alphabet:
        candidate = body[:-1] + other
        try:
            same = base64.urlsafe_b64decode(candidate + "=" * (-len(candidate) % 4)) == decoded
        except ValueError:
            continue
        if same and candidate != body:
            refused(HANDOFF_PREFIX + candidate)
            return
    pytest.fail("no non-canonical twin found")


def test_json_out_of_canonical_order_is_refused() -> None:
    body = delegation().to_json()
    shuffled = json.dumps(dict(reversed(list(body.items()))), separators=(",", ":")).encode()
    assert "canonical" in str(refused(HANDOFF_PREFIX + base64.urlsafe_b64encode(shuffled).rstrip(b"=").decode()))


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"extra": 1}, "unknown fields"),
        ({"v": 2}, "version"),
        ({"v": True}, "version"),
        ({"grant_id": ""}, "grant_id"),
        ({"parent_digest": "sha256:" + "0" * 64}, "parent_digest is not the digest"),
        ({"parent_key_id": "ed25519:xyz"}, "parent_key_id"),
        ({"child_deployer": "Deployer B"}, "child_deployer"),
        ({"child_deployer": "deployer-a"}, "crosses deployers"),
        ({"parent_signer": "https://signer:7401/"}, "parent_signer"),
        ({"parent_signer": "127.0.0.1:99999"}, "port"),
        ({"expires_ms": 0}, "expires_ms"),
        ({"expires_ms": 2**60}, "expires_ms"),
        ({"parent_path": {"v": 1, "envelopes": []}}, "parent_path"),
    ],
)
def test_fields_are_checked_strictly(change: dict[str, object], needle: str) -> None:
    body = {**delegation().to_json(), **change}
    assert needle in str(refused(encode(body)))


def test_a_missing_field_is_refused() -> None:
    body = delegation().to_json()
    del body["parent_signer"]
    assert "missing fields ['parent_signer']" in str(refused(encode(body)))


def test_duplicate_keys_and_floats_are_refused() -> None:
    text = canonicalize(delegation().to_json()).decode()
    duplicated = text.replace('{"child_deployer"', '{"child_deployer":"deployer-b","child_deployer"', 1).encode()
    refused(HANDOFF_PREFIX + base64.urlsafe_b64encode(duplicated).rstrip(b"=").decode())
    floated = text.replace(f'"expires_ms":{NOW + 60_000}', f'"expires_ms":{NOW + 60_000}.0').encode()
    assert "float" in str(refused(HANDOFF_PREFIX + base64.urlsafe_b64encode(floated).rstrip(b"=").decode()))


def test_the_size_is_bounded_before_decoding() -> None:
    assert "longer than" in str(refused(HANDOFF_PREFIX + "A" * MAX_HANDOFF_CHARS))
    deep = parent_path(depth=60)
    with pytest.raises(HandoffError, match="over"):
        delegation(deep, child_deployer="deployer-b").to_string()


def test_building_a_delegation_checks_it() -> None:
    with pytest.raises(HandoffError, match="digest"):
        delegation(parent_digest="sha256:" + "1" * 64)


@settings(max_examples=200, deadline=None)
@given(position=st.integers(min_value=4), replacement=st.characters(codec="ascii"))
def test_any_changed_character_is_refused_or_reads_as_another_handoff(position: int, replacement: str) -> None:
    original = delegation()
    text = original.to_string()
    index = 4 + position % (len(text) - 4)
    mutated = text[:index] + replacement + text[index + 1 :]
    try:
        parsed = Delegation.from_string(mutated)
    except HandoffError as error:
        code = error.code
    else:
        assert mutated == text or parsed != original
        return
    assert code is ErrorCode.INVALID_ARGUMENT


@settings(max_examples=50, deadline=None)
@given(
    grant_id=st.from_regex(r"[a-z0-9]{1,64}", fullmatch=True),
    expires=st.integers(min_value=1, max_value=2**53 - 1),
    port=st.integers(min_value=1, max_value=65_535),
    depth=st.integers(min_value=1, max_value=4),
)
def test_every_well_formed_delegation_round_trips(grant_id: str, expires: int, port: int, depth: int) -> None:
    parent = parent_path(depth)
    child = "deployer-b"
    original = Delegation(
        parent, Grant(grant_id, parent.leaf.digest(), parent.leaf.key_id, child, expires), f"signer.example:{port}"
    )
    assert Delegation.from_string(original.to_string()) == original
