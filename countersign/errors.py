"""Exception types of the protocol core.

A rejected path is data (:class:`countersign.reasons.VerificationResult`), not an exception. The
exceptions here separate three things a caller must never confuse:

* :class:`MalformedError`: the input cannot be a protocol object (becomes ``MALFORMED``);
* :class:`PathRejected`: raised only by the convenience call that turns a reject into an exception;
* :class:`VerificationError`: the check could not run (a store or registry was unavailable). It is
  retryable and is never an accept and never a reject.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from countersign.reasons import VerificationResult


class CountersignError(Exception):
    """Base class of every error the package raises on purpose."""


class MalformedError(CountersignError, ValueError):
    """Input that does not satisfy the wire format (schema, encoding, limits).

    ``index`` names the offending envelope of a path when the fault lies inside one.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class PathRejected(CountersignError):
    """A presented path was rejected; ``result`` holds the reason and offending index."""

    def __init__(self, result: VerificationResult) -> None:
        super().__init__(f"path rejected: {result.reason} at index {result.index}: {result.detail}")
        self.result = result


class VerificationError(CountersignError):
    """The verification could not be completed; retry later. Never an accept."""

    retryable = True


class StateUnavailable(VerificationError):
    """The durable verifier state (nonce and child-set store) could not be reached."""


class SignerError(CountersignError):
    """A signing backend failed to produce a signature."""

    retryable = False


class SignerUnavailable(SignerError):
    """The signing backend is temporarily unreachable or throttled; safe to retry."""

    retryable = True


class ConfigError(CountersignError, ValueError):
    """Bad configuration: a daemon refuses to start, or a client to connect, and says why."""


class ErrorCode(StrEnum):
    """Every code a refusal may carry across the wire (gRPC ``ErrorInfo.reason``), from any service.

    One closed list: a server ends a call only with one of these, a client maps whatever it receives
    onto one of these, and ``proto/countersign/v1/common.proto`` and ``docs/api.md`` list exactly
    these (a test checks both). Verdict reasons are a different enum (``countersign.reasons.Reason``):
    a rejected path is an answer, not an error.
    """

    # any service
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_AUTHORISED = "NOT_AUTHORISED"
    STATE_UNAVAILABLE = "STATE_UNAVAILABLE"
    LANES_EXHAUSTED = "LANES_EXHAUSTED"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"
    # signer
    REGISTRY_STALE = "REGISTRY_STALE"
    SIGNER_UNAVAILABLE = "SIGNER_UNAVAILABLE"
    PARENT_UNKNOWN = "PARENT_UNKNOWN"
    POLICY_REFUSED = "POLICY_REFUSED"
    DEPTH_LIMIT = "DEPTH_LIMIT"
    FANOUT_EXCEEDED = "FANOUT_EXCEEDED"
    EXPIRY_EXCEEDS_PARENT = "EXPIRY_EXCEEDS_PARENT"
    GRANT_NOT_FOUND = "GRANT_NOT_FOUND"
    GRANT_WRONG_CHILD = "GRANT_WRONG_CHILD"
    GRANT_USED = "GRANT_USED"
    GRANT_EXPIRED = "GRANT_EXPIRED"
    BAD_COSIGNATURE = "BAD_COSIGNATURE"
    PARENT_REFUSED = "PARENT_REFUSED"
    PARENT_UNREACHABLE = "PARENT_UNREACHABLE"
    SESSION_CLOSED = "SESSION_CLOSED"
    STATE_CONFLICT = "STATE_CONFLICT"  # replicas wrote the same state concurrently, retry (ADR 0033)
    # coordinator
    BAD_STATEMENT_SIGNATURE = "BAD_STATEMENT_SIGNATURE"
    SEQUENCE_CONFLICT = "SEQUENCE_CONFLICT"
    CHAIN_MISMATCH = "CHAIN_MISMATCH"
    INVALID_STATEMENT = "INVALID_STATEMENT"
    ROLLBACK = "ROLLBACK"  # found by a follower or operator: the served log is shorter than the copy held
    NOT_SERVED = "NOT_SERVED"  # found by the operator: the coordinator does not serve back what it accepted
    # seen by a client when no server answered with a code of its own (transport, limits, gRPC itself)
    WRONG_SERVER = "WRONG_SERVER"  # the server's certificate names another service than the one dialled
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def of(cls, name: str) -> ErrorCode:
        """The member named ``name``; ``UNKNOWN`` for anything else (a client keeps the list closed)."""
        try:
            return cls(name)
        except ValueError:
            return cls.UNKNOWN


# Codes a caller may retry by default: the service could not act now, and may later. An error can say
# otherwise (a key backend that failed for good is SIGNER_UNAVAILABLE, not retryable).
RETRYABLE_BY_DEFAULT: Final = frozenset(
    {
        ErrorCode.STATE_UNAVAILABLE,
        ErrorCode.STATE_CONFLICT,
        ErrorCode.LANES_EXHAUSTED,
        ErrorCode.REGISTRY_STALE,
        ErrorCode.SIGNER_UNAVAILABLE,
        ErrorCode.PARENT_UNREACHABLE,
        ErrorCode.UNAVAILABLE,
        ErrorCode.DEADLINE_EXCEEDED,
    }
)


class ServiceError(CountersignError):
    """A refusal with a code from the closed list (:class:`ErrorCode`) and a message: raised by a
    service, by a client that turns a service's answer back into one, or before any call (a malformed
    handoff). It carries no transport status: a servicer's edge (``countersign._daemon.edge``) picks the
    gRPC status from the code, from one table, when it ends a call with it.

    ``retryable``: whether the same request may succeed later (default: the code's, see
    :data:`RETRYABLE_BY_DEFAULT`); ``details``: extra ``ErrorInfo`` metadata (e.g. a parent's code)."""

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        *,
        retryable: bool | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)  # a name outside the closed list is a bug: ValueError
        self.retryable = self.code in RETRYABLE_BY_DEFAULT if retryable is None else retryable
        self.details = dict(details or {})

    def __repr__(self) -> str:
        return f"ServiceError({self.code}: {self})"
