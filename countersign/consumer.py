"""What a consumer of evidence gets back, and the offline check that needs the core alone.

:class:`EvidenceVerdict` is the one verdict shape a consumer learns (ADR 0034): the answer to one
path and its output, or to one agent's session, checked offline here or online by a verifier service
(:class:`countersign.client.Consumer`, :class:`countersign.client.VerifierClient`). It is truthy
exactly when the evidence was accepted; then :attr:`EvidenceVerdict.emitter` names who emitted the
output (:class:`OutputEmitter`). A rejected path is a verdict, never an exception.

:func:`verify_offline` and :func:`verify_session_offline` run the core's own verification in this
process; :func:`parse_registry` reads a registry (the format of ``countersign verify --registry``)
from its bytes. Nothing here reads a file, the environment or the clock: the caller passes
``now_ms`` (``countersign.client.Consumer`` passes its clock).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from countersign.errors import ConfigError, MalformedError, PathRejected
from countersign.policy import ConsumerPolicy
from countersign.reasons import Attribution, Reason, VerificationResult
from countersign.records import Path, parse_json
from countersign.registry import Registry
from countersign.sessions import SessionEvidence, SessionSummary, verify_session_evidence
from countersign.state import InMemoryState, VerifierState
from countersign.verify import DEFAULT_POLICY, Mode, OutputDigest, VerifierPolicy, malformed_result
from countersign.verify import verify_path as core_verify_path


@dataclass(frozen=True)
class OutputEmitter:
    """Who emitted a verified output: its receipt's deployer, key and agent, and the deployer of each
    record from the root down (``lineage``). Only set on an accepted verdict."""

    deployer: str  # the deployer whose signer signed the receipt
    key_id: str  # the key it signed with
    agent: str  # the agent instance the receipt speaks for
    system: str  # the agent system (delegation tree) it belongs to
    session: str
    seq: int  # the receipt's place in its session, from 0
    output_sha256: str  # sha256:<hex> of the output bytes
    lineage: tuple[str, ...]  # the deployer of each record, root to leaf

    @classmethod
    def of(cls, attribution: Attribution) -> OutputEmitter:
        """From what a verification proved (the core's, or a verifier service's answer)."""
        emitter, edges = attribution.emitter, attribution.edges
        lineage = (edges[0].parent_deployer, *(edge.deployer for edge in edges)) if edges else (emitter.deployer,)
        return cls(
            deployer=emitter.deployer,
            key_id=emitter.key_id,
            agent=emitter.agent_instance,
            system=emitter.agent_system,
            session=emitter.session,
            seq=emitter.seq,
            output_sha256=emitter.output_sha256,
            lineage=lineage,
        )


@dataclass(frozen=True)
class EvidenceVerdict:
    """The answer to one presented path and output, or to one session. Truthy exactly when accepted.

    ``result``: the verdict with its reason and the offending index (for a session, the position of
    the first offending receipt) and, once the checks held, the :class:`Attribution`.
    ``registry_sequence``: the registry position the verdict was reached at (the verifier's, or the
    registry's offline). ``emitter``: who emitted the output (of a session: its last output), on an
    accept only: a rejected path proves nobody emitted it. ``session``: what a checked session is
    (id, receipts, closed), when the session verified. ``request_id``: the idempotency key an online
    path check carried ("" for none): retry with it."""

    result: VerificationResult
    registry_sequence: int
    emitter: OutputEmitter | None = None
    session: SessionSummary | None = None
    request_id: str = ""

    @classmethod
    def of(
        cls, result: VerificationResult, registry_sequence: int, *, session: SessionSummary | None = None,
        request_id: str = "",
    ) -> EvidenceVerdict:  # fmt: skip
        """The verdict of ``result``: the emitter read from its attribution when it was accepted."""
        emitter = OutputEmitter.of(result.attribution) if result and result.attribution is not None else None
        return cls(result, registry_sequence, emitter, session, request_id)

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def reason(self) -> Reason | None:
        """Why the evidence was rejected; None on accept."""
        return self.result.reason

    @property
    def index(self) -> int | None:
        """The offending record (of a path) or receipt (of a session); None on accept."""
        return self.result.index

    @property
    def detail(self) -> str:
        return self.result.detail

    @property
    def retry_of_ms(self) -> int | None:
        """On an ACCEPT that answers a retry of an earlier acceptance (same ``request_id``, same client
        identity): that acceptance's time (0: the verifier kept none). None otherwise. A retry consumed
        nothing: act on the output once, not once per answer."""
        return self.result.retry_of_ms

    def raise_for_reject(self) -> None:
        """Raise :class:`countersign.errors.PathRejected` unless the evidence was accepted."""
        if not self:
            raise PathRejected(self.result)


def parse_registry(data: bytes, source: str = "the registry") -> Registry:
    """A registry from its JSON bytes (the format of ``countersign verify --registry`` and of
    ``countersign demo --keep-running``'s ``registry.json``). Raises ConfigError naming ``source``."""
    try:
        return Registry.from_json(parse_json(data))
    except MalformedError as exc:
        raise ConfigError(f"{source} is not a registry: {exc}") from None


def verify_offline(
    path: Path | bytes,
    output: bytes | OutputDigest,
    registry: Registry,
    *,
    now_ms: int,
    audit: bool = False,
    state: VerifierState | None = None,
    policy: VerifierPolicy = DEFAULT_POLICY,
    consumer_policy: ConsumerPolicy | None = None,
) -> EvidenceVerdict:
    """The core's verification of ``path`` (a Path, or its bytes as received) for the exact ``output``
    bytes (or their :class:`~countersign.verify.OutputDigest`) against ``registry`` at ``now_ms``.

    ``state`` keeps consumed nonces and child sets between calls; without one, this call starts from
    an empty state, so a replay across calls is not detected (``countersign.client.Consumer`` keeps
    one for its life). ``audit``: consume nothing. ``consumer_policy``: step C (docs/spec.md 16.3); a
    path it refuses consumes nothing. Raises StateUnavailable when a durable ``state`` cannot be
    reached; a rejected path is a verdict."""
    if not isinstance(path, Path):
        try:
            path = Path.from_bytes(path)
        except MalformedError as exc:
            return EvidenceVerdict(malformed_result(exc), registry.sequence)
    result = core_verify_path(
        path, output, registry=registry, state=InMemoryState() if state is None else state,
        mode=Mode.AUDIT if audit else Mode.ACCEPT, now_ms=now_ms, policy=policy, consumer_policy=consumer_policy,
    )  # fmt: skip
    return EvidenceVerdict.of(result, registry.sequence)


SessionInput = SessionEvidence | bytes | Sequence[Path]


def as_session_evidence(session: SessionInput) -> SessionEvidence | bytes:
    """``session`` as evidence: SessionEvidence and its bytes pass through; a sequence of receipt
    paths (what ``Runtime.receipt`` returns, in session order, all under one agent path) becomes the
    agent path and the receipts. Raises ValueError for an empty sequence."""
    if isinstance(session, SessionEvidence | bytes):
        return session
    paths = list(session)
    if not paths:
        raise ValueError("a session has at least one receipt")
    return SessionEvidence(Path(paths[0].envelopes[:-1]), tuple(path.leaf for path in paths))


def verify_session_offline(
    session: SessionInput,
    outputs: Sequence[bytes | OutputDigest | None] | None,
    registry: Registry,
    *,
    now_ms: int,
    audit: bool = False,
    require_closed: bool = False,
    state: VerifierState | None = None,
    policy: VerifierPolicy = DEFAULT_POLICY,
    consumer_policy: ConsumerPolicy | None = None,
) -> EvidenceVerdict:
    """The core's session verification (:func:`countersign.sessions.verify_session`, docs/spec.md
    section 17) of one agent's ``session`` in this process; ``outputs[i]``: the exact bytes of output
    *i* (None: not checked). ``state`` as for :func:`verify_offline`. Raises ValueError when
    ``outputs`` does not have one entry per receipt."""
    evidence = as_session_evidence(session)
    if not isinstance(evidence, SessionEvidence):
        try:
            evidence = SessionEvidence.from_bytes(evidence)
        except MalformedError as exc:
            return EvidenceVerdict(malformed_result(exc), registry.sequence)
    if outputs is not None and len(outputs) != len(evidence.receipts):
        raise ValueError(f"{len(outputs)} outputs for {len(evidence.receipts)} receipts")
    result = verify_session_evidence(
        evidence, outputs, registry=registry, state=InMemoryState() if state is None else state,
        mode=Mode.AUDIT if audit else Mode.ACCEPT, now_ms=now_ms, require_closed=require_closed, policy=policy,
        consumer_policy=consumer_policy,
    )  # fmt: skip
    summary = SessionSummary.of(evidence) if result.attribution is not None else None
    return EvidenceVerdict.of(result, registry.sequence, session=summary)
