"""Verdicts and the closed set of rejection reasons."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from countersign.errors import PathRejected


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
    # Session evidence (docs/spec.md section 16): each with the index of the first offending receipt.
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
class VerificationResult:
    """Outcome of verifying a path. Truthy exactly when the path was accepted."""

    verdict: Verdict
    reason: Reason | None = None
    index: int | None = None
    detail: str = ""

    def __bool__(self) -> bool:
        return self.verdict is Verdict.ACCEPT

    @classmethod
    def accept(cls) -> VerificationResult:
        return _ACCEPTED

    @classmethod
    def reject(cls, reason: Reason, index: int | None, detail: str = "") -> VerificationResult:
        return cls(Verdict.REJECT, reason, index, detail)

    def raise_for_reject(self) -> None:
        """Raise :class:`PathRejected` unless the path was accepted."""
        if not self:
            raise PathRejected(self)

    def to_json(self) -> dict[str, str | int | None]:
        """The verdict object the command line and the gRPC API both expose."""
        return {
            "verdict": self.verdict.value,
            "reason": None if self.reason is None else self.reason.value,
            "index": self.index,
            "detail": self.detail,
        }


_ACCEPTED = VerificationResult(Verdict.ACCEPT)
