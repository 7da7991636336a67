"""What the clients answer: plain frozen dataclasses of domain values, never protobuf messages. A
verdict is :class:`countersign.consumer.EvidenceVerdict`, the one shape every check answers with."""

from __future__ import annotations

from dataclasses import dataclass

from countersign.handoff import Grant
from countersign.impact import AffectedRecord, LoggedVerdict

__all__ = ["Grant", "ImpactAnswer"]  # Grant lives with the handoff it travels in (countersign.handoff)


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
