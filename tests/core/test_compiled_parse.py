"""The compiled decoder (``countersign._compiled_parse``, ADR 0036) is held equal to the reference
parser: over valid paths and sessions, over mutated and damaged text, and over every vector, a path
or session evidence parses to the same value or fails with the same error, reason and index.

The property (:func:`agree`) is two-sided where it can be: besides giving the reference's answer, the
compiled decoder must accept every input the reference accepts unless a mutation only spelled a value
otherwise (a repeated key, ``-0``, an escape: those it leaves to the reference by design). So a rule
dropped from either parser, or one made stricter, breaks it; ``test_a_rule_dropped_from_either_parser
_breaks_the_property`` drops rules one at a time and checks that the corpus finds each.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path as FilePath
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from countersign import _compiled_parse, records, sessions
from countersign.errors import MalformedError
from countersign.records import Construction, Path, StreamUnit
from countersign.samples import SampleMesh
from countersign.sessions import MAX_SESSION_INPUT_BYTES, MAX_SESSION_RECEIPTS, SessionEvidence
from countersign.state import InMemoryState

from .strategies import (
    MESH,
    NOW_MS,
    STYLES,
    as_tree,
    damaged,
    mutated,
    mutation_corpus,
    near_misses,
    valid_paths,
    write_json,
)
from .test_vectors import _verify as vector_verdict

pytestmark = pytest.mark.offline

VECTORS = FilePath(__file__).parents[1] / "vectors"
SESSION_MESH = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"compiled-parse")
_TRUNK = SESSION_MESH.issue_path(
    Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW_MS
)
AGENT = Path(_TRUNK.envelopes[:2])
TEXTS = [b"turn %d" % i for i in range(3)]
SESSIONS = [
    SessionEvidence(AGENT, SESSION_MESH.issue_session(AGENT, TEXTS, now_ms=NOW_MS, closed=True, label="turns")),
    SessionEvidence(AGENT, SESSION_MESH.issue_session(AGENT, TEXTS, now_ms=NOW_MS, label="open")),
    SessionEvidence(
        AGENT,
        SESSION_MESH.issue_session(
            AGENT, TEXTS, now_ms=NOW_MS, stream=(StreamUnit.BYTES, 4), closed=True, label="stream"
        ),
    ),
]
PATHS = [
    MESH.issue_path(construction, ["deployer-a", "deployer-b", "deployer-b", "deployer-c"], b"o", now_ms=NOW_MS)
    for construction in Construction
]


def compiled_path(data: bytes) -> Path | None:
    return _compiled_parse.path_from_bytes(data)


def compiled_session(data: bytes) -> SessionEvidence | None:
    parsed = _compiled_parse.session_from_bytes(data, MAX_SESSION_INPUT_BYTES, MAX_SESSION_RECEIPTS)
    return None if parsed is None else SessionEvidence(*parsed)


def outcome(parse: Callable[[bytes], Any], data: bytes) -> Any:
    """What a parse makes of ``data``: its value with every canonical byte it carries, or its error."""
    try:
        value = parse(data)
    except MalformedError as exc:
        return (type(exc).__name__, str(exc), exc.index)
    envelopes = value.envelopes if isinstance(value, Path) else (*value.agent.envelopes, *value.receipts)
    return (value, value.to_bytes(), [(e.record_bytes(), e.digest(), e.record_json) for e in envelopes])


def agree(data: bytes, respelled: bool, kind: str = "path") -> None:
    """The property: the parse used (compiled first) gives the reference's answer, and the compiled
    decoder accepts whatever the reference accepts, but for inputs that only spell a value otherwise."""
    public, reference, compiled = (
        (Path.from_bytes, Path.parse_bytes_reference, compiled_path)
        if kind == "path"
        else (SessionEvidence.from_bytes, SessionEvidence.parse_bytes_reference, compiled_session)
    )
    expected = outcome(reference, data)
    assert outcome(public, data) == expected
    fast = compiled(data)
    if fast is not None:
        assert outcome(lambda _: fast, data) == expected
    elif not respelled:
        assert isinstance(expected[0], str), "the reference accepts what the compiled decoder declined"


# --- valid input ------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(valid_paths(), st.sampled_from(range(4)))
def test_a_valid_path_is_read_by_the_compiled_decoder_with_the_reference_value(case: tuple, style: int) -> None:
    path, _ = case
    data = write_json(as_tree(path.to_json()), STYLES[style])  # canonical, or with whitespace and any key order
    parsed = compiled_path(data)
    assert parsed is not None
    assert outcome(lambda _: parsed, data) == outcome(Path.parse_bytes_reference, data)
    for envelope in parsed.envelopes:  # msgspec's encoding of the struct is RFC 8785 of the record
        assert envelope.record_bytes() == rfc8785.dumps(envelope.record_json) == envelope.record.canonical_bytes()


def test_valid_sessions_with_streams_and_close_receipts_are_read_by_the_compiled_decoder() -> None:
    for session in SESSIONS:
        for data in (session.to_bytes(), json.dumps(session.to_json(), indent=1).encode()):
            parsed = compiled_session(data)
            assert parsed is not None and parsed == session
            agree(data, respelled=False, kind="session")
            for receipt in parsed.receipts:
                assert receipt.record_bytes() == rfc8785.dumps(receipt.record_json)


def test_canonical_lengths_are_those_of_the_composed_bytes() -> None:
    """The length check's frames: Path.to_bytes and SessionEvidence.to_bytes, exactly."""
    for path in PATHS:
        data = path.to_bytes()
        assert _compiled_parse._canonical_length(data, len(data))
        _, size = _compiled_parse._envelopes(
            _compiled_parse._DECODE_PATH(data).envelopes, None, _compiled_parse._Strings()
        )
        assert _compiled_parse._PATH_FRAME + size == len(data)
    for session in SESSIONS:
        data = session.to_bytes()
        value = _compiled_parse._DECODE_SESSION(data)
        _, agent_size = _compiled_parse._envelopes(value.agent.envelopes, None, _compiled_parse._Strings())
        _, receipts_size = _compiled_parse._receipts(value.receipts, _compiled_parse._Strings())
        assert _compiled_parse._SESSION_FRAME + _compiled_parse._PATH_FRAME + agent_size + receipts_size == len(data)


# --- mutated and damaged input ----------------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mutated_path_parses_as_the_reference_says(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS))
    text, respelled = data.draw(mutated(path.to_json()))
    agree(text, respelled)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_session_evidence_parses_as_the_reference_says(data: st.DataObject) -> None:
    session = data.draw(st.sampled_from(SESSIONS))
    text, respelled = data.draw(mutated(session.to_json()))
    agree(text, respelled, kind="session")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_bytes_parse_as_the_reference_says(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["path", "session"]))
    source = data.draw(st.sampled_from(PATHS if kind == "path" else SESSIONS)).to_bytes()
    agree(data.draw(damaged(source)), respelled=True, kind=kind)


def _vector_inputs() -> Iterator[tuple[str, bytes, str]]:
    for case in sorted((VECTORS / "valid").glob("*.json")) + sorted((VECTORS / "invalid").glob("*.json")):
        presentation = json.loads(case.read_text())["presentation"]
        if "path" in presentation:
            data = json.dumps(presentation["path"]).encode()
        elif "path_text" in presentation:
            data = str(presentation["path_text"]).encode()
        else:
            data = base64.b64decode(presentation["path_base64"])
        yield case.stem, data, "path"
    for case in sorted((VECTORS / "sessions").rglob("*.json")):
        yield case.stem, json.dumps(json.loads(case.read_text())["session"]).encode(), "session"


VECTOR_INPUTS = list(_vector_inputs())


@pytest.mark.parametrize(("name", "data", "kind"), VECTOR_INPUTS, ids=[v[0] for v in VECTOR_INPUTS])
def test_every_vector_parses_as_the_reference_says(name: str, data: bytes, kind: str) -> None:
    agree(data, respelled=name.startswith("malformed-duplicate"), kind=kind)


def test_input_the_length_cannot_vouch_for_goes_to_the_reference() -> None:
    """A repeated key, -0 and an escape are declined (the reference reads -0 and the escape as valid)."""
    text = PATHS[-1].to_bytes().decode()
    repeated = text.replace('"depth":1,', '"depth":1,"depth":1,', 1)
    zero = text.replace('"depth":0,', '"depth":-0,', 1)
    escape = text.replace('"agent-0', '"\\u0061gent-0', 1)
    for data in (repeated, zero, escape):
        assert compiled_path(data.encode()) is None
        agree(data.encode(), respelled=True)
    with pytest.raises(MalformedError, match="duplicate"):
        Path.from_bytes(repeated.encode())
    assert Path.from_bytes(zero.encode()) == Path.from_bytes(escape.encode()) == PATHS[-1]


def test_the_prefix_cache_reuses_only_envelopes_equal_to_the_presented_ones() -> None:
    path = PATHS[-1]
    held = {envelope.sig: envelope for envelope in path.envelopes}
    fresh = _compiled_parse.path_from_bytes(path.to_bytes(), held.get)
    assert fresh is not None and all(a is b for a, b in zip(fresh.envelopes, path.envelopes, strict=True))
    # A known signature on other contents is parsed in full (and refused here: the nonce is not hex).
    text = path.to_bytes().decode()
    nonce = path.envelopes[1].record.nonce
    other = text.replace(nonce, "z" * 32).encode()
    assert _compiled_parse.path_from_bytes(other, held.get) is None
    assert outcome(lambda d: Path.from_bytes(d, held.get), other) == outcome(Path.parse_bytes_reference, other)


def test_other_argument_types() -> None:
    data = PATHS[0].to_bytes()
    assert compiled_path(bytearray(data)) == compiled_path(memoryview(data)) == PATHS[0]
    assert compiled_path(data.decode()) is None  # type: ignore[arg-type]  # str: the reference decides
    assert compiled_path(b" " * (records.MAX_INPUT_BYTES + 1)) is None


# --- the reference alone, as chosen when msgspec is not installed -----------------------------------


def test_without_the_compiled_decoder_every_verdict_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback chosen at import when the ``fast`` extra is missing (records._compiled_path None):
    every vector and a corpus of mutations parse as with the compiled decoder."""
    corpus = [(data, kind) for _, data, kind in VECTOR_INPUTS] + [(data, "path") for data, _ in CORPUS_PATHS[:300]]
    with_compiled = [outcome(_public(kind), data) for data, kind in corpus]
    monkeypatch.setattr(records, "_compiled_path", None)
    monkeypatch.setattr(sessions, "_compiled_session", None)
    assert [outcome(_public(kind), data) for data, kind in corpus] == with_compiled


def _public(kind: str) -> Callable[[bytes], Any]:
    return Path.from_bytes if kind == "path" else SessionEvidence.from_bytes


# --- the property fails when either parser loses or gains a rule ------------------------------------

CORPUS_PATHS = mutation_corpus([path.to_json() for path in PATHS], 1_500, seed=32)
CORPUS_SESSIONS = mutation_corpus([session.to_json() for session in SESSIONS], 600, seed=33)
# Every string of a co-signed path and of a session with streams, one at a time, as a near miss.
CORPUS_PATHS += [(text, False) for text in near_misses(PATHS[-1].to_json())]
CORPUS_SESSIONS += [(text, False) for text in near_misses(SESSIONS[-1].to_json())]


def _nonces_of_widths(path: Path, widths: tuple[int, ...]) -> bytes:
    """``path`` with its records' nonces, from the second on, of these widths (each one hex digit repeated)."""
    value = path.to_json()
    for envelope, width in zip(value["envelopes"][1:], widths, strict=False):
        envelope["record"]["nonce"] = "0123456789abcdef"[width % 16] * width
    return write_json(value)


# Two nonces whose widths add up to one nonce's and a newline: joined, they could pass for one nonce
# if the hex patterns' joined match (which holds the newline in its class) did not count the width.
CORPUS_PATHS += [(_nonces_of_widths(PATHS[-1], widths), False) for widths in ((32, 10, 21), (10, 21, 32))]
PATH_VECTORS = sorted((VECTORS / "valid").glob("*.json")) + sorted((VECTORS / "invalid").glob("*.json"))


def _anything(_: str) -> object:
    return True


def _lenient_check(strings: object) -> None:
    """``_Strings.check`` without its count of newlines: a string holding one could pass as two."""
    for name, each in (("deployers", "_DEPLOYERS"), ("key_ids", "_KEY_IDS"), ("identifiers", "_IDENTIFIERS"),
                       ("digests", "_DIGESTS"), ("nonces", "_NONCES"), ("signatures", "_SIGNATURES")):  # fmt: skip
        values = getattr(strings, name)
        if values and getattr(_compiled_parse, each)("\n".join(values)) is None:
            raise _compiled_parse._Unproven


MUTANTS: dict[str, tuple[object, str, Any]] = {
    # the compiled decoder without one of its rules
    "compiled: no length check (repeated keys)": (_compiled_parse, "_canonical_length", lambda data, size: True),
    "compiled: no nonce pattern": (_compiled_parse, "_NONCES", _anything),
    "compiled: no digest pattern": (_compiled_parse, "_DIGESTS", _anything),
    "compiled: no identifier pattern": (_compiled_parse, "_IDENTIFIERS", _anything),
    "compiled: no signature pattern": (_compiled_parse, "_SIGNATURES", _anything),
    "compiled: no deployer pattern": (_compiled_parse, "_DEPLOYERS", _anything),
    "compiled: no key_id pattern": (_compiled_parse, "_KEY_IDS", _anything),
    "compiled: a newline may split a string": (_compiled_parse._Strings, "check", _lenient_check),
    "compiled: hex strings of any width": (_compiled_parse, "_width_holds", lambda text, width: True),
    "compiled: every receipt taken as the first": (_compiled_parse, "_SHARED", lambda struct: ()),
    # the reference parser with one rule dropped, or made stricter than the spec
    "reference: any nonce": (records, "NONCE_PATTERN", re.compile(r".*", re.DOTALL)),
    "reference: any identifier": (records, "IDENTIFIER_PATTERN", re.compile(r".*", re.DOTALL)),
    "reference: deployer ids without a hyphen": (records, "DEPLOYER_ID_PATTERN", re.compile(r"[a-z0-9.]+")),
    "reference: repeated keys kept": (records, "_reject_duplicates", dict),
}


def _property_over_the_corpus() -> None:
    """The property over every vector (with its verdict, which pins what the spec says of the
    vectors that only the reference reads, like a repeated key) and the fixed mutation corpus."""
    for name, data, kind in VECTOR_INPUTS:
        agree(data, respelled=name.startswith("malformed-duplicate"), kind=kind)
    for case in PATH_VECTORS:
        vector = json.loads(case.read_text())
        state = InMemoryState()
        for before in vector["before"]:
            vector_verdict(vector, before, state)
        assert vector_verdict(vector, vector["presentation"], state) == vector["expected"], case.stem
    for data, respelled in CORPUS_PATHS:
        agree(data, respelled)
    for data, respelled in CORPUS_SESSIONS:
        agree(data, respelled, kind="session")


def test_the_property_holds_over_the_fixed_corpus() -> None:
    _property_over_the_corpus()


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_rule_dropped_from_either_parser_breaks_the_property(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With any one rule of either parser dropped, or made stricter than the spec, the property fails
    somewhere in the corpus (``test_the_property_holds_over_the_fixed_corpus``: unchanged, it holds)."""
    module, name, replacement = MUTANTS[mutant]
    monkeypatch.setattr(module, name, replacement)
    with pytest.raises(AssertionError):
        _property_over_the_corpus()
