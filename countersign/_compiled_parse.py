"""The strict parse of paths and session evidence on a compiled JSON decoder (ADR 0036).

``msgspec`` (the ``fast`` extra) decodes the bytes into typed structs that mirror docs/spec.md section 4:
the member set of every object, each member's JSON type, the integer ranges, the enumerations and the
list lengths are checked in C as the bytes are read. What a type cannot say is checked here: the
patterns of section 2.4 (each pattern once per parse, over its strings joined), ``expires_ms`` after
``created_ms``, ``prev`` null exactly at ``seq`` 0, the
co-signatures' count and roles, the stream and close rules, the envelope's ``key_id`` and ``sig``. A
record's canonical bytes are msgspec's encoding of its struct, whose members are declared in sorted
order: for values that pass the schema (printable ASCII strings without ``"`` or ``\\``, integers in
``[0, 2**53 - 1]``) that is RFC 8785 (``tests/core/test_compiled_parse.py`` holds it equal to the
``rfc8785`` library and to ``NodeRecord.canonical_bytes``).

Like orjson and pydantic-core, msgspec keeps the last of duplicate keys, and it reads ``-0`` as ``0``.
So a value is accepted here only if the input, its whitespace left out, is exactly as long as the
canonical bytes of what was decoded. Every member of the input is then a member of the value, written
canonically: a member of the input that the value does not hold (a duplicate, whose text has at least
``,"":0`` besides whitespace) and every other spelling of a token (an escape in a string, ``-0``) only
make the input longer, and an unknown or missing member, a float, a boolean where an integer belongs
or a string where the schema wants another shape never decodes. Strings of a valid value hold no
whitespace, so the only whitespace left out is between tokens.

Anything else returns None and the reference parser (``countersign.records``) decides: every refusal,
and every input the length does not vouch for. The reason, the index and the detail of a refusal are
therefore the reference's by construction, and an accepted value is the one the reference builds
(the property tests of ``tests/core/test_compiled_parse.py`` hold both over random and mutated input).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Annotated, Final, Literal

import msgspec

from countersign.canonical import SAFE_INTEGER_MAX
from countersign.records import (
    DEPLOYER_ID_PATTERN,
    DIGEST_PATTERN,
    EMPTY_OUTPUT_SHA256,
    IDENTIFIER_PATTERN,
    KEY_ID_PATTERN,
    MAX_ALLOWED_CHILDREN,
    MAX_CHILDREN_LIMIT,
    MAX_DEPTH,
    MAX_INPUT_BYTES,
    MAX_PATH_LENGTH,
    MAX_STREAM_N,
    NONCE_PATTERN,
    SIGNATURE_PATTERN,
    BindingScope,
    Construction,
    CoSignature,
    CoSignerRole,
    Envelope,
    KnownEnvelopes,
    LifecycleEvent,
    NodeRecord,
    OutputReceipt,
    Path,
    Policy,
    SessionClose,
    StreamChunk,
    StreamUnit,
    new_agent,
    new_cosignature,
    new_envelope,
    new_output,
    new_record,
)

DECODER_NAME: Final[str] = f"msgspec {msgspec.__version__}"

_SafeInt = Annotated[int, msgspec.Meta(ge=0, le=SAFE_INTEGER_MAX)]
_Depth = Annotated[int, msgspec.Meta(ge=0, le=MAX_DEPTH)]
_StreamCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_STREAM_N)]


# The structs: one per object of spec section 4, members in sorted order (their encoding is canonical).
# ``gc=False``: they hold no cycles, and the collector need not track the thousands a session makes.


class _Policy(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    allowed_children: Annotated[list[str], msgspec.Meta(max_length=MAX_ALLOWED_CHILDREN)] | None
    max_depth: _Depth | None


class _Close(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    count: _SafeInt
    last: str | None


class _Stream(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    n: _StreamCount
    unit: StreamUnit
    units: _StreamCount


class _Output(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True):
    # kw_only lets the two optional members keep their sorted places; UNSET (absent) is not encoded.
    binding_scope: BindingScope
    close: _Close | msgspec.UnsetType = msgspec.UNSET
    prev: str | None
    seq: _SafeInt
    session: str
    sha256: str
    stream: _Stream | msgspec.UnsetType = msgspec.UNSET


class _Agent(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    instance: str
    system: str


class _CoSignature(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    deployer: str
    key_id: str
    role: CoSignerRole
    sig: str


class _Record(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    agent: _Agent
    construction: Construction
    cosigs: Annotated[list[_CoSignature], msgspec.Meta(max_length=2)]
    created_ms: _SafeInt
    deployer: str
    depth: _Depth
    event: LifecycleEvent
    expires_ms: _SafeInt
    key_id: str
    max_children: Annotated[int, msgspec.Meta(ge=0, le=MAX_CHILDREN_LIMIT)]
    nonce: str
    output: _Output | None
    parent: str | None
    policy: _Policy
    v: Literal[1]


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    key_id: str
    record: _Record
    sig: str | None


class _Path(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    envelopes: Annotated[list[_Envelope], msgspec.Meta(min_length=1, max_length=MAX_PATH_LENGTH)]
    v: Literal[1]


class _Session(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    agent: _Path
    receipts: list[_Envelope]  # 1 to max_receipts, checked by session_from_bytes
    v: Literal[1]


_DECODE_PATH: Final = msgspec.json.Decoder(_Path).decode
_DECODE_SESSION: Final = msgspec.json.Decoder(_Session).decode
_ENCODE: Final = msgspec.json.Encoder().encode
_WHITESPACE: Final = b" \t\n\r"  # RFC 8259's four

# Envelope, path and session text around the parts that vary (lengths of what Path.to_bytes and
# SessionEvidence.to_bytes compose): '{"key_id":"' '","record":' ',"sig":' '}', and so on.
_ENVELOPE_FRAME: Final = 30
_PATH_FRAME: Final = len(b'{"envelopes":[') + len(b'],"v":1}')
_SESSION_FRAME: Final = len(b'{"agent":') + len(b',"receipts":[') + len(b'],"v":1}')


def _each(pattern: re.Pattern[str]) -> Callable[[str], object]:
    """Matches strings joined by newlines, each against ``pattern`` (none of whose strings holds one)."""
    return re.compile(f"(?:{pattern.pattern})(?:\n(?:{pattern.pattern}))*").fullmatch


def _each_hex(pattern: re.Pattern[str], prefix: str, digits: int) -> Callable[[str], object]:
    """:func:`_each` for a ``prefix`` and then ``digits`` lowercase hex digits, about four times faster.

    Python's regular expressions test a character against a class of two ranges one range at a time,
    but against a bitmap once the class holds three; so the newline joins the class. It cannot stand in
    for a digit: the text must be exactly as long as its strings at their width with a newline between
    each two, and the pattern puts a newline after each string's width, so every newline the text holds
    is one of those."""
    if pattern.pattern != f"{re.escape(prefix)}[0-9a-f]{{{digits}}}":
        raise ValueError(f"{pattern.pattern!r} is not {prefix!r} and {digits} hex digits")
    width = len(prefix) + digits
    one = f"{re.escape(prefix)}[0-9a-f\n]{{{digits}}}"
    joined = re.compile(f"{one}(?:\n{one})*").fullmatch

    def match(text: str) -> object:
        return _width_holds(text, width) and joined(text)

    return match


def _width_holds(text: str, width: int) -> bool:
    """Whether ``text`` is as long as strings of ``width`` joined by its newlines would be."""
    return len(text) == (text.count("\n") + 1) * (width + 1) - 1


_DEPLOYERS: Final = _each(DEPLOYER_ID_PATTERN)
_KEY_IDS: Final = _each_hex(KEY_ID_PATTERN, "ed25519:", 32)
_DIGESTS: Final = _each_hex(DIGEST_PATTERN, "sha256:", 64)
_NONCES: Final = _each_hex(NONCE_PATTERN, "", 32)
_IDENTIFIERS: Final = _each(IDENTIFIER_PATTERN)
_SIGNATURES: Final = _each(SIGNATURE_PATTERN)
_NO_POLICY: Final = Policy()
_UNSET: Final = msgspec.UNSET
_PARENT, _CHILD = CoSignerRole.PARENT, CoSignerRole.CHILD
# Identity tests, not the Construction properties: a property call costs more than the test.
_NO_CHAIN, _HASH_ONLY, _SIGNED_DAG = Construction.NO_CHAIN, Construction.HASH_ONLY, Construction.SIGNED_DAG
_PER_N_TOKENS, _PER_SESSION = BindingScope.PER_N_TOKENS, BindingScope.PER_SESSION


class _Unproven(Exception):
    """A rule this module checks does not hold: the reference parser decides."""


class _Strings:
    """The strings of one parse, by the pattern they must match, checked together at the end: one
    regular expression per pattern over them joined by newlines (no pattern matches a newline, and the
    count of newlines proves no string holds one) costs far less than one call per string."""

    __slots__ = ("deployers", "digests", "identifiers", "key_ids", "nonces", "signatures")

    def __init__(self) -> None:
        self.deployers: list[str] = []
        self.key_ids: list[str] = []
        self.digests: list[str] = []
        self.nonces: list[str] = []
        self.identifiers: list[str] = []
        self.signatures: list[str] = []

    def check(self) -> None:
        """Raises _Unproven unless every string matches its pattern."""
        # A path names a few keys many times (records, envelopes, co-signatures): those once each.
        if not (
            _all(self.deployers, _DEPLOYERS)
            and _all(list(set(self.key_ids)), _KEY_IDS)
            and _all(self.identifiers, _IDENTIFIERS)
            and _all(self.digests, _DIGESTS)
            and _all(self.nonces, _NONCES)
            and _all(self.signatures, _SIGNATURES)
        ):
            raise _Unproven


def _all(strings: list[str], each: Callable[[str], object]) -> bool:
    """Whether every string matches: joined by newlines, which no pattern matches and none may hold."""
    if not strings:
        return True
    text = "\n".join(strings)
    return text.count("\n") == len(strings) - 1 and bool(each(text))


def path_from_bytes(data: object, known: KnownEnvelopes | None = None) -> Path | None:
    """The path ``data`` holds, if the compiled decoder and the checks here prove it valid; None when the
    reference parser must decide (see the module docstring). With ``known`` (a verifier's prefix cache),
    an envelope it holds under the same signature, key_id and canonical record bytes is the one used.
    Never raises for any input."""
    data = _as_bytes(data)
    if data is None or len(data) > MAX_INPUT_BYTES:
        return None
    strings = _Strings()
    try:
        value = _DECODE_PATH(data)
        envelopes, size = _envelopes(value.envelopes, known, strings)
        strings.check()
    except (msgspec.DecodeError, ValueError, _Unproven):  # ValidationError is a DecodeError
        return None
    if not _canonical_length(data, _PATH_FRAME + size):
        return None
    return Path(envelopes)


def session_from_bytes(data: object, max_bytes: int, max_receipts: int) -> tuple[Path, tuple[Envelope, ...]] | None:
    """The agent path and the receipts of session evidence ``data`` holds (at most ``max_bytes``, 1 to
    ``max_receipts`` receipts), as :func:`path_from_bytes` proves them; None when the reference parser
    must decide. Never raises."""
    data = _as_bytes(data)
    if data is None or len(data) > max_bytes:
        return None
    strings = _Strings()
    try:
        value = _DECODE_SESSION(data)
        if not 1 <= len(value.receipts) <= max_receipts:
            return None
        agent, agent_size = _envelopes(value.agent.envelopes, None, strings)
        receipts, receipts_size = _receipts(value.receipts, strings)
        strings.check()
    except (msgspec.DecodeError, ValueError, _Unproven):
        return None
    if not _canonical_length(data, _SESSION_FRAME + _PATH_FRAME + agent_size + receipts_size):
        return None
    return Path(agent), receipts


def _as_bytes(data: object) -> bytes | None:
    """Binary input as bytes; None for anything else (a ``str`` is the reference parser's to read)."""
    if type(data) is bytes:
        return data
    return bytes(data) if isinstance(data, bytearray | memoryview) else None


def _canonical_length(data: bytes, canonical: int) -> bool:
    """Whether ``data`` without its whitespace is ``canonical`` bytes long (canonical input has none)."""
    return len(data) == canonical or len(data.translate(None, _WHITESPACE)) == canonical


def _envelopes(
    items: list[_Envelope], known: KnownEnvelopes | None, strings: _Strings
) -> tuple[tuple[Envelope, ...], int]:
    """The envelopes, and the length of their canonical bytes joined by commas. Raises _Unproven."""
    envelopes = []
    size = len(items) - 1  # the commas
    for item in items:
        struct = item.record
        record_bytes = _ENCODE(struct)
        sig = item.sig
        key_id = item.key_id
        size += _ENVELOPE_FRAME + len(key_id) + len(record_bytes) + (4 if sig is None else len(sig) + 2)
        if known is not None and sig is not None:
            # Equal canonical bytes are equal values: the known envelope passed every check of these.
            held = known(sig)
            if held is not None and held.key_id == key_id and held.record_bytes() == record_bytes:
                envelopes.append(held)
                continue
        record = _record(struct, strings)
        _envelope_rules(record, key_id, sig, strings)
        envelopes.append(new_envelope(record, key_id, sig, record_bytes))
    return tuple(envelopes), size


# The members a session's receipts share with its first receipt, as a signer issues them.
_SHARED: Final = operator.attrgetter(
    "agent", "construction", "cosigs", "deployer", "depth", "event", "key_id", "max_children", "parent", "policy"
)


def _receipts(items: list[_Envelope], strings: _Strings) -> tuple[tuple[Envelope, ...], int]:
    """:func:`_envelopes` for a session's receipts: a receipt whose shared members equal the first
    receipt's (the same JSON values) has only its own members checked, and shares the first record's
    objects for the others."""
    first = items[0]
    base = _record(first.record, strings)
    shared = _SHARED(first.record)
    session = None if base.output is None else base.output.session
    construction, deployer, key_id, agent, parent, depth, max_children, event, policy, cosigs = (
        base.construction, base.deployer, base.key_id, base.agent, base.parent, base.depth, base.max_children,
        base.event, base.policy, base.cosigs,
    )  # fmt: skip
    signed = construction is not _NO_CHAIN and construction is not _HASH_ONLY
    nonces, signatures = strings.nonces, strings.signatures
    envelopes = []
    size = len(items) - 1
    for item in items:
        struct = item.record
        record_bytes = _ENCODE(struct)
        sig = item.sig
        size += _ENVELOPE_FRAME + len(item.key_id) + len(record_bytes) + (4 if sig is None else len(sig) + 2)
        if _SHARED(struct) != shared:
            record = _record(struct, strings)
            _envelope_rules(record, item.key_id, sig, strings)
        else:
            created, expires, nonce, output = struct.created_ms, struct.expires_ms, struct.nonce, struct.output
            if expires <= created:
                raise _Unproven
            nonces.append(nonce)
            record = new_record(
                construction, deployer, key_id, agent, created, expires, parent, depth, nonce, max_children, event,
                policy, None if output is None else _output(output, session, strings), cosigs,
            )  # fmt: skip
            # _envelope_rules, for the first receipt's key_id and construction
            if item.key_id != key_id or (sig is None) is signed:
                raise _Unproven
            if sig is not None:
                signatures.append(sig)
        envelopes.append(new_envelope(record, item.key_id, sig, record_bytes))
    return tuple(envelopes), size


def _envelope_rules(record: NodeRecord, key_id: str, sig: str | None, strings: _Strings) -> None:
    """The envelope's own rules: its key_id is the record's, its signature is there exactly when the
    construction signs (spec 4.5, step 4.4). Raises _Unproven."""
    if key_id != record.key_id:
        raise _Unproven
    construction = record.construction
    if construction is _NO_CHAIN or construction is _HASH_ONLY:
        if sig is not None:
            raise _Unproven
    elif sig is None:
        raise _Unproven
    else:
        strings.signatures.append(sig)


def _record(struct: _Record, strings: _Strings) -> NodeRecord:
    """The record of a decoded struct, once the rules no type says hold (spec 4.3, 4.4); its strings
    are left in ``strings`` to match. Raises _Unproven."""
    created, expires = struct.created_ms, struct.expires_ms
    if expires <= created:
        raise _Unproven
    construction, deployer, key_id, parent, agent = (
        struct.construction, struct.deployer, struct.key_id, struct.parent, struct.agent
    )  # fmt: skip
    instance, system = agent.instance, agent.system
    strings.deployers.append(deployer)
    strings.key_ids.append(key_id)
    strings.nonces.append(struct.nonce)
    strings.identifiers += (instance, system)
    if parent is not None:
        strings.digests.append(parent)
    cosigs: tuple[CoSignature, ...] = ()
    if struct.cosigs:
        cosigs = _cosignatures(struct.cosigs, construction, strings)
    output = None if struct.output is None else _output(struct.output, None, strings)
    return new_record(
        construction, deployer, key_id, new_agent(instance, system), created, expires, parent, struct.depth,
        struct.nonce, struct.max_children, struct.event, _policy(struct.policy, strings), output, cosigs,
    )  # fmt: skip


def _cosignatures(items: list[_CoSignature], construction: Construction, strings: _Strings) -> tuple[CoSignature, ...]:
    if len(items) != 2 or construction is not _SIGNED_DAG:
        raise _Unproven
    parent, child = items
    if parent.role is not _PARENT or child.role is not _CHILD:
        raise _Unproven
    strings.deployers += (parent.deployer, child.deployer)
    strings.key_ids += (parent.key_id, child.key_id)
    strings.signatures += (parent.sig, child.sig)
    return (
        new_cosignature(_PARENT, parent.deployer, parent.key_id, parent.sig),
        new_cosignature(_CHILD, child.deployer, child.key_id, child.sig),
    )


def _policy(struct: _Policy, strings: _Strings) -> Policy:
    allowed, max_depth = struct.allowed_children, struct.max_depth
    if allowed is None:
        return _NO_POLICY if max_depth is None else Policy(None, max_depth)
    if len(set(allowed)) != len(allowed):
        raise _Unproven
    strings.deployers += allowed
    return Policy(tuple(allowed), max_depth)


def _output(struct: _Output, session: str | None, strings: _Strings) -> OutputReceipt:
    """The output section; ``session`` is an identifier already checked (a session's first receipt's),
    so that an equal one is not matched again. Raises _Unproven."""
    seq, prev, sha256, scope = struct.seq, struct.prev, struct.sha256, struct.binding_scope
    if (seq == 0) != (prev is None):
        raise _Unproven
    strings.digests.append(sha256)
    if prev is not None:
        strings.digests.append(prev)
    if struct.session != session:
        strings.identifiers.append(struct.session)
    chunk = close = None
    stream = struct.stream
    if stream is not _UNSET:
        if scope is not _PER_N_TOKENS or stream.units > stream.n:
            raise _Unproven
        chunk = StreamChunk(stream.unit, stream.n, stream.units)
    if struct.close is not _UNSET:
        count, last = struct.close.count, struct.close.last
        # last equals prev, so it is a digest left to match, or null with it
        if chunk is not None or scope is not _PER_SESSION or count != seq or last != prev:
            raise _Unproven
        if sha256 != EMPTY_OUTPUT_SHA256:
            raise _Unproven
        close = SessionClose(count, last)
    return new_output(sha256, scope, struct.session, seq, prev, chunk, close)
