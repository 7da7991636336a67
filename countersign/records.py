"""Node records, envelopes and paths: the wire format of docs/spec.md, parsed strictly.

Every object has exactly the fields the spec lists (none missing, none unknown), integers are plain
integers in the interoperable range, identifiers match their patterns. A parsed object keeps the
validated JSON it came from, so its canonical bytes are computed without rebuilding it.
"""

from __future__ import annotations

import copy
import enum
import importlib.util
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from countersign.canonical import (
    SAFE_INTEGER_MAX,
    JsonValue,
    canonicalize_validated,
    sha256_digest,
)
from countersign.errors import MalformedError

FORMAT_VERSION: Final = 1
MAX_PATH_LENGTH: Final = 64
MAX_DEPTH: Final = MAX_PATH_LENGTH - 1
MAX_CHILDREN_LIMIT: Final = 65_535
MAX_ALLOWED_CHILDREN: Final = 64
MAX_INPUT_BYTES: Final = 1 << 20
MAX_NESTING: Final = 32  # arrays and objects inside one another (spec 2.1); a valid path uses 6

DEPLOYER_ID_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
KEY_ID_PATTERN: Final = re.compile(r"ed25519:[0-9a-f]{32}")
DIGEST_PATTERN: Final = re.compile(r"sha256:[0-9a-f]{64}")
NONCE_PATTERN: Final = re.compile(r"[0-9a-f]{32}")
IDENTIFIER_PATTERN: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]{1,256}")
# Unpadded base64url of 64 bytes: the last character carries 2 bits, so only A, Q, g, w are canonical.
SIGNATURE_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{85}[AQgw]")

PAYLOAD_TYPE_NODE: Final = "application/vnd.countersign.node+json;version=1"
PAYLOAD_TYPE_EDGE: Final = "application/vnd.countersign.edge+json;version=1"
PAYLOAD_TYPE_REGISTRY_STATEMENT: Final = "application/vnd.countersign.registry-statement+json;version=1"
EDGE_DOMAIN: Final = "countersign/edge-manifest/v1"


class Construction(enum.StrEnum):
    """The six lineage constructions (docs/spec.md section 5)."""

    NO_CHAIN = "no-chain"
    HASH_ONLY = "hash-only"
    NAIVE_SIG = "naive-sig"
    LINKED_LIST = "linked-list"
    MERKLE = "merkle"
    SIGNED_DAG = "signed-dag"

    @property
    def signed(self) -> bool:
        """Records carry a primary signature by the issuing deployer."""
        return self not in (Construction.NO_CHAIN, Construction.HASH_ONLY)

    @property
    def signs_lineage(self) -> bool:
        """The primary signature covers ``parent`` and ``depth`` (NAIVE-SIG signs only identity)."""
        return self.signed and self is not Construction.NAIVE_SIG

    @property
    def links_parent(self) -> bool:
        """Records reference their parent (by digest, or by Merkle root of the prefix)."""
        return self is not Construction.NO_CHAIN

    @property
    def enforces_fanout(self) -> bool:
        """A signed parent commitment exists, so children can be counted against ``max_children``."""
        return self.signs_lineage

    @property
    def cosigns_edges(self) -> bool:
        """Cross-deployer edges carry parent and child co-signatures over the edge manifest."""
        return self is Construction.SIGNED_DAG


class LifecycleEvent(enum.StrEnum):
    NEW = "new"
    RELOAD = "reload"
    BRANCH = "branch"
    COMPOSITE = "composite"
    FINE_TUNE = "fine_tune"


class BindingScope(enum.StrEnum):
    PER_SESSION = "per_session"
    PER_TURN = "per_turn"
    PER_TOOL_CALL = "per_tool_call"
    PER_N_TOKENS = "per_n_tokens"


class CoSignerRole(enum.StrEnum):
    PARENT = "parent"
    CHILD = "child"


# --- small field validators -------------------------------------------------------------------


def _object(value: object, keys: frozenset[str], what: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise MalformedError(f"{what} must be an object")
    if value.keys() != keys:
        missing = sorted(keys - value.keys())
        unknown = sorted(value.keys() - keys)
        raise MalformedError(f"{what}: missing fields {missing}, unknown fields {unknown}")
    return value


def _int(value: object, what: str, low: int = 0, high: int = SAFE_INTEGER_MAX) -> int:
    if type(value) is not int or not low <= value <= high:
        raise MalformedError(f"{what} must be an integer in [{low}, {high}]")
    return value


def _match(value: object, pattern: re.Pattern[str], what: str) -> str:
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise MalformedError(f"{what} must match {pattern.pattern}")
    return value


def _optional_match(value: object, pattern: re.Pattern[str], what: str) -> str | None:
    return None if value is None else _match(value, pattern, what)


_E = TypeVar("_E", bound=enum.StrEnum)


_ENUM_MEMBERS: dict[type[enum.StrEnum], dict[str, enum.StrEnum]] = {}


def _enum(value: object, kind: type[_E], what: str) -> _E:
    # A dict lookup: calling the enum class costs several times more, and it runs ~20 times per path.
    members = _ENUM_MEMBERS.get(kind)
    if members is None:
        members = _ENUM_MEMBERS[kind] = {member.value: member for member in kind}
    member = members.get(value) if type(value) is str else None
    if member is None:
        raise MalformedError(f"{what} must be one of {list(members)}")
    return member  # type: ignore[return-value]


# --- records ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRef:
    """The agent instance a record speaks for, and the agent system (delegation tree) it belongs to."""

    instance: str
    system: str

    KEYS = frozenset({"instance", "system"})

    @classmethod
    def from_json(cls, value: object) -> AgentRef:
        obj = _object(value, cls.KEYS, "agent")
        return cls(
            _match(obj["instance"], IDENTIFIER_PATTERN, "agent.instance"),
            _match(obj["system"], IDENTIFIER_PATTERN, "agent.system"),
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {"instance": self.instance, "system": self.system}


@dataclass(frozen=True, slots=True)
class Policy:
    """Optional signed limits on a record's descendants; ``None`` means no limit."""

    allowed_children: tuple[str, ...] | None = None
    max_depth: int | None = None

    KEYS = frozenset({"allowed_children", "max_depth"})

    @classmethod
    def from_json(cls, value: object) -> Policy:
        obj = _object(value, cls.KEYS, "policy")
        allowed = obj["allowed_children"]
        children: tuple[str, ...] | None = None
        if allowed is not None:
            if type(allowed) is not list or len(allowed) > MAX_ALLOWED_CHILDREN:
                raise MalformedError(f"policy.allowed_children must be a list of at most {MAX_ALLOWED_CHILDREN}")
            children = tuple(_match(d, DEPLOYER_ID_PATTERN, "policy.allowed_children[]") for d in allowed)
            if len(set(children)) != len(children):
                raise MalformedError("policy.allowed_children has duplicates")
        max_depth = obj["max_depth"]
        return cls(children, None if max_depth is None else _int(max_depth, "policy.max_depth", 0, MAX_DEPTH))

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "allowed_children": None if self.allowed_children is None else list(self.allowed_children),
            "max_depth": self.max_depth,
        }


class StreamUnit(enum.StrEnum):
    """What a stream counts (docs/spec.md 4.4 ``output.stream``)."""

    TOKENS = "tokens"
    BYTES = "bytes"


MAX_STREAM_N: Final = 1 << 32
EMPTY_OUTPUT_SHA256: Final = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """A receipt's place in a stream: the signer signs one receipt per ``n`` units of ``unit``;
    ``units`` is how many this chunk covers (``n``, or fewer for the stream's last chunk)."""

    unit: StreamUnit
    n: int
    units: int

    KEYS = frozenset({"unit", "n", "units"})

    @classmethod
    def from_json(cls, value: object) -> StreamChunk:
        obj = _object(value, cls.KEYS, "output.stream")
        n = _int(obj["n"], "output.stream.n", 1, MAX_STREAM_N)
        return cls(
            _enum(obj["unit"], StreamUnit, "output.stream.unit"), n, _int(obj["units"], "output.stream.units", 1, n)
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {"unit": self.unit.value, "n": self.n, "units": self.units}


@dataclass(frozen=True, slots=True)
class SessionClose:
    """The close receipt's commitment: the session held ``count`` outputs, the last one ``last``."""

    count: int
    last: str | None

    KEYS = frozenset({"count", "last"})

    @classmethod
    def from_json(cls, value: object) -> SessionClose:
        obj = _object(value, cls.KEYS, "output.close")
        return cls(
            _int(obj["count"], "output.close.count"), _optional_match(obj["last"], DIGEST_PATTERN, "output.close.last")
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {"count": self.count, "last": self.last}


OUTPUT_KEYS: Final = frozenset({"sha256", "binding_scope", "session", "seq", "prev"})
# Optional members (docs/spec.md 4.4): absent, a receipt's bytes are exactly those of format version 1
# before sessions were verified; present, a verifier that does not know them rejects it (fail closed).
OUTPUT_OPTIONAL_KEYS: Final = frozenset({"stream", "close"})


@dataclass(frozen=True, slots=True)
class OutputReceipt:
    """Layer 1: the exact bytes a deployer's runtime emitted, and where they sit in a session.

    ``stream`` marks a chunk of a stream; ``close`` marks the session's close receipt (no output of its
    own: ``sha256`` is the digest of zero bytes, ``count`` = ``seq``, ``last`` = ``prev``).
    """

    sha256: str
    binding_scope: BindingScope
    session: str
    seq: int
    prev: str | None
    stream: StreamChunk | None = None
    close: SessionClose | None = None

    KEYS = OUTPUT_KEYS

    @classmethod
    def from_json(cls, value: object) -> OutputReceipt:
        if type(value) is not dict:
            raise MalformedError("output must be an object")
        present = value.keys() & OUTPUT_OPTIONAL_KEYS
        obj = _object(value, OUTPUT_KEYS | present, "output")
        seq = _int(obj["seq"], "output.seq")
        prev = _optional_match(obj["prev"], DIGEST_PATTERN, "output.prev")
        if (seq == 0) != (prev is None):
            raise MalformedError("output.prev must be null exactly when output.seq is 0")
        receipt = cls(
            _match(obj["sha256"], DIGEST_PATTERN, "output.sha256"),
            _enum(obj["binding_scope"], BindingScope, "output.binding_scope"),
            _match(obj["session"], IDENTIFIER_PATTERN, "output.session"),
            seq,
            prev,
            StreamChunk.from_json(obj["stream"]) if "stream" in present else None,
            SessionClose.from_json(obj["close"]) if "close" in present else None,
        )
        if receipt.stream is not None and receipt.binding_scope is not BindingScope.PER_N_TOKENS:
            raise MalformedError("output.stream requires binding_scope per_n_tokens")
        if receipt.close is not None:
            close = receipt.close
            if receipt.stream is not None or receipt.binding_scope is not BindingScope.PER_SESSION:
                raise MalformedError("a close receipt has binding_scope per_session and no stream")
            if close.count != seq or close.last != prev or receipt.sha256 != EMPTY_OUTPUT_SHA256:
                raise MalformedError("output.close must commit to count = seq, last = prev, over no output bytes")
        return receipt

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {
            "sha256": self.sha256,
            "binding_scope": self.binding_scope.value,
            "session": self.session,
            "seq": self.seq,
            "prev": self.prev,
        }
        if self.stream is not None:
            body["stream"] = self.stream.to_json()
        if self.close is not None:
            body["close"] = self.close.to_json()
        return body


@dataclass(frozen=True, slots=True)
class CoSignature:
    """A deployer's signature over the edge manifest of one cross-deployer edge."""

    role: CoSignerRole
    deployer: str
    key_id: str
    sig: str

    KEYS = frozenset({"role", "deployer", "key_id", "sig"})

    @classmethod
    def from_json(cls, value: object) -> CoSignature:
        obj = _object(value, cls.KEYS, "cosigs[]")
        return cls(
            _enum(obj["role"], CoSignerRole, "cosigs[].role"),
            _match(obj["deployer"], DEPLOYER_ID_PATTERN, "cosigs[].deployer"),
            _match(obj["key_id"], KEY_ID_PATTERN, "cosigs[].key_id"),
            _match(obj["sig"], SIGNATURE_PATTERN, "cosigs[].sig"),
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {"role": self.role.value, "deployer": self.deployer, "key_id": self.key_id, "sig": self.sig}

    def cosigner_json(self) -> dict[str, JsonValue]:
        """The co-signer's identity as it appears inside the edge manifest (no signature)."""
        return {"role": self.role.value, "deployer": self.deployer, "key_id": self.key_id}


RECORD_KEYS: Final = frozenset(
    {
        "v",
        "construction",
        "deployer",
        "key_id",
        "agent",
        "created_ms",
        "expires_ms",
        "parent",
        "depth",
        "nonce",
        "max_children",
        "event",
        "policy",
        "output",
        "cosigs",
    }
)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One agent instance's record in a delegation path (docs/spec.md section 4.3)."""

    construction: Construction
    deployer: str
    key_id: str
    agent: AgentRef
    created_ms: int
    expires_ms: int
    parent: str | None
    depth: int
    nonce: str
    max_children: int
    event: LifecycleEvent
    policy: Policy
    output: OutputReceipt | None
    cosigs: tuple[CoSignature, ...] = ()
    v: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, value: object) -> NodeRecord:
        if type(value) is dict and "v" in value and type(value["v"]) is int and value["v"] != FORMAT_VERSION:
            raise UnsupportedVersionError(f"record version {value['v']} is not supported")
        obj = _object(value, RECORD_KEYS, "record")
        _int(obj["v"], "record.v", FORMAT_VERSION, FORMAT_VERSION)
        created = _int(obj["created_ms"], "record.created_ms")
        expires = _int(obj["expires_ms"], "record.expires_ms")
        if expires <= created:
            raise MalformedError("record.expires_ms must be after record.created_ms")
        cosigs_value = obj["cosigs"]
        if type(cosigs_value) is not list or len(cosigs_value) not in (0, 2):
            raise MalformedError("record.cosigs must be a list of zero or two co-signatures")
        cosigs = tuple(CoSignature.from_json(c) for c in cosigs_value)
        if cosigs and (cosigs[0].role is not CoSignerRole.PARENT or cosigs[1].role is not CoSignerRole.CHILD):
            raise MalformedError("record.cosigs must list the parent's co-signature, then the child's")
        construction = _enum(obj["construction"], Construction, "record.construction")
        if cosigs and not construction.cosigns_edges:
            raise MalformedError(f"record.cosigs must be empty under {construction}")
        output = obj["output"]
        return cls(
            construction=construction,
            deployer=_match(obj["deployer"], DEPLOYER_ID_PATTERN, "record.deployer"),
            key_id=_match(obj["key_id"], KEY_ID_PATTERN, "record.key_id"),
            agent=AgentRef.from_json(obj["agent"]),
            created_ms=created,
            expires_ms=expires,
            parent=_optional_match(obj["parent"], DIGEST_PATTERN, "record.parent"),
            depth=_int(obj["depth"], "record.depth", 0, MAX_DEPTH),
            nonce=_match(obj["nonce"], NONCE_PATTERN, "record.nonce"),
            max_children=_int(obj["max_children"], "record.max_children", 0, MAX_CHILDREN_LIMIT),
            event=_enum(obj["event"], LifecycleEvent, "record.event"),
            policy=Policy.from_json(obj["policy"]),
            output=None if output is None else OutputReceipt.from_json(output),
            cosigs=cosigs,
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "v": self.v,
            "construction": self.construction.value,
            "deployer": self.deployer,
            "key_id": self.key_id,
            "agent": self.agent.to_json(),
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "parent": self.parent,
            "depth": self.depth,
            "nonce": self.nonce,
            "max_children": self.max_children,
            "event": self.event.value,
            "policy": self.policy.to_json(),
            "output": None if self.output is None else self.output.to_json(),
            "cosigs": [c.to_json() for c in self.cosigs],
        }

    def canonical_bytes(self) -> bytes:
        """RFC 8785 bytes of :meth:`to_json`, composed from a template of its sorted keys.

        Exact when every string is printable ASCII without ``"`` or ``\\`` (each then encodes as
        itself between quotes; every pattern of the schema says so) and every integer field holds an
        ``int``; otherwise the JSON encoder decides, as before. Signers sign these bytes and verifiers
        rebuild them for every record, and the template costs a fraction of the encoder.
        ``tests/core/test_canonical.py`` holds it equal to the ``rfc8785`` library over every shape
        of record, and to the encoder over records of the wrong types.
        """
        try:
            composed = self._composed()
        except (TypeError, AttributeError):  # a field of the wrong type: the encoder decides
            composed = None
        return canonicalize_validated(self.to_json()) if composed is None else composed

    def _composed(self) -> bytes | None:
        # Enum text by ``_value_``: the ``value`` property costs twice as much, and a plain str in an
        # enum field (a wrong type) still raises AttributeError, so the encoder decides for it.
        agent, output, policy, parent, cosigs = self.agent, self.output, self.policy, self.parent, self.cosigs
        texts = [self.deployer, self.key_id, self.nonce, agent.instance, agent.system]
        integers = [self.created_ms, self.expires_ms, self.depth, self.max_children, self.v]
        cosig_text = ""
        if cosigs:
            cosig_text = ",".join(
                [
                    f'{{"deployer":"{c.deployer}","key_id":"{c.key_id}","role":"{c.role._value_}","sig":"{c.sig}"}}'
                    for c in cosigs
                ]
            )
            for c in cosigs:
                texts += (c.deployer, c.key_id, c.sig)
        if parent is not None:
            texts.append(parent)
        children = policy.allowed_children
        if children is not None:
            texts += children
        max_depth = policy.max_depth
        if max_depth is not None:
            integers.append(max_depth)
        output_text = "null" if output is None else _output_text(output, texts, integers)
        if set(map(type, integers)) != _INT_ONLY or _ENCODES_AS_ITSELF.fullmatch("".join(texts)) is None:
            return None
        return (
            f'{{"agent":{{"instance":"{agent.instance}","system":"{agent.system}"}},'
            f'"construction":"{self.construction._value_}","cosigs":[{cosig_text}],"created_ms":{self.created_ms},'
            f'"deployer":"{self.deployer}","depth":{self.depth},"event":"{self.event._value_}",'
            f'"expires_ms":{self.expires_ms},"key_id":"{self.key_id}","max_children":{self.max_children},'
            f'"nonce":"{self.nonce}","output":{output_text},"parent":{_quoted(parent)},'
            f'"policy":{{"allowed_children":{_quoted_list(children)},"max_depth":{_number(max_depth)}}},'
            f'"v":{self.v}}}'
        ).encode("ascii")


_INT_ONLY: Final = {int}
_ENCODES_AS_ITSELF: Final = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
"""Text a JSON string holds as itself: printable ASCII but ``"`` and ``\\``."""


def _quoted(text: str | None) -> str:
    return "null" if text is None else f'"{text}"'


def _quoted_list(texts: tuple[str, ...] | None) -> str:
    return "null" if texts is None else "[" + ",".join([f'"{text}"' for text in texts]) + "]"


def _number(value: int | None) -> str:
    return "null" if value is None else str(value)


def _output_text(output: OutputReceipt, texts: list[str], integers: list[int]) -> str:
    """The ``output`` member of :meth:`NodeRecord.canonical_bytes` (keys sorted, the optional ones
    only when present); adds its strings and integers to those the caller checks."""
    texts += (output.sha256, output.session)
    integers.append(output.seq)
    if output.prev is not None:
        texts.append(output.prev)
    close = stream = ""
    if output.close is not None:
        count, last = output.close.count, output.close.last
        integers.append(count)
        if last is not None:
            texts.append(last)
        close = f',"close":{{"count":{count},"last":{_quoted(last)}}}'
    if output.stream is not None:
        chunk = output.stream
        integers += (chunk.n, chunk.units)
        stream = f',"stream":{{"n":{chunk.n},"unit":"{chunk.unit._value_}","units":{chunk.units}}}'
    return (
        f'{{"binding_scope":"{output.binding_scope._value_}"{close},"prev":{_quoted(output.prev)},'
        f'"seq":{output.seq},"session":"{output.session}","sha256":"{output.sha256}"{stream}}}'
    )


def new_record(
    construction: Construction,
    deployer: str,
    key_id: str,
    agent: AgentRef,
    created_ms: int,
    expires_ms: int,
    parent: str | None,
    depth: int,
    nonce: str,
    max_children: int,
    event: LifecycleEvent,
    policy: Policy,
    output: OutputReceipt | None,
    cosigs: tuple[CoSignature, ...],
) -> NodeRecord:
    """``NodeRecord(...)`` with these values, in a fifth of the time: the generated ``__init__`` of a
    frozen dataclass goes through ``object.__setattr__`` once per field, and the parsers and the issuer
    make one record per envelope. The fields are set on an object of a plain class with the same slots
    (:func:`same_layout`), which then becomes a record. Sets every slot, so the result equals the
    constructed record (``tests/core/test_records.py``)."""
    record: Any = _NEW(_RECORD_LAYOUT)
    record.construction = construction
    record.deployer = deployer
    record.key_id = key_id
    record.agent = agent
    record.created_ms = created_ms
    record.expires_ms = expires_ms
    record.parent = parent
    record.depth = depth
    record.nonce = nonce
    record.max_children = max_children
    record.event = event
    record.policy = policy
    record.output = output
    record.cosigs = cosigs
    record.v = FORMAT_VERSION
    record.__class__ = NodeRecord
    return record  # type: ignore[no-any-return]  # a NodeRecord now


def same_layout(cls: type) -> type:
    """A plain class with the slots of ``cls`` (a frozen, slotted dataclass), in the same order. Its
    objects' slots are set as ordinary attributes, far cheaper than through the frozen class's
    descriptors, and an object of it can then take ``cls`` as its class: Python allows ``__class__`` to
    change between classes of the same layout (and raises TypeError, never corrupts, if they differ)."""
    return type(f"_{cls.__name__}Layout", (), {"__slots__": vars(cls)["__slots__"]})


_NEW: Final[Callable[[type], Any]] = object.__new__


def new_output(
    sha256: str,
    binding_scope: BindingScope,
    session: str,
    seq: int,
    prev: str | None,
    stream: StreamChunk | None,
    close: SessionClose | None,
) -> OutputReceipt:
    """``OutputReceipt(...)`` without the generated ``__init__`` (see :func:`new_record`)."""
    output: Any = _NEW(_OUTPUT_LAYOUT)
    output.sha256 = sha256
    output.binding_scope = binding_scope
    output.session = session
    output.seq = seq
    output.prev = prev
    output.stream = stream
    output.close = close
    output.__class__ = OutputReceipt
    return output  # type: ignore[no-any-return]


def new_cosignature(role: CoSignerRole, deployer: str, key_id: str, sig: str) -> CoSignature:
    """``CoSignature(...)`` without the generated ``__init__`` (see :func:`new_record`)."""
    cosig: Any = _NEW(_COSIGNATURE_LAYOUT)
    cosig.role = role
    cosig.deployer = deployer
    cosig.key_id = key_id
    cosig.sig = sig
    cosig.__class__ = CoSignature
    return cosig  # type: ignore[no-any-return]


def new_agent(instance: str, system: str) -> AgentRef:
    """``AgentRef(...)`` without the generated ``__init__`` (see :func:`new_record`)."""
    agent: Any = _NEW(_AGENT_LAYOUT)
    agent.instance = instance
    agent.system = system
    agent.__class__ = AgentRef
    return agent  # type: ignore[no-any-return]


_RECORD_LAYOUT, _OUTPUT_LAYOUT, _COSIGNATURE_LAYOUT, _AGENT_LAYOUT = (
    same_layout(cls) for cls in (NodeRecord, OutputReceipt, CoSignature, AgentRef)
)


class UnsupportedVersionError(MalformedError):
    """A well-formed object in a format version this implementation does not know."""


# --- envelopes and paths -----------------------------------------------------------------------

ENVELOPE_KEYS: Final = frozenset({"record", "key_id", "sig"})
KnownEnvelopes = Callable[[str], "Envelope | None"]
"""Envelopes already parsed, by their signature (a verifier's prefix cache)."""
_compiled_path: Callable[[bytes, KnownEnvelopes | None], Path | None] | None = None
"""The compiled decoder's path parse, when the ``fast`` extra is installed (set at the end of the module)."""
_compiled_session: Callable[[bytes, int, int], tuple[Path, tuple[Envelope, ...]] | None] | None = None
"""Its parse of session evidence (``countersign.sessions``)."""
PATH_KEYS: Final = frozenset({"v", "envelopes"})


@dataclass(frozen=True, slots=True)
class Envelope:
    """A record with its primary signature (``None`` under the unsigned baselines).

    ``record_json`` is the validated JSON of ``record`` (equal to ``record.to_json()``), and the
    record's canonical bytes are ``record.canonical_bytes()``, the same bytes. Neither changes once
    the envelope exists (:meth:`to_json` hands out copies), so the canonical bytes are encoded once
    per envelope and kept: a signer names the same parent record, and serialises and digests a new
    envelope, many times over.
    """

    record: NodeRecord
    key_id: str
    sig: str | None
    _record_json: dict[str, JsonValue] | None = field(default=None, compare=False, repr=False)
    _record_bytes: bytes | None = field(default=None, init=False, compare=False, repr=False)
    _digest: str | None = field(default=None, init=False, compare=False, repr=False)

    @classmethod
    def build(cls, record: NodeRecord, sig: str | None) -> Envelope:
        """An envelope for a record built here: its JSON is made only when asked for (a signer
        needs only the canonical bytes, which the record composes itself)."""
        return cls(record, record.key_id, sig)

    @property
    def record_json(self) -> dict[str, JsonValue]:
        """The record's JSON: as parsed, or ``record.to_json()`` (not to be changed)."""
        value = self._record_json
        if value is None:  # two threads may both build it: equal values
            value = self.record.to_json()
            object.__setattr__(self, "_record_json", value)
        return value

    @classmethod
    def from_json(cls, value: object) -> Envelope:
        obj = _object(value, ENVELOPE_KEYS, "envelope")
        record = NodeRecord.from_json(obj["record"])
        key_id = _match(obj["key_id"], KEY_ID_PATTERN, "envelope.key_id")
        if key_id != record.key_id:
            raise MalformedError("envelope.key_id differs from record.key_id")
        sig = obj["sig"]
        if record.construction.signed:
            _match(sig, SIGNATURE_PATTERN, "envelope.sig")
        elif sig is not None:
            raise MalformedError(f"envelope.sig must be null under {record.construction}")
        return cls(record, key_id, sig, obj["record"])

    def to_json(self) -> dict[str, JsonValue]:
        """The envelope as JSON; a copy, so that changing it cannot change this envelope."""
        return {"record": copy.deepcopy(self.record_json), "key_id": self.key_id, "sig": self.sig}

    def record_bytes(self) -> bytes:
        """Canonical (RFC 8785) bytes of the record: the payload the primary signature covers."""
        data = self._record_bytes
        if data is None:  # two threads may both encode: they store the same bytes
            data = self.record.canonical_bytes()
            object.__setattr__(self, "_record_bytes", data)
        return data

    def with_sig(self, sig: str | None) -> Envelope:
        """The same record under ``sig``, sharing its JSON and its canonical bytes once encoded."""
        envelope = Envelope(self.record, self.key_id, sig, self._record_json)
        object.__setattr__(envelope, "_record_bytes", self._record_bytes)
        return envelope

    def canonical_bytes(self, record_bytes: bytes | None = None) -> bytes:
        """Canonical bytes of the whole envelope, composed from the record's canonical bytes.

        Keys sort as ``key_id`` < ``record`` < ``sig``; a property test proves the composition equal to
        RFC 8785 over :meth:`to_json`.
        """
        body = self.record_bytes() if record_bytes is None else record_bytes
        key_id = self.key_id.encode("ascii")
        if self.sig is None:
            return b"".join((b'{"key_id":"', key_id, b'","record":', body, b',"sig":null}'))
        # one join copies the record's bytes once; a chain of + copies them at every step
        return b"".join((b'{"key_id":"', key_id, b'","record":', body, b',"sig":"', self.sig.encode("ascii"), b'"}'))

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical envelope: how a child names its parent."""
        digest = self._digest
        if digest is None:
            digest = sha256_digest(self.canonical_bytes())
            object.__setattr__(self, "_digest", digest)
        return digest

    @classmethod
    def from_json_known(cls, value: object, known: KnownEnvelopes) -> Envelope:
        """:meth:`from_json`, but when ``known`` holds an envelope under the value's signature and that
        envelope equals the value as JSON, it is the one returned, without checking the schema again.

        ``value`` must hold no JSON booleans (:meth:`Path.from_bytes` makes sure). Python's ``==`` on
        values parsed from JSON text is JSON equality but for ``true == 1`` and ``false == 0`` (floats
        never get here: the parser refuses them), so with no booleans, equal means the same JSON value
        (key order and whitespace aside), and passing the schema is a property of the value: the known
        envelope passed it. Anything else, including a known signature on other contents, is parsed
        by :meth:`from_json` exactly as without ``known``.
        """
        if type(value) is dict and value.keys() == ENVELOPE_KEYS and type(value["sig"]) is str:
            envelope = known(value["sig"])
            if envelope is not None and value["key_id"] == envelope.key_id and value["record"] == envelope.record_json:
                return envelope
        return cls.from_json(value)


def new_envelope(record: NodeRecord, key_id: str, sig: str | None, record_bytes: bytes) -> Envelope:
    """``Envelope(record, key_id, sig)`` with the record's canonical bytes already known, without the
    generated ``__init__`` (see :func:`new_record`): a parser that has the bytes makes one per record."""
    envelope: Any = _NEW(_ENVELOPE_LAYOUT)
    envelope.record = record
    envelope.key_id = key_id
    envelope.sig = sig
    envelope._record_json = None
    envelope._record_bytes = record_bytes
    envelope._digest = None
    envelope.__class__ = Envelope
    return envelope  # type: ignore[no-any-return]


_ENVELOPE_LAYOUT: Final = same_layout(Envelope)


@dataclass(frozen=True, slots=True)
class Path:
    """A presented root-to-leaf path of envelopes."""

    envelopes: tuple[Envelope, ...]
    v: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, value: object) -> Path:
        """Parse a path from its JSON value."""
        return cls._parse(value, None)

    @classmethod
    def _parse(cls, value: object, known: KnownEnvelopes | None) -> Path:
        """With ``known`` (a verifier's prefix cache; only for values with no booleans), envelopes it
        holds are taken from it (:meth:`Envelope.from_json_known`): the same result, less work."""
        if type(value) is dict and type(value.get("v")) is int and value["v"] != FORMAT_VERSION:
            raise UnsupportedVersionError(f"path version {value['v']} is not supported")
        obj = _object(value, PATH_KEYS, "path")
        _int(obj["v"], "path.v", FORMAT_VERSION, FORMAT_VERSION)
        items = obj["envelopes"]
        if type(items) is not list or not 1 <= len(items) <= MAX_PATH_LENGTH:
            raise MalformedError(f"path.envelopes must be a list of 1 to {MAX_PATH_LENGTH} envelopes")
        envelopes = []
        for index, item in enumerate(items):
            try:
                envelopes.append(Envelope.from_json(item) if known is None else Envelope.from_json_known(item, known))
            except MalformedError as exc:
                raise type(exc)(f"envelope {index}: {exc}", index=index) from None
        return cls(tuple(envelopes))

    def to_json(self) -> dict[str, JsonValue]:
        return {"v": self.v, "envelopes": [e.to_json() for e in self.envelopes]}

    def to_bytes(self) -> bytes:
        """Canonical bytes of the path: what ``path.json`` holds and what round-trips unchanged.

        Composed from the envelopes' canonical bytes (keys sort ``envelopes`` < ``v``); a property test
        proves it equal to RFC 8785 over :meth:`to_json`.
        """
        body = b",".join(envelope.canonical_bytes() for envelope in self.envelopes)
        return b'{"envelopes":[' + body + b'],"v":%d}' % self.v

    @classmethod
    def from_bytes(cls, data: bytes, known: KnownEnvelopes | None = None) -> Path:
        """Parse a path from JSON bytes. Raises MalformedError (never anything else) on bad input.

        With the ``fast`` extra installed, the compiled decoder of :mod:`countersign._compiled_parse`
        reads valid input (ADR 0036); whatever it cannot prove valid, every refusal included, is parsed
        by :meth:`parse_bytes_reference`, which gives the reasons, indexes and details. The result is
        the same either way.

        With ``known`` (a verifier's prefix cache), envelopes it already holds are not checked again,
        for the same result.
        """
        if _compiled_path is not None:
            path = _compiled_path(data, known)
            if path is not None:
                return path
        return cls.parse_bytes_reference(data, known)

    @classmethod
    def parse_bytes_reference(cls, data: bytes, known: KnownEnvelopes | None = None) -> Path:
        """:meth:`from_bytes` by the reference parser alone (:func:`parse_json` and the ``from_json``
        methods, written from the spec); the compiled decoder is held equal to it.

        Input nested deeper than ``MAX_NESTING`` is ``MALFORMED`` at index null whatever else is wrong
        with it (spec 2.1, step 1 of 4.5). A path that passes the schema is at most six levels deep, so
        the depth is measured only when parsing fails: the answer is the same as measuring first,
        and a valid path pays nothing for it.

        No record holds a boolean, so with ``known``, text holding ``true`` or ``false`` anywhere (even
        inside a string) is parsed without it: ``true == 1`` cannot make a value look known.
        """
        if known is not None:
            # As bytes: ``in`` on a memoryview looks for one element, not for a run of bytes.
            text = data if type(data) is bytes else bytes(data)
            if b"true" in text or b"false" in text:
                known = None
        try:
            return cls._parse(parse_json(data), known)
        except MalformedError:
            if nesting_exceeds(bytes(data)):
                raise MalformedError(f"input is nested deeper than {MAX_NESTING} levels") from None
            raise

    @property
    def leaf(self) -> Envelope:
        return self.envelopes[-1]

    def __len__(self) -> int:
        return len(self.envelopes)


# --- strict JSON ------------------------------------------------------------------------------


def _reject_duplicates(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise MalformedError("duplicate object key")
    return obj


def _reject_float(text: str) -> Any:
    raise MalformedError(f"floats are not allowed: {text[:32]}")


def _reject_constant(text: str) -> Any:
    raise MalformedError(f"{text} is not JSON")


_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_STRUCTURE: Final = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_STRUCTURE_OR_QUOTE: Final = bytes(b for b in range(256) if b not in b'[]{}"')
_INNERMOST_PAIR: Final = re.compile(rb"\{\}|\[\]")


def nesting_exceeds(raw: bytes, limit: int = MAX_NESTING) -> bool:
    """Whether the JSON text ``raw`` opens more than ``limit`` arrays and objects inside one another
    (the outermost value counts as one level). Brackets inside strings do not count. Text that is not
    bracket-balanced JSON is left to the parser to refuse (False), unless it is already too deep."""
    structure = raw.translate(None, _NOT_STRUCTURE_OR_QUOTE).replace(b'""', b"")
    if b'"' in structure or b"\\" in raw:  # a string holds a bracket or an escape: strip strings exactly
        structure = _JSON_STRING.sub(b"", raw).translate(None, _NOT_STRUCTURE)
    for _ in range(limit):
        inner_removed = _INNERMOST_PAIR.sub(b"", structure)  # one level: only the pairs there before
        if inner_removed == structure:  # nothing left to remove (or unbalanced)
            return False
        structure = inner_removed
    return structure != b""


def parse_json(data: bytes | str, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """Strict JSON: UTF-8 only, bounded size, no duplicate keys, no floats, no NaN.

    Nesting deeper than the C parser's recursion guard (RecursionError) is reported as malformed;
    callers that need a nesting limit independent of the caller's stack depth use
    :func:`nesting_exceeds` (``Path.from_bytes`` does). Raises MalformedError for every way the input
    can be bad.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise MalformedError(f"input exceeds {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedError(f"input is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        return json.loads(
            text,
            object_pairs_hook=_reject_duplicates,
            parse_float=_reject_float,
            parse_constant=_reject_constant,
        )
    except MalformedError:
        raise
    except (ValueError, RecursionError) as exc:
        raise MalformedError(f"invalid JSON: {exc}") from None


# --- the compiled decoder (ADR 0036) ----------------------------------------------------------------
# Chosen once, at import: msgspec (the ``fast`` extra) when it is installed, else the parser above
# decides alone, with the same verdicts. Imported last: it builds the classes of this module.
DECODER: str = "reference (json)"
"""Which parser reads valid input: the compiled decoder and its version, or the reference."""
if importlib.util.find_spec("msgspec") is not None:
    from countersign import _compiled_parse

    _compiled_path = _compiled_parse.path_from_bytes
    _compiled_session = _compiled_parse.session_from_bytes
    DECODER = _compiled_parse.DECODER_NAME
