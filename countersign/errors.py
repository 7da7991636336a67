"""Exception types of the protocol core.

A rejected path is data (:class:`countersign.reasons.VerificationResult`), not an exception. The
exceptions here separate three things a caller must never confuse:

* :class:`MalformedError`: the input cannot be a protocol object (becomes ``MALFORMED``);
* :class:`PathRejected`: raised only by the convenience call that turns a reject into an exception;
* :class:`VerificationError`: the check could not run (a store or registry was unavailable). It is
  retryable and is never an accept and never a reject.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
