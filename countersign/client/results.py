"""What the clients answer: plain frozen dataclasses of domain values, never protobuf messages."""

from __future__ import annotations

from dataclasses import dataclass

from countersign.impact import AffectedRecord, LoggedVerdict
from countersign.reasons import Reason, VerificationResult
from countersign.sessions import SessionSummary


@dataclass(frozen=True)
class Grant:
    """A parent deployer's permission for one named child deployer to attach one child under one of
    its records (``SignerClient.open_grant``). The child deployer's runtime passes it, with the parent
    path and the parent signer's address, to ``SignerClient.accept``. It holds nothing secret."""

    grant_id: str
    parent_digest: str  # sha256:<hex> of the parent envelope the grant is for
    parent_key_id: str  # the key the parent's signer will co-sign the edge with
    child_deployer: str
    expires_ms: int  # after this the parent's signer refuses to co-sign under the grant


@dataclass(frozen=True)
class VerifierVerdict:
    """A verifier service's answer to one path: the verification result and the registry sequence
    it was reached at. Truthy exactly when the path was accepted."""

    result: VerificationResult
    registry_sequence: int
    request_id: str = ""  # the idempotency key the request carried ("" for none): retry with it

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def reason(self) -> Reason | None:
        """Why the path was rejected; None on accept."""
        return self.result.reason

    @property
    def retry_of_ms(self) -> int | None:
        """On an ACCEPT that answers a retry of an earlier acceptance (same ``request_id``, same client
        identity): that acceptance's time (0: the verifier's store kept none). None on a first ACCEPT
        and on every reject. A retry consumed nothing: act on the output once, not once per answer."""
        return self.result.retry_of_ms


@dataclass(frozen=True)
class SessionVerifierVerdict:
    """A verifier service's answer to one session (``VerifySession``): the result (its index is the
    position of the first offending receipt), the registry sequence, and on accept (or a reject
    decided after the session verified: ``NONCE_REPLAYED``, ``FANOUT_EXCEEDED``) what the session
    is. ``result.attribution`` names the emitter of the session's last receipt. Truthy exactly when
    the session was accepted."""

    result: VerificationResult
    registry_sequence: int
    session: SessionSummary | None

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def reason(self) -> Reason | None:
        """Why the session was rejected; None on accept."""
        return self.result.reason

    @property
    def retry_of_ms(self) -> int | None:
        """On an ACCEPT that answers a retry (same ``request_id``, same client identity) of a session
        whose every receipt was accepted before: the latest of those acceptances' times. None when
        this answer consumed any receipt, and on every reject. A retry consumed nothing."""
        return self.result.retry_of_ms


@dataclass(frozen=True)
class ImpactAnswer:
    """A verifier's answer to "what depended on this key, record or deployer?" (``Impact``): every
    affected record and logged verdict, each NEEDS_REVALIDATION. ``truncated``: a lookup hit the
    verifier's limit; ask again with a later ``since_ms``. ``newly_marked``: verdicts this call
    flagged in the log (with ``mark=True``)."""

    records: tuple[AffectedRecord, ...]
    verdicts: tuple[LoggedVerdict, ...]
    truncated: bool
    newly_marked: int
