"""A consumer of the verifier service: present a path and the exact output bytes, get a verdict."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from countersign._clock import now_ms
from countersign._proto.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from countersign.client.lanes import Lanes, aio_unary, unary
from countersign.client.results import ImpactAnswer
from countersign.client.tls import TlsConfig, open_aio_channel, open_channel, verifier_dns
from countersign.consumer import EvidenceVerdict
from countersign.errors import MalformedError
from countersign.impact import AffectedRecord, LoggedVerdict
from countersign.policy import ConsumerPolicy
from countersign.reasons import Attribution, Emitter, ProvenEdge, Reason, Verdict, VerificationResult
from countersign.records import BindingScope, Construction, CoSignature, CoSignerRole, Path
from countersign.sessions import SessionEvidence, SessionSummary, session_policy_refusal
from countersign.verify import OutputDigest, presented_policy_refusal, refusal_after_audit


def new_request_id() -> str:
    """A fresh idempotency key: 128 random bits in hex. Never derive one from the path or the output
    (docs/api.md): two logical requests for the same path would then be each other's retries."""
    return secrets.token_hex(16)


def _key(request_id: str | None) -> str:
    """The key to send: ``None`` (the default) draws a fresh one; ``""`` sends none."""
    return new_request_id() if request_id is None else request_id


def _request(
    path: Path | bytes, output: bytes | OutputDigest, audit: bool, request_id: str, policy: str
) -> verifier_pb2.VerifyPathRequest:
    mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
    data = path.to_bytes() if isinstance(path, Path) else path
    # The output never travels (ADR 0027): its SHA-256, hashed here, gets the verdict its bytes would,
    # in a request of the same small size whatever the output's.
    digest = output if isinstance(output, OutputDigest) else OutputDigest.of(output)
    return verifier_pb2.VerifyPathRequest(
        path=data, output_sha256=digest.sha256, mode=mode, request_id=request_id, policy=policy
    )


# --- a consumer's own policy (docs/spec.md 16.4): judged here on the evidence as presented; what it
# refuses is asked in audit mode, so it consumes nothing, and is refused once the verifier's checks held.


def _path_refusal(path: Path | bytes, consumer_policy: ConsumerPolicy | None) -> VerificationResult | None:
    if consumer_policy is None:
        return None
    if not isinstance(path, Path):
        try:
            path = Path.from_bytes(path)
        except MalformedError:  # the verifier answers MALFORMED, consuming nothing
            return None
    return presented_policy_refusal(path, consumer_policy, now_ms())


def _session_refusal(
    session: SessionEvidence | bytes, consumer_policy: ConsumerPolicy | None
) -> VerificationResult | None:
    if consumer_policy is None:
        return None
    if not isinstance(session, SessionEvidence):
        try:
            session = SessionEvidence.from_bytes(session)
        except MalformedError:
            return None
    return session_policy_refusal(session, consumer_policy, 0, now_ms())


def _refused(verdict: EvidenceVerdict, refusal: VerificationResult | None) -> EvidenceVerdict:
    """The verifier's verdict, or, when the consumer's policy refused the evidence, its refusal once
    the verifier's (audit-mode) checks held (a reject names no emitter)."""
    if refusal is None:
        return verdict
    return EvidenceVerdict.of(
        refusal_after_audit(verdict.result, refusal), verdict.registry_sequence, session=verdict.session,
        request_id=verdict.request_id,
    )  # fmt: skip


def _attribution(message: common_pb2.Attribution, registry_sequence: int) -> Attribution:
    """The core's Attribution from the service's message (what the verifier proved about the path)."""
    e = message.emitter
    emitter = Emitter(
        e.index, e.deployer, e.key_id, e.agent_instance, e.agent_system, Construction(e.construction),
        e.created_ms, e.output_sha256, BindingScope(e.binding_scope), e.session, e.seq,
    )  # fmt: skip
    edges = tuple(
        ProvenEdge(
            edge.index,
            edge.parent_deployer,
            edge.parent_key_id,
            edge.deployer,
            edge.key_id,
            Construction(edge.construction),
            edge.cross_deployer,
            tuple(CoSignature(CoSignerRole(c.role), c.deployer, c.key_id, c.sig) for c in edge.cosigners),
        )
        for edge in message.edges
    )
    return Attribution(emitter, edges, registry_sequence)


def _result(response: verifier_pb2.VerifyPathResponse | verifier_pb2.VerifySessionResponse) -> VerificationResult:
    """The verdict of a path or session answer, with its attribution and, on a retry, the acceptance
    it repeats."""
    verdict = response.verdict
    attribution = (
        _attribution(response.attribution, response.registry_sequence) if response.HasField("attribution") else None
    )
    if verdict.verdict == verdict.ACCEPT:
        retry_of = response.retry_of.accepted_ms if response.HasField("retry_of") else None
        return VerificationResult.accept(attribution, retry_of_ms=retry_of)
    return VerificationResult(
        Verdict.REJECT, Reason(verdict.reason), None if verdict.index < 0 else verdict.index, verdict.detail,
        attribution,
    )  # fmt: skip


def _verdict(response: verifier_pb2.VerifyPathResponse, request_id: str) -> EvidenceVerdict:
    return EvidenceVerdict.of(_result(response), response.registry_sequence, request_id=request_id)


def _session_request(
    session: SessionEvidence | bytes,
    outputs: Sequence[bytes | OutputDigest | None] | None,
    audit: bool,
    require_closed: bool,
    request_id: str,
    policy: str,
) -> verifier_pb2.VerifySessionRequest:
    mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
    data = session.to_bytes() if isinstance(session, SessionEvidence) else session
    # Each output travels as its SHA-256, hashed here (ADR 0027): a session's outputs may be large.
    presented = [
        verifier_pb2.SessionOutput(absent=True)
        if o is None
        else verifier_pb2.SessionOutput(sha256=OutputDigest.of(o).sha256 if isinstance(o, bytes) else o.sha256)
        for o in outputs or ()
    ]
    return verifier_pb2.VerifySessionRequest(
        session=data, outputs=presented, mode=mode, require_closed=require_closed, request_id=request_id, policy=policy
    )


def _session_verdict(response: verifier_pb2.VerifySessionResponse, request_id: str) -> EvidenceVerdict:
    facts = response.session
    summary = SessionSummary(facts.session, facts.receipts, facts.closed) if response.HasField("session") else None
    return EvidenceVerdict.of(_result(response), response.registry_sequence, session=summary, request_id=request_id)


def _impact_request(
    key_id: str | None, record_digest: str | None, deployer: str | None, since_ms: int, mark: bool
) -> verifier_pb2.ImpactRequest:
    """Exactly one query. Raises ValueError otherwise (a caller's mistake, not a verifier's refusal)."""
    given = {"key_id": key_id, "record_digest": record_digest, "deployer": deployer}
    named = {field: value for field, value in given.items() if value is not None}
    if len(named) != 1:
        raise ValueError("impact takes exactly one of key_id, record_digest and deployer")
    return verifier_pb2.ImpactRequest(**named, since_ms=since_ms, mark=mark)


def _impact_answer(response: verifier_pb2.ImpactResponse) -> ImpactAnswer:
    return ImpactAnswer(
        records=tuple(
            AffectedRecord(r.digest, tuple(r.depends_on), r.seed, r.deployer, r.key_id) for r in response.records
        ),
        verdicts=tuple(
            LoggedVerdict(
                v.verdict_id,
                v.request_id,
                v.time_ms,
                v.result,
                tuple(v.records),
                v.mode,
                v.client,
                v.registry_sequence,
                tuple(v.path),
                v.marked_in_log,
                v.cause,
            )
            for v in response.verdicts
        ),
        truncated=response.truncated,
        newly_marked=response.newly_marked,
    )


@dataclass
class VerifierClient:
    """A consumer of the verifier service: over up to ``lanes`` verification lanes (``VerifyPaths``
    streams, ADR 0008), or with ``lanes=0`` one unary ``VerifyPath`` call per path."""

    address: str
    tls: TlsConfig
    lanes: int = 4
    lane_idle_s: float = 1.0

    def __post_init__(self) -> None:
        self._channel = open_channel(self.address, self.tls, verifier_dns())
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._unary = unary(self._stub.VerifyPath)
        self._verify_session = unary(self._stub.VerifySession)
        self._impact = unary(self._stub.Impact)
        self._lanes: Lanes[verifier_pb2.VerifyPathRequest, verifier_pb2.VerifyPathResponse] | None = (
            Lanes(self._stub.VerifyPaths, self.lanes, self.lane_idle_s, self._unary) if self.lanes > 0 else None
        )

    def verify(
        self,
        path: Path | bytes,
        output: bytes | OutputDigest,
        *,
        audit: bool = False,
        timeout_s: float = 10.0,
        request_id: str | None = None,
        policy: str = "",
        consumer_policy: ConsumerPolicy | None = None,
    ) -> EvidenceVerdict:
        """The verifier's verdict on ``path`` (a Path, or its bytes as received) for the exact
        ``output`` bytes, or their :class:`~countersign.verify.OutputDigest` (the client always sends
        only the SHA-256, hashing bytes locally; ADR 0027). Accept mode consumes the leaf nonce, so a
        second presentation is ``NONCE_REPLAYED``; ``audit=True`` checks without consuming.
        ``request_id``: the idempotency key of this logical request (docs/api.md); by default a fresh
        random 128-bit one, returned as the verdict's ``request_id``: pass it again to retry this request
        after a lost answer (the answer is then marked ``retry_of_ms``); ``""`` sends none. ``policy``: the
        name of a consumer policy configured on the verifier (spec section 16; empty: none).
        ``consumer_policy``: the caller's own policy (:func:`countersign.policy.parse_policy`), applied in
        this process as spec 16.4 says: a path it refuses is asked in audit mode, so it consumes nothing,
        and is ``CONSUMER_POLICY_VIOLATION`` once the verifier's checks held (their reject otherwise): the
        verdict the same policy gives offline. A rejected path is a verdict, not an error; raises
        ServiceError when the verifier refuses the request or cannot be reached."""
        ask = self._lanes.ask if self._lanes is not None else self._unary
        key = _key(request_id)
        refusal = _path_refusal(path, consumer_policy)
        request = _request(path, output, audit or refusal is not None, key, policy)
        return _refused(_verdict(ask(request, timeout_s), key), refusal)

    def verify_session(
        self,
        session: SessionEvidence | bytes,
        outputs: Sequence[bytes | OutputDigest | None] | None = None,
        *,
        audit: bool = False,
        require_closed: bool = False,
        timeout_s: float = 30.0,
        request_id: str = "",
        policy: str = "",
        consumer_policy: ConsumerPolicy | None = None,
    ) -> EvidenceVerdict:
        """The verifier's verdict on one agent's session (``VerifySession``, docs/spec.md 17.5):
        ``session`` (SessionEvidence, or its JSON bytes), and optionally ``outputs[i]``, the exact
        bytes of receipt *i*'s output (None: not checked; the list, when given, has one entry per
        receipt). Accept mode consumes every receipt's nonce, all or nothing; ``audit=True`` consumes
        nothing. ``require_closed``: the session must end with its close receipt. A rejected session
        is a verdict; raises ServiceError when the verifier refuses the request (for instance more
        receipts than it takes in one request: INVALID_ARGUMENT) or cannot be reached. ``policy``: the
        name of a consumer policy configured on the verifier, applied to each receipt's path (spec
        16.3; empty: none; an unknown name is INVALID_ARGUMENT). ``consumer_policy``: the caller's own,
        applied in this process as for :meth:`verify` (spec 16.4)."""
        refusal = _session_refusal(session, consumer_policy)
        request = _session_request(session, outputs, audit or refusal is not None, require_closed, request_id, policy)
        return _refused(_session_verdict(self._verify_session(request, timeout_s), request_id), refusal)

    def impact(
        self,
        *,
        key_id: str | None = None,
        record_digest: str | None = None,
        deployer: str | None = None,
        since_ms: int = 0,
        mark: bool = False,
        timeout_s: float = 30.0,
    ) -> ImpactAnswer:
        """What depended on a key (``key_id``: records it signed or co-signed), a record
        (``record_digest``) or a deployer, according to the verifier's verdict log (``Impact``,
        docs/api.md): give exactly one (else ValueError). ``since_ms``: only verdicts logged from then
        on. ``mark``: also flag the affected verdicts NEEDS_REVALIDATION in the log (nothing is
        deleted). A client certificate (a consumer) is answered from its own verdicts only and may not
        mark; auditor and operator certificates see and mark the whole log. Raises ServiceError when
        refused (``NOT_AUTHORISED``)."""
        return _impact_answer(self._impact(_impact_request(key_id, record_digest, deployer, since_ms, mark), timeout_s))

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._channel.close()

    def __enter__(self) -> VerifierClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


@dataclass(eq=False)
class AsyncVerifierClient:
    """:class:`VerifierClient` on ``grpc.aio``: the same ``verify`` as a coroutine, the same verdict and
    errors. Each path is one unary ``VerifyPath`` call (no lanes). Create it inside the running event
    loop; close it with ``await close()`` or ``async with``."""

    address: str
    tls: TlsConfig

    def __post_init__(self) -> None:
        self._channel = open_aio_channel(self.address, self.tls, verifier_dns())
        stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._verify_path = aio_unary(stub.VerifyPath)
        self._verify_session = aio_unary(stub.VerifySession)
        self._impact = aio_unary(stub.Impact)

    async def verify(
        self,
        path: Path | bytes,
        output: bytes | OutputDigest,
        *,
        audit: bool = False,
        timeout_s: float = 10.0,
        request_id: str | None = None,
        policy: str = "",
        consumer_policy: ConsumerPolicy | None = None,
    ) -> EvidenceVerdict:
        """See :meth:`VerifierClient.verify`."""
        key = _key(request_id)
        refusal = _path_refusal(path, consumer_policy)
        request = _request(path, output, audit or refusal is not None, key, policy)
        return _refused(_verdict(await self._verify_path(request, timeout_s), key), refusal)

    async def verify_session(
        self,
        session: SessionEvidence | bytes,
        outputs: Sequence[bytes | OutputDigest | None] | None = None,
        *,
        audit: bool = False,
        require_closed: bool = False,
        timeout_s: float = 30.0,
        request_id: str = "",
        policy: str = "",
        consumer_policy: ConsumerPolicy | None = None,
    ) -> EvidenceVerdict:
        """See :meth:`VerifierClient.verify_session`."""
        refusal = _session_refusal(session, consumer_policy)
        request = _session_request(session, outputs, audit or refusal is not None, require_closed, request_id, policy)
        return _refused(_session_verdict(await self._verify_session(request, timeout_s), request_id), refusal)

    async def impact(
        self,
        *,
        key_id: str | None = None,
        record_digest: str | None = None,
        deployer: str | None = None,
        since_ms: int = 0,
        mark: bool = False,
        timeout_s: float = 30.0,
    ) -> ImpactAnswer:
        """See :meth:`VerifierClient.impact`."""
        request = _impact_request(key_id, record_digest, deployer, since_ms, mark)
        return _impact_answer(await self._impact(request, timeout_s))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncVerifierClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()
