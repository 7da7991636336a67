"""Parsing: valid paths round-trip unchanged; every malformed input is MALFORMED, never an exception."""

from __future__ import annotations

import json
import re

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

from countersign import records
from countersign.errors import MalformedError
from countersign.reasons import Reason, Verdict
from countersign.records import MAX_INPUT_BYTES, Construction, NodeRecord, Path, parse_json
from countersign.state import ChildEdge, InMemoryState, LeafNonce, new_child_edge, new_leaf_nonce
from countersign.verify import Mode, VerifierPolicy, verify_path_bytes

from .strategies import MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

POLICY = VerifierPolicy.unsafe_allow_baselines()


def verdict(data: bytes, output: bytes = b"") -> tuple[Verdict, Reason | None]:
    result = verify_path_bytes(
        data, output, registry=MESH.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS, policy=POLICY
    )
    return result.verdict, result.reason


@given(valid_paths())
def test_valid_paths_round_trip_unchanged(case: tuple[Path, bytes]) -> None:
    path, _ = case
    data = path.to_bytes()
    parsed = Path.from_bytes(data)
    assert parsed == path
    assert parsed.to_bytes() == data
    assert Path.from_json(json.loads(data)).to_json() == path.to_json()


@given(valid_paths())
def test_valid_paths_are_accepted(case: tuple[Path, bytes]) -> None:
    path, output = case
    assert verdict(path.to_bytes(), output) == (Verdict.ACCEPT, None)


def _sample() -> bytes:
    from countersign.records import Construction

    return MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b"], b"o", now_ms=NOW_MS).to_bytes()


SAMPLE = _sample()
SAMPLE_TEXT = SAMPLE.decode()

MALFORMED_INPUTS = {
    "empty": b"",
    "whitespace": b"   ",
    "truncated": SAMPLE[: len(SAMPLE) // 3],
    "not json": b"path",
    "json null": b"null",
    "json list": b"[]",
    "string": b'"path"',
    "empty object": b"{}",
    "no envelopes": b'{"v":1,"envelopes":[]}',
    "envelopes not a list": b'{"v":1,"envelopes":{}}',
    "unknown path field": SAMPLE[:-1] + b',"x":1}',
    "missing field": SAMPLE_TEXT.replace('"max_children":4,', "", 1).encode(),
    "unknown record field": SAMPLE_TEXT.replace('"depth":0,', '"depth":0,"x":1,', 1).encode(),
    "wrong type depth": SAMPLE_TEXT.replace('"depth":0,', '"depth":"0",', 1).encode(),
    "bool as int": SAMPLE_TEXT.replace('"depth":0,', '"depth":false,', 1).encode(),
    "negative depth": SAMPLE_TEXT.replace('"depth":0,', '"depth":-1,', 1).encode(),
    "depth too large": SAMPLE_TEXT.replace('"depth":0,', '"depth":64,', 1).encode(),
    "huge integer": SAMPLE_TEXT.replace('"depth":0,', '"depth":' + "9" * 5000 + ",", 1).encode(),
    "float": SAMPLE_TEXT.replace('"depth":0,', '"depth":0.5,', 1).encode(),
    "exponent": SAMPLE_TEXT.replace('"depth":0,', '"depth":1e0,', 1).encode(),
    "NaN": SAMPLE_TEXT.replace('"depth":0,', '"depth":NaN,', 1).encode(),
    "Infinity": SAMPLE_TEXT.replace('"depth":0,', '"depth":Infinity,', 1).encode(),
    "duplicate key": SAMPLE_TEXT.replace('"depth":0,', '"depth":0,"depth":0,', 1).encode(),
    "non-UTF-8": SAMPLE.replace(b"agent-0", b"agent-\xc3\x28"),
    "UTF-16": SAMPLE_TEXT.encode("utf-16"),
    "lone surrogate escape": SAMPLE_TEXT.replace("agent-0", "agent-\\ud800", 1).encode(),
    "space in identifier": SAMPLE_TEXT.replace("agent-0", "agent 0", 1).encode(),
    "deep nesting": b"[" * 50_000 + b"]" * 50_000,
    "deep objects": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "oversized": b" " * (MAX_INPUT_BYTES + 1),
    "65 records": json.dumps({"v": 1, "envelopes": [json.loads(SAMPLE)["envelopes"][0]] * 65}).encode(),
    "cosigs on root": SAMPLE_TEXT.replace('"cosigs":[]', '"cosigs":[1,2]', 1).encode(),
    "one co-signature": SAMPLE_TEXT.replace('"cosigs":[{', '"cosigs":[{"role":"child"},{', 1).encode(),
    "seq without prev": SAMPLE_TEXT.replace('"prev":null,"seq":0', '"prev":null,"seq":3', 1).encode(),
    "expiry before creation": re.sub(r'"expires_ms":\d+', '"expires_ms":0', SAMPLE_TEXT, count=1).encode(),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_INPUTS))
def test_malformed_input_is_rejected_as_malformed(name: str) -> None:
    assert verdict(MALFORMED_INPUTS[name]) == (Verdict.REJECT, Reason.MALFORMED)


def test_unsupported_version_is_its_own_reason() -> None:
    data = SAMPLE_TEXT.replace('{"envelopes":', '{"envelopes":', 1).replace(',"v":1}', ',"v":2}')
    assert verdict(data.encode())[1] is Reason.UNSUPPORTED_VERSION


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise_and_never_accept(data: bytes) -> None:
    assert verdict(data)[0] is Verdict.REJECT


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)
    )
)
def test_arbitrary_json_never_raises_and_never_accepts(value: object) -> None:
    assert verdict(json.dumps(value).encode())[0] is Verdict.REJECT


@pytest.mark.parametrize("data", [b"\xff", b"[1.0]", b'{"a":1,"a":2}', b"[NaN]"])
def test_parse_json_raises_only_malformed_error(data: bytes) -> None:
    with pytest.raises(MalformedError):
        parse_json(data)


@given(valid_paths())
def test_an_envelope_encodes_its_record_once_and_the_bytes_are_what_a_fresh_parse_encodes(case: tuple) -> None:
    """The record's canonical bytes are kept per envelope (sealing hands them on to the signed
    envelope): whatever was cached equals RFC 8785 over a freshly parsed copy, and the cache takes no
    part in equality."""
    path, _ = case
    fresh = Path.from_bytes(path.to_bytes())  # new envelopes, nothing cached
    for kept, parsed in zip(path.envelopes, fresh.envelopes, strict=True):
        assert kept.record_bytes() == parsed.record_bytes() == rfc8785.dumps(parsed.record_json)
        assert kept == parsed and hash(kept) == hash(parsed)
        assert kept.digest() == parsed.digest()


def test_digest_and_serialisation_reuse_the_encoded_record(monkeypatch: pytest.MonkeyPatch) -> None:
    path = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-c"], b"o", now_ms=NOW_MS)
    parsed = Path.parse_bytes_reference(path.to_bytes())  # keeps no canonical bytes: each is encoded once
    encoded: list[object] = []
    real = NodeRecord.canonical_bytes

    def counting(record: NodeRecord) -> bytes:
        encoded.append(record)
        return real(record)

    monkeypatch.setattr(NodeRecord, "canonical_bytes", counting)
    for _ in range(3):
        parsed.to_bytes()
        for envelope in parsed.envelopes:
            envelope.digest()
            envelope.record_bytes()
    assert len(encoded) == len(parsed.envelopes)  # once per envelope, however often asked
    signed = parsed.leaf.with_sig(parsed.leaf.sig)
    assert signed.record_bytes() == parsed.leaf.record_bytes() and len(encoded) == len(parsed.envelopes)
    if records._compiled_path is not None:  # the compiled decoder hands each record's bytes over with it
        encoded.clear()
        for envelope in Path.from_bytes(path.to_bytes()).envelopes:
            envelope.digest()
        assert encoded == []


@given(valid_paths())
def test_the_fast_constructors_make_what_the_classes_make(case: tuple) -> None:
    """new_record, new_output, new_cosignature, new_agent, new_envelope, new_leaf_nonce and new_child_edge skip the
    generated ``__init__``: every slot is set, and the result is of the class and equals (and hashes as)
    the object the class builds from the same values."""
    path, _ = case
    for envelope in path.envelopes:
        record = envelope.record
        fields = [getattr(record, name) for name in NodeRecord.__slots__ if name != "v"]
        pairs = [(records.new_record(*fields), NodeRecord(*fields))]  # type: ignore[arg-type]
        if record.output is not None:
            values = [getattr(record.output, name) for name in records.OutputReceipt.__slots__]
            pairs.append((records.new_output(*values), records.OutputReceipt(*values)))
        for cosig in record.cosigs:
            pairs.append((records.new_cosignature(cosig.role, cosig.deployer, cosig.key_id, cosig.sig), cosig))
        pairs.append((records.new_agent(record.agent.instance, record.agent.system), record.agent))
        leaf = (f"{record.deployer}:{record.nonce}", record.expires_ms, record.depth, record.nonce[:8])
        pairs.append((new_leaf_nonce(*leaf), LeafNonce(*leaf)))
        edge = (envelope.digest(), f"{record.deployer}:{record.nonce}", record.max_children, record.expires_ms, 1)
        pairs.append((new_child_edge(*edge), ChildEdge(*edge)))
        fresh = records.new_envelope(record, envelope.key_id, envelope.sig, envelope.record_bytes())
        pairs.append((fresh, records.Envelope(record, envelope.key_id, envelope.sig)))
        for made, built in pairs:
            assert type(made) is type(built)
            assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
            slots = type(built).__slots__
            assert all(hasattr(made, name) for name in slots)  # every slot set, the private caches too
            assert all(getattr(made, name) == getattr(built, name) for name in slots if not name.startswith("_"))
        assert fresh.digest() == envelope.digest() and fresh.record_json == envelope.record_json
