"""The fast canonical encoder is byte-identical to the rfc8785 library on everything the protocol signs."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.canonical import (
    SAFE_INTEGER_MAX,
    b64url_decode,
    b64url_decode_validated,
    b64url_encode,
    canonicalize,
    canonicalize_validated,
    pae,
)
from countersign.constructions import EdgeProposal, edge_manifest
from countersign.errors import MalformedError
from countersign.records import (
    AgentRef,
    BindingScope,
    Construction,
    CoSignature,
    CoSignerRole,
    LifecycleEvent,
    NodeRecord,
    OutputReceipt,
    Policy,
    SessionClose,
    StreamChunk,
    StreamUnit,
)

from .strategies import IDENTIFIER_ALPHABET, MESH, NOW_MS, valid_paths

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


# Strings of every kind: the schema's (they encode as themselves), and any text without lone
# surrogates (quotes, backslashes, controls, non-ASCII: the template hands those to the encoder).
schema_text = st.text(alphabet=IDENTIFIER_ALPHABET + " ", min_size=1, max_size=24)
# Mostly the schema's characters, now and then one a JSON string must escape (or may not hold as is).
nearly_schema_text = st.text(alphabet=IDENTIFIER_ALPHABET + ' "\\\x00\x1f\x7f\u00e9\u2028', min_size=1, max_size=24)
text_of_any_kind = schema_text | st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
naturals = st.integers(0, SAFE_INTEGER_MAX)


@st.composite
def receipts(draw: st.DrawFn, any_text: st.SearchStrategy[str]) -> OutputReceipt:
    seq = draw(naturals)
    prev = draw(st.none() | any_text)
    return OutputReceipt(
        draw(any_text),
        draw(st.sampled_from(list(BindingScope))),
        draw(any_text),
        seq,
        prev,
        draw(st.none() | st.builds(StreamChunk, st.sampled_from(list(StreamUnit)), naturals, naturals)),
        draw(st.none() | st.builds(SessionClose, naturals, st.none() | any_text)),
    )


@st.composite
def node_records(draw: st.DrawFn) -> NodeRecord:
    """Records of every shape, valid or not under the schema: the template is about encoding only.
    Half hold only the schema's strings (the template's bytes), a quarter now and then a character
    that must not go through the template, the rest any text."""
    any_text = draw(st.sampled_from([schema_text, schema_text, nearly_schema_text, text_of_any_kind]))
    cosignature = st.builds(CoSignature, st.sampled_from(list(CoSignerRole)), any_text, any_text, any_text)
    return NodeRecord(
        construction=draw(st.sampled_from(list(Construction))),
        deployer=draw(any_text),
        key_id=draw(any_text),
        agent=AgentRef(draw(any_text), draw(any_text)),
        created_ms=draw(naturals),
        expires_ms=draw(naturals),
        parent=draw(st.none() | any_text),
        depth=draw(naturals),
        nonce=draw(any_text),
        max_children=draw(naturals),
        event=draw(st.sampled_from(list(LifecycleEvent))),
        policy=Policy(draw(st.none() | st.lists(any_text, max_size=3).map(tuple)), draw(st.none() | naturals)),
        output=draw(st.none() | receipts(any_text)),
        cosigs=tuple(draw(st.lists(cosignature, max_size=2))),
    )


@settings(max_examples=400)
@given(node_records())
def test_the_record_template_equals_rfc8785_over_every_shape_of_record(record: NodeRecord) -> None:
    assert record.canonical_bytes() == rfc8785.dumps(record.to_json())


@pytest.mark.parametrize(
    "change",
    [{"created_ms": True}, {"depth": 1.5}, {"max_children": "4"}, {"deployer": 7}, {"policy": Policy((), 2.0)}],  # type: ignore[arg-type]
)
def test_a_record_of_the_wrong_types_is_encoded_as_the_encoder_would(change: dict[str, object]) -> None:
    """Fields of the wrong type (only code that builds records by hand can make them) get the JSON
    encoder's bytes, never a template's guess: ``True`` is not ``1``, ``1.5`` is not ``1``."""
    path = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b"], b"o", now_ms=NOW_MS)
    record = dataclasses.replace(path.leaf.record, **change)  # type: ignore[arg-type]
    assert record.canonical_bytes() == canonicalize_validated(record.to_json())


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
    assert text_form == base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    assert "=" not in text_form
    assert b64url_decode(text_form, len(data)) == data
    # the verifier's decoder of pattern-checked text: base64's own urlsafe decode, by its C parts
    assert b64url_decode_validated(text_form) == base64.urlsafe_b64decode(text_form + "=" * (-len(text_form) % 4))


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40), st.binary(max_size=300))
def test_pae_is_the_dsse_encoding_for_any_payload_type(payload_type: str, payload: bytes) -> None:
    type_bytes = payload_type.encode("utf-8")
    expected = b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)
    assert pae(payload_type, payload) == expected
    assert pae(payload_type, payload) == expected  # the second time from the remembered prefix


@pytest.mark.parametrize("bad", ["AAAB", "AA==", "AA A", "AA+/", "A"])
def test_base64url_rejects_non_canonical_or_foreign_alphabets(bad: str) -> None:
    with pytest.raises(MalformedError):
        b64url_decode(bad, 2)


def test_json_dumps_escapes_like_rfc8785_for_control_characters() -> None:
    value = {"k": "".join(chr(c) for c in range(0x20)) + '"\\\x7f\u2028'}
    assert canonicalize_validated(value) == rfc8785.dumps(value)
    assert json.loads(canonicalize_validated(value)) == value
