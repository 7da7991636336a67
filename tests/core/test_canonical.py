"""The fast canonical encoder is byte-identical to the rfc8785 library on everything the protocol signs."""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from countersign.canonical import (
    SAFE_INTEGER_MAX,
    b64url_decode,
    b64url_encode,
    canonicalize,
    canonicalize_validated,
    pae,
)
from countersign.constructions import EdgeProposal, edge_manifest
from countersign.errors import MalformedError
from countersign.records import Construction

from .strategies import MESH, valid_paths

pytestmark = pytest.mark.offline

# The protocol's data model: objects with ASCII keys, safe integers, any Unicode text without lone
# surrogates (free text is not in records today, but registry statements may carry it), no floats.
text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
keys = st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=12)
scalars = st.none() | st.booleans() | st.integers(-SAFE_INTEGER_MAX, SAFE_INTEGER_MAX) | text
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(keys, children, max_size=6),
    max_leaves=30,
)


@given(json_values)
def test_fast_encoder_equals_rfc8785_on_the_data_model(value: object) -> None:
    assert canonicalize_validated(value) == rfc8785.dumps(value)


@given(valid_paths())
def test_fast_encoder_equals_rfc8785_on_records_envelopes_and_paths(case: tuple) -> None:
    path, _ = case
    for envelope in path.envelopes:
        assert envelope.record_bytes() == rfc8785.dumps(envelope.record_json)
        assert envelope.canonical_bytes() == rfc8785.dumps(envelope.to_json())
    assert path.to_bytes() == rfc8785.dumps(path.to_json())


@given(valid_paths(constructions=st.just(Construction.SIGNED_DAG)))
def test_composed_edge_manifest_equals_rfc8785_of_the_manifest_object(case: tuple) -> None:
    path, _ = case
    for parent, child in zip(path.envelopes, path.envelopes[1:], strict=False):
        cosigners = EdgeProposal(parent, child.record, MESH.signers[parent.record.deployer].key_id).cosigners()
        reference = rfc8785.dumps(
            {
                "domain": "countersign/edge-manifest/v1",
                "construction": "signed-dag",
                "parent_digest": parent.digest(),
                "child": {**child.record_json, "cosigs": []},
                "cosigners": [c.cosigner_json() for c in cosigners],
            }
        )
        assert edge_manifest(parent.digest(), child.record_bytes(), cosigners) == reference


def test_python_sort_differs_from_jcs_beyond_the_data_model() -> None:
    """Why the fast encoder is restricted to ASCII keys: JCS sorts by UTF-16 code units."""
    value = {"\U0001f600": 1, "\ufb01": 2}
    assert canonicalize_validated(value) != rfc8785.dumps(value)


@pytest.mark.parametrize("value", [2**53, -(2**53), "\ud800", {1: 2}, float("nan")])
def test_reference_encoder_refuses_what_jcs_cannot_represent(value: object) -> None:
    with pytest.raises(MalformedError):
        canonicalize(value)


def test_pae_matches_the_dsse_specification_example() -> None:
    assert (
        pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_pae_separates_payload_types() -> None:
    assert pae("a", b"b c") != pae("a b", b"c")


@given(st.binary(min_size=0, max_size=80))
def test_base64url_round_trips_strictly(data: bytes) -> None:
    text_form = b64url_encode(data)
    assert "=" not in text_form
    assert b64url_decode(text_form, len(data)) == data


@pytest.mark.parametrize("bad", ["AAAB", "AA==", "AA A", "AA+/", "A"])
def test_base64url_rejects_non_canonical_or_foreign_alphabets(bad: str) -> None:
    with pytest.raises(MalformedError):
        b64url_decode(bad, 2)


def test_json_dumps_escapes_like_rfc8785_for_control_characters() -> None:
    value = {"k": "".join(chr(c) for c in range(0x20)) + '"\\\x7f\u2028'}
    assert canonicalize_validated(value) == rfc8785.dumps(value)
    assert json.loads(canonicalize_validated(value)) == value
