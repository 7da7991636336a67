"""Verdicts and the closed set of rejection reasons."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from countersign.canonical import JsonValue
from countersign.errors import PathRejected
from countersign.records import BindingScope, Construction, CoSignature, same_layout


class Verdict(enum.StrEnum):
    ACCEPT = "ACCEPT"
    REJECT = "REJECT"


class Reason(enum.StrEnum):
    """Why a path was rejected. Closed: adding a member is a protocol change (docs/spec.md)."""

    MALFORMED = "MALFORMED"
    """The input is not a well-formed path, record or registry (schema, encoding, limits)."""
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    """A record or path declares a format version this verifier does not implement."""
    CONSTRUCTION_NOT_ALLOWED = "CONSTRUCTION_NOT_ALLOWED"
    """The path uses a lineage construction the verifier's policy does not accept."""
    UNKNOWN_DEPLOYER = "UNKNOWN_DEPLOYER"
    """The issuing (or co-signing) deployer is not admitted in the registry."""
    UNKNOWN_KEY = "UNKNOWN_KEY"
    """The key_id is not one of the deployer's registered keys."""
    KEY_REVOKED = "KEY_REVOKED"
    """The key was revoked; nothing it signed is accepted, whatever its date."""
    KEY_NOT_VALID = "KEY_NOT_VALID"
    """The key was not valid at the record's creation time (before it was added or after retirement)."""
    BAD_SIGNATURE = "BAD_SIGNATURE"
    """The primary signature does not verify over the record."""
    NOT_YET_VALID = "NOT_YET_VALID"
    """The record's creation time lies beyond the verifier's clock plus the allowed skew."""
    EXPIRED = "EXPIRED"
    """The record's expiry lies before the verifier's clock minus the allowed skew."""
    PARENT_MISMATCH = "PARENT_MISMATCH"
    """The parent reference does not match the preceding record (or a root has a parent)."""
    DEPTH_MISMATCH = "DEPTH_MISMATCH"
    """The signed depth does not equal the record's position in the path."""
    SYSTEM_MISMATCH = "SYSTEM_MISMATCH"
    """The record belongs to a different agent system (delegation tree) than the path's root."""
    EXPIRY_EXCEEDS_PARENT = "EXPIRY_EXCEEDS_PARENT"
    """A child record outlives its parent."""
    POLICY_VIOLATION = "POLICY_VIOLATION"
    """An ancestor's signed policy (allowed children, depth limit) forbids this record."""
    MISSING_COSIGNATURE = "MISSING_COSIGNATURE"
    """A cross-deployer edge lacks the parent's or the child's co-signature."""
    BAD_COSIGNATURE = "BAD_COSIGNATURE"
    """A co-signature over the edge manifest does not verify."""
    DUPLICATE_NONCE = "DUPLICATE_NONCE"
    """Two records of the path carry the same nonce."""
    OUTPUT_MISSING = "OUTPUT_MISSING"
    """The leaf record carries no output section to bind the presented bytes to."""
    OUTPUT_MISMATCH = "OUTPUT_MISMATCH"
    """SHA-256 of the presented output bytes differs from the leaf's signed output hash."""
    FANOUT_EXCEEDED = "FANOUT_EXCEEDED"
    """The parent already has max_children distinct children recorded."""
    NONCE_REPLAYED = "NONCE_REPLAYED"
    """The leaf nonce was consumed before: this path has already been accepted."""
    REGISTRY_STALE = "REGISTRY_STALE"
    """The verifier's registry copy is older than its configured staleness bound."""
    CONSUMER_POLICY_VIOLATION = "CONSUMER_POLICY_VIOLATION"
    """The path verified, but the consumer policy chosen for the request refuses it (the detail
    names the failing clause first). Distinct from ``POLICY_VIOLATION``: that one is a policy the
    path's own records sign; this one is the consumer's, applied after verification."""
    # Session evidence (docs/spec.md section 17): each with the index of the first offending receipt.
    SESSION_AGENT_MISMATCH = "SESSION_AGENT_MISMATCH"
    """A receipt was not issued under the session's emitting agent record (a cross-agent splice)."""
    SESSION_MISMATCH = "SESSION_MISMATCH"
    """A receipt belongs to another session, or to another stream of it (a cross-session splice)."""
    SESSION_DUPLICATE = "SESSION_DUPLICATE"
    """A receipt is presented more than once in the session."""
    SESSION_REORDERED = "SESSION_REORDERED"
    """A receipt stands before one that precedes it in the session (the order was changed)."""
    SESSION_GAP = "SESSION_GAP"
    """A receipt of the session is missing before this one (a dropped output)."""
    SESSION_CHAIN_BROKEN = "SESSION_CHAIN_BROKEN"
    """The receipt's prev is not the digest of the receipt before it (another receipt took its place)."""
    SESSION_TRUNCATED = "SESSION_TRUNCATED"
    """A closed session was required and the session ends without its close receipt."""
    SESSION_AFTER_CLOSE = "SESSION_AFTER_CLOSE"
    """A receipt follows the session's close receipt."""
    SESSION_OUTPUT_MISMATCH = "SESSION_OUTPUT_MISMATCH"
    """SHA-256 of the bytes presented for a receipt (a turn or a stream chunk) differs from its signed hash."""


@dataclass(frozen=True, slots=True)
class Emitter:
    """Who emitted the output: the leaf record (an output receipt), as the verified path proves it.

    Under the unsigned baselines (``no-chain``, ``hash-only``) nothing is signed, so these fields
    are only what the records claim; ``construction`` says which case holds.
    """

    index: int
    deployer: str
    key_id: str
    agent_instance: str
    agent_system: str
    construction: Construction
    created_ms: int
    output_sha256: str
    binding_scope: BindingScope
    session: str
    seq: int

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "index": self.index,
            "deployer": self.deployer,
            "key_id": self.key_id,
            "agent_instance": self.agent_instance,
            "agent_system": self.agent_system,
            "construction": self.construction.value,
            "created_ms": self.created_ms,
            "output_sha256": self.output_sha256,
            "binding_scope": self.binding_scope.value,
            "session": self.session,
            "seq": self.seq,
        }


@dataclass(frozen=True, slots=True)
class ProvenEdge:
    """One delegation edge of a verified path: record ``index - 1`` -> record ``index``.

    ``cosigners`` are the co-signatures the verifier checked over the edge manifest (SIGNED-DAG
    cross-deployer edges); empty when the edge is authorised by the child's own signature alone.
    """

    index: int
    parent_deployer: str
    parent_key_id: str
    deployer: str
    key_id: str
    construction: Construction
    cross_deployer: bool
    cosigners: tuple[CoSignature, ...]

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "index": self.index,
            "parent_deployer": self.parent_deployer,
            "parent_key_id": self.parent_key_id,
            "deployer": self.deployer,
            "key_id": self.key_id,
            "construction": self.construction.value,
            "cross_deployer": self.cross_deployer,
            "cosigners": [c.cosigner_json() for c in self.cosigners],
        }


@dataclass(frozen=True, slots=True)
class Attribution:
    """What a path whose cryptography and output binding held proves: the emitter, every edge in
    path order, and the registry sequence the keys were resolved at. Set on ``ACCEPT`` and on the
    rejects decided after those checks (``CONSUMER_POLICY_VIOLATION``, ``FANOUT_EXCEEDED``,
    ``NONCE_REPLAYED``); never on a path that failed them, whose claims prove nothing."""

    emitter: Emitter
    edges: tuple[ProvenEdge, ...]
    registry_sequence: int


def new_emitter(
    index: int,
    deployer: str,
    key_id: str,
    agent_instance: str,
    agent_system: str,
    construction: Construction,
    created_ms: int,
    output_sha256: str,
    binding_scope: BindingScope,
    session: str,
    seq: int,
) -> Emitter:
    """``Emitter(...)`` without the generated ``__init__`` (as :func:`countersign.records.new_record`):
    every verdict that holds names one."""
    emitter: Any = _NEW(_EMITTER_LAYOUT)
    emitter.index = index
    emitter.deployer = deployer
    emitter.key_id = key_id
    emitter.agent_instance = agent_instance
    emitter.agent_system = agent_system
    emitter.construction = construction
    emitter.created_ms = created_ms
    emitter.output_sha256 = output_sha256
    emitter.binding_scope = binding_scope
    emitter.session = session
    emitter.seq = seq
    emitter.__class__ = Emitter
    return emitter  # type: ignore[no-any-return]


def new_proven_edge(
    index: int,
    parent_deployer: str,
    parent_key_id: str,
    deployer: str,
    key_id: str,
    construction: Construction,
    cross_deployer: bool,
    cosigners: tuple[CoSignature, ...],
) -> ProvenEdge:
    """``ProvenEdge(...)`` without the generated ``__init__``: a verdict names one per edge."""
    edge: Any = _NEW(_PROVEN_EDGE_LAYOUT)
    edge.index = index
    edge.parent_deployer = parent_deployer
    edge.parent_key_id = parent_key_id
    edge.deployer = deployer
    edge.key_id = key_id
    edge.construction = construction
    edge.cross_deployer = cross_deployer
    edge.cosigners = cosigners
    edge.__class__ = ProvenEdge
    return edge  # type: ignore[no-any-return]


_NEW: Final[Callable[[type], Any]] = object.__new__
_EMITTER_LAYOUT, _PROVEN_EDGE_LAYOUT = same_layout(Emitter), same_layout(ProvenEdge)


@dataclass(frozen=True, slots=True)
class VerificationResult:
    """Outcome of verifying a path. Truthy exactly when the path was accepted.

    ``retry_of_ms`` is set on an ``ACCEPT`` that answers a retry (the same ``request_id`` from the
    same client) of an acceptance recorded earlier, to that acceptance's time (0: the store kept no
    time); the retry consumed nothing. None on a first acceptance and on every reject."""

    verdict: Verdict
    reason: Reason | None = None
    index: int | None = None
    detail: str = ""
    attribution: Attribution | None = None
    retry_of_ms: int | None = None

    def __bool__(self) -> bool:
        return self.verdict is Verdict.ACCEPT

    @classmethod
    def accept(cls, attribution: Attribution | None = None, *, retry_of_ms: int | None = None) -> VerificationResult:
        if attribution is None and retry_of_ms is None:
            return _ACCEPTED
        return cls(Verdict.ACCEPT, attribution=attribution, retry_of_ms=retry_of_ms)

    @classmethod
    def reject(
        cls, reason: Reason, index: int | None, detail: str = "", attribution: Attribution | None = None
    ) -> VerificationResult:
        return cls(Verdict.REJECT, reason, index, detail, attribution)

    def raise_for_reject(self) -> None:
        """Raise :class:`PathRejected` unless the path was accepted."""
        if not self:
            raise PathRejected(self)

    def to_json(self) -> dict[str, JsonValue]:
        """The verdict object the command line and the gRPC API both expose (docs/spec.md 6.2):
        ``emitter``, ``edges`` and ``registry_sequence`` are ``null`` when nothing was proven."""
        attribution = self.attribution
        return {
            "verdict": self.verdict.value,
            "reason": None if self.reason is None else self.reason.value,
            "index": self.index,
            "detail": self.detail,
            "emitter": None if attribution is None else attribution.emitter.to_json(),
            "edges": None if attribution is None else [edge.to_json() for edge in attribution.edges],
            "registry_sequence": None if attribution is None else attribution.registry_sequence,
        }


_ACCEPTED = VerificationResult(Verdict.ACCEPT)
