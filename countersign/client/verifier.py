"""A consumer of the verifier service: present a path and the exact output bytes, get a verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import grpc

from countersign._proto.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from countersign.client.errors import from_rpc_error
from countersign.client.lanes import Lanes, unary
from countersign.client.results import SessionVerifierVerdict, VerifierVerdict
from countersign.client.tls import TlsConfig, open_aio_channel, open_channel, verifier_dns
from countersign.reasons import Attribution, Emitter, ProvenEdge, Reason, Verdict, VerificationResult
from countersign.records import BindingScope, Construction, CoSignature, CoSignerRole, Path
from countersign.sessions import SessionEvidence, SessionSummary


def _request(
    path: Path | bytes, output: bytes, audit: bool, request_id: str, policy: str
) -> verifier_pb2.VerifyPathRequest:
    mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
    data = path.to_bytes() if isinstance(path, Path) else path
    return verifier_pb2.VerifyPathRequest(path=data, output=output, mode=mode, request_id=request_id, policy=policy)


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


def _verdict(response: verifier_pb2.VerifyPathResponse) -> VerifierVerdict:
    verdict = response.verdict
    attribution = (
        _attribution(response.attribution, response.registry_sequence) if response.HasField("attribution") else None
    )
    if verdict.verdict == verdict.ACCEPT:
        return VerifierVerdict(VerificationResult.accept(attribution), response.registry_sequence)
    result = VerificationResult(
        Verdict.REJECT, Reason(verdict.reason), None if verdict.index < 0 else verdict.index, verdict.detail,
        attribution,
    )  # fmt: skip
    return VerifierVerdict(result, response.registry_sequence)


def _session_request(
    session: SessionEvidence | bytes,
    outputs: Sequence[bytes | None] | None,
    audit: bool,
    require_closed: bool,
    request_id: str,
) -> verifier_pb2.VerifySessionRequest:
    mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
    data = session.to_bytes() if isinstance(session, SessionEvidence) else session
    presented = [
        verifier_pb2.SessionOutput(absent=True) if o is None else verifier_pb2.SessionOutput(data=o)
        for o in outputs or ()
    ]
    return verifier_pb2.VerifySessionRequest(
        session=data, outputs=presented, mode=mode, require_closed=require_closed, request_id=request_id
    )


def _session_verdict(response: verifier_pb2.VerifySessionResponse) -> SessionVerifierVerdict:
    verdict = response.verdict
    attribution = (
        _attribution(response.attribution, response.registry_sequence) if response.HasField("attribution") else None
    )
    facts = response.session
    summary = SessionSummary(facts.session, facts.receipts, facts.closed) if response.HasField("session") else None
    if verdict.verdict == verdict.ACCEPT:
        return SessionVerifierVerdict(VerificationResult.accept(attribution), response.registry_sequence, summary)
    result = VerificationResult(
        Verdict.REJECT, Reason(verdict.reason), None if verdict.index < 0 else verdict.index, verdict.detail,
        attribution,
    )  # fmt: skip
    return SessionVerifierVerdict(result, response.registry_sequence, summary)


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
        self._lanes: Lanes[verifier_pb2.VerifyPathRequest, verifier_pb2.VerifyPathResponse] | None = (
            Lanes(self._stub.VerifyPaths, self.lanes, self.lane_idle_s, self._unary) if self.lanes > 0 else None
        )

    def verify(
        self,
        path: Path | bytes,
        output: bytes,
        *,
        audit: bool = False,
        timeout_s: float = 10.0,
        request_id: str = "",
        policy: str = "",
    ) -> VerifierVerdict:
        """The verifier's verdict on ``path`` (a Path, or its bytes as received) for the exact
        ``output`` bytes. Accept mode consumes the leaf nonce, so a second presentation is
        ``NONCE_REPLAYED``; ``audit=True`` checks without consuming. ``request_id``: an idempotency key
        for retrying an accept-mode request (docs/api.md). ``policy``: the name of a consumer policy
        configured on the verifier (spec section 16; empty: none). A rejected path is a verdict, not an error;
        raises ServiceError when the verifier refuses the request or cannot be reached."""
        ask = self._lanes.ask if self._lanes is not None else self._unary
        return _verdict(ask(_request(path, output, audit, request_id, policy), timeout_s))

    def verify_session(
        self,
        session: SessionEvidence | bytes,
        outputs: Sequence[bytes | None] | None = None,
        *,
        audit: bool = False,
        require_closed: bool = False,
        timeout_s: float = 30.0,
        request_id: str = "",
    ) -> SessionVerifierVerdict:
        """The verifier's verdict on one agent's session (``VerifySession``, docs/spec.md 17.5):
        ``session`` (SessionEvidence, or its JSON bytes), and optionally ``outputs[i]``, the exact
        bytes of receipt *i*'s output (None: not checked; the list, when given, has one entry per
        receipt). Accept mode consumes every receipt's nonce, all or nothing; ``audit=True`` consumes
        nothing. ``require_closed``: the session must end with its close receipt. A rejected session
        is a verdict; raises ServiceError when the verifier refuses the request (for instance more
        receipts than it takes in one request: INVALID_ARGUMENT) or cannot be reached."""
        request = _session_request(session, outputs, audit, require_closed, request_id)
        return _session_verdict(self._verify_session(request, timeout_s))

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
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)

    async def verify(
        self,
        path: Path | bytes,
        output: bytes,
        *,
        audit: bool = False,
        timeout_s: float = 10.0,
        request_id: str = "",
        policy: str = "",
    ) -> VerifierVerdict:
        """See :meth:`VerifierClient.verify`."""
        try:
            response = await self._stub.VerifyPath(_request(path, output, audit, request_id, policy), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return _verdict(response)

    async def verify_session(
        self,
        session: SessionEvidence | bytes,
        outputs: Sequence[bytes | None] | None = None,
        *,
        audit: bool = False,
        require_closed: bool = False,
        timeout_s: float = 30.0,
        request_id: str = "",
    ) -> SessionVerifierVerdict:
        """See :meth:`VerifierClient.verify_session`."""
        request = _session_request(session, outputs, audit, require_closed, request_id)
        try:
            response = await self._stub.VerifySession(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return _session_verdict(response)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncVerifierClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()
