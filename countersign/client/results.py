"""What the clients answer: plain frozen dataclasses of domain values, never protobuf messages. A
verdict is :class:`countersign.consumer.EvidenceVerdict`, the one shape every check answers with."""

from __future__ import annotations

from dataclasses import dataclass

from countersign.impact import AffectedRecord, LoggedVerdict


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
class ImpactAnswer:
    """A verifier's answer to "what depended on this key, record or deployer?" (``Impact``): every
    affected record and logged verdict, each NEEDS_REVALIDATION. ``truncated``: a lookup hit the
    verifier's limit; ask again with a later ``since_ms``. ``newly_marked``: verdicts this call
    flagged in the log (with ``mark=True``)."""

    records: tuple[AffectedRecord, ...]
    verdicts: tuple[LoggedVerdict, ...]
    truncated: bool
    newly_marked: int
