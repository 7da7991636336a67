"""A deployer's runtime talking to its own signer: issue roots, local children and receipts, open a
grant for another deployer, accept another deployer's grant (the co-signed delegation)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc

from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.errors import from_rpc_error
from countersign.client.lanes import Lanes, unary
from countersign.client.results import Grant
from countersign.client.runtime_calls import RUNTIME_CALLS, RUNTIME_METHODS, runtime_answer
from countersign.client.tls import TlsConfig, open_aio_channel, open_channel, signer_dns
from countersign.records import Path

# --- requests and answers, shared by the sync and the asyncio client --------------------------


def _agent(
    instance: str,
    *,
    system: str = "",
    ttl_ms: int,
    max_children: int,
    allowed_children: Collection[str] | None = None,
) -> signer_pb2.AgentFields:
    return signer_pb2.AgentFields(
        instance=instance, system=system, ttl_ms=ttl_ms, max_children=max_children,
        allowed_children=list(allowed_children or ()), restrict_children=allowed_children is not None,
    )  # fmt: skip


def _root_request(
    instance: str, system: str, ttl_ms: int, max_children: int, allowed_children: Collection[str] | None
) -> signer_pb2.IssueRootRequest:
    agent = _agent(instance, system=system, ttl_ms=ttl_ms, max_children=max_children, allowed_children=allowed_children)
    return signer_pb2.IssueRootRequest(agent=agent)


def _receipt_request(
    parent: Path, output_sha256: bytes, session: str, binding_scope: str
) -> signer_pb2.IssueReceiptRequest:
    return signer_pb2.IssueReceiptRequest(
        parent_path=parent.to_bytes(), output_sha256=output_sha256, binding_scope=binding_scope, session=session
    )


def _local_child_request(
    parent: Path, instance: str, ttl_ms: int, max_children: int, allowed_children: Collection[str] | None
) -> signer_pb2.IssueLocalChildRequest:
    agent = _agent(instance, ttl_ms=ttl_ms, max_children=max_children, allowed_children=allowed_children)
    return signer_pb2.IssueLocalChildRequest(parent_path=parent.to_bytes(), agent=agent)


def _open_grant_request(parent: Path, child_deployer: str, ttl_ms: int) -> signer_pb2.OpenGrantRequest:
    return signer_pb2.OpenGrantRequest(parent_path=parent.to_bytes(), child_deployer=child_deployer, ttl_ms=ttl_ms)


def _accept_request(
    parent: Path, grant: Grant, parent_signer: str, instance: str, ttl_ms: int, max_children: int
) -> signer_pb2.AcceptDelegationRequest:
    return signer_pb2.AcceptDelegationRequest(
        parent_path=parent.to_bytes(),
        grant_id=grant.grant_id,
        parent_key_id=grant.parent_key_id,
        parent_signer=parent_signer,
        agent=_agent(instance, ttl_ms=ttl_ms, max_children=max_children),
    )


def _grant(response: signer_pb2.OpenGrantResponse, child_deployer: str) -> Grant:
    return Grant(
        grant_id=response.grant_id,
        parent_digest=response.parent_digest,
        parent_key_id=response.parent_key_id,
        child_deployer=child_deployer,
        expires_ms=response.expires_ms,
    )


def _path(response: signer_pb2.IssueResponse) -> Path:
    return Path.from_bytes(response.path)


@dataclass(frozen=True, slots=True)
class ChunkReceipt:
    """One receipt of a stream (docs/spec.md 17.6): the path to it, its place in the session, the
    units it covers (0 for the close receipt), and whether it is the session's close receipt."""

    path: Path
    seq: int
    units: int
    closed: bool


def _close_request(parent: Path, session: str, ttl_ms: int) -> signer_pb2.CloseSessionRequest:
    return signer_pb2.CloseSessionRequest(parent_path=parent.to_bytes(), session=session, ttl_ms=ttl_ms)


def _output_chunks(
    parent: Path, pieces: Iterable[bytes | tuple[bytes, int]], session: str, unit: str, n: int, close: bool
) -> Iterator[signer_pb2.OutputChunk]:
    """The stream's messages: the first names the stream, each carries a piece (bytes, or bytes with
    its token count), and with ``close`` a last message closes the session."""
    yield signer_pb2.OutputChunk(parent_path=parent.to_bytes(), session=session, unit=unit, n=n)
    for piece in pieces:
        yield _piece(piece)
    if close:
        yield signer_pb2.OutputChunk(close=True)


def _piece(piece: bytes | tuple[bytes, int]) -> signer_pb2.OutputChunk:
    data, units = (piece, 0) if isinstance(piece, bytes) else piece
    return signer_pb2.OutputChunk(data=data, units=units)


def _chunk_receipt(answer: signer_pb2.ChunkReceipt) -> ChunkReceipt:
    return ChunkReceipt(Path.from_bytes(answer.path), answer.seq, answer.units, answer.closed)


# --- clients ----------------------------------------------------------------------------------


@dataclass
class SignerClient:
    """A deployer's runtime talking to its own signer: over up to ``lanes`` runtime lanes
    (``RuntimeCalls`` streams, ADR 0008), or with ``lanes=0`` one unary call per request.

    Every method raises :class:`countersign.client.ServiceError` (its ``code`` an
    :class:`countersign.errors.ErrorCode`) when the signer refuses or cannot be reached."""

    address: str
    tls: TlsConfig
    deployer: str
    lanes: int = 4
    lane_idle_s: float = 1.0

    def __post_init__(self) -> None:
        self._channel = open_channel(self.address, self.tls, signer_dns(self.deployer))
        self._stub = signer_pb2_grpc.SignerStub(self._channel)
        self._lanes: Lanes[signer_pb2.RuntimeCall, signer_pb2.RuntimeAnswer] | None = (
            Lanes(self._stub.RuntimeCalls, self.lanes, self.lane_idle_s, self._unary_call) if self.lanes > 0 else None
        )

    def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        call = signer_pb2.RuntimeCall(**{RUNTIME_CALLS[method]: request})
        answer = self._lanes.ask(call, timeout_s) if self._lanes is not None else self._unary_call(call, timeout_s)
        return answer.grant if method == "OpenGrant" else answer.issued

    def _unary_call(self, call: signer_pb2.RuntimeCall, timeout_s: float) -> signer_pb2.RuntimeAnswer:
        kind = call.WhichOneof("call")
        assert kind is not None  # built by _call from RUNTIME_CALLS
        method = RUNTIME_METHODS[kind]
        return runtime_answer(method, unary(getattr(self._stub, method))(getattr(call, kind), timeout_s))

    def root(
        self,
        instance: str,
        system: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """A root record (depth 0) for a new agent instance of ``system``. ``allowed_children``: the
        only deployers it may delegate to (None: no restriction)."""
        return _path(self._call("IssueRoot", _root_request(instance, system, ttl_ms, max_children, allowed_children)))

    def receipt(
        self, parent: Path, output_sha256: bytes, *, session: str = "", binding_scope: str = "per_turn"
    ) -> Path:
        """An output receipt under ``parent`` for the output whose SHA-256 is ``output_sha256``."""
        return _path(self._call("IssueReceipt", _receipt_request(parent, output_sha256, session, binding_scope)))

    def local_child(
        self,
        parent: Path,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """A same-deployer child record under ``parent`` (a record this signer issued)."""
        request = _local_child_request(parent, instance, ttl_ms, max_children, allowed_children)
        return _path(self._call("IssueLocalChild", request))

    def open_grant(self, parent: Path, child_deployer: str, *, ttl_ms: int = 60_000) -> Grant:
        """Allow ``child_deployer`` to attach one child under ``parent`` within ``ttl_ms``."""
        return _grant(self._call("OpenGrant", _open_grant_request(parent, child_deployer, ttl_ms)), child_deployer)

    def accept(
        self,
        parent: Path,
        grant: Grant,
        parent_signer: str,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        timeout_s: float = 10.0,
    ) -> Path:
        """The child record under another deployer's ``parent``, co-signed by that deployer's signer
        at ``parent_signer`` (host:port) under ``grant``."""
        request = _accept_request(parent, grant, parent_signer, instance, ttl_ms, max_children)
        return _path(self._call("AcceptDelegation", request, timeout_s))

    def close_session(self, parent: Path, *, session: str = "", ttl_ms: int = 0, timeout_s: float = 10.0) -> Path:
        """Close ``session`` (empty: the parent's agent instance) of ``parent``: the path to its close
        receipt, which commits to the session's count and last receipt. No receipt is issued for the
        session afterwards (``SESSION_CLOSED``); closing it again answers the same close receipt."""
        return _path(self._call("CloseSession", _close_request(parent, session, ttl_ms), timeout_s))

    def stream_receipts(
        self,
        parent: Path,
        pieces: Iterable[bytes | tuple[bytes, int]],
        *,
        session: str,
        unit: str = "bytes",
        n: int = 4096,
        close: bool = False,
        timeout_s: float = 60.0,
    ) -> list[ChunkReceipt]:
        """Send a stream's ``pieces`` as they are emitted (bytes; for ``unit="tokens"`` each with its
        token count) and receive one receipt per ``n`` units, the rest in a short last chunk, and with
        ``close`` the close receipt. Raises :class:`ServiceError` as IssueReceipt would."""
        requests = _output_chunks(parent, pieces, session, unit, n, close)
        try:
            return [_chunk_receipt(a) for a in self._stub.StreamReceipts(requests, timeout=timeout_s)]
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._channel.close()

    def __enter__(self) -> SignerClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


@dataclass(eq=False)
class AsyncSignerClient:
    """:class:`SignerClient` on ``grpc.aio``, for runtimes that run on an event loop: the same methods
    as coroutines, the same results and errors. Each call is one unary RPC (no lanes). Create it inside
    the running event loop; close it with ``await close()`` or ``async with``."""

    address: str
    tls: TlsConfig
    deployer: str

    def __post_init__(self) -> None:
        self._channel = open_aio_channel(self.address, self.tls, signer_dns(self.deployer))
        self._stub = signer_pb2_grpc.SignerStub(self._channel)

    async def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def root(
        self,
        instance: str,
        system: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """See :meth:`SignerClient.root`."""
        request = _root_request(instance, system, ttl_ms, max_children, allowed_children)
        return _path(await self._call("IssueRoot", request))

    async def receipt(
        self, parent: Path, output_sha256: bytes, *, session: str = "", binding_scope: str = "per_turn"
    ) -> Path:
        """See :meth:`SignerClient.receipt`."""
        return _path(await self._call("IssueReceipt", _receipt_request(parent, output_sha256, session, binding_scope)))

    async def local_child(
        self,
        parent: Path,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """See :meth:`SignerClient.local_child`."""
        request = _local_child_request(parent, instance, ttl_ms, max_children, allowed_children)
        return _path(await self._call("IssueLocalChild", request))

    async def open_grant(self, parent: Path, child_deployer: str, *, ttl_ms: int = 60_000) -> Grant:
        """See :meth:`SignerClient.open_grant`."""
        response = await self._call("OpenGrant", _open_grant_request(parent, child_deployer, ttl_ms))
        return _grant(response, child_deployer)

    async def accept(
        self,
        parent: Path,
        grant: Grant,
        parent_signer: str,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        timeout_s: float = 10.0,
    ) -> Path:
        """See :meth:`SignerClient.accept`."""
        request = _accept_request(parent, grant, parent_signer, instance, ttl_ms, max_children)
        return _path(await self._call("AcceptDelegation", request, timeout_s))

    async def close_session(self, parent: Path, *, session: str = "", ttl_ms: int = 0, timeout_s: float = 10.0) -> Path:
        """See :meth:`SignerClient.close_session`."""
        return _path(await self._call("CloseSession", _close_request(parent, session, ttl_ms), timeout_s))

    async def stream_receipts(
        self,
        parent: Path,
        pieces: Iterable[bytes | tuple[bytes, int]],
        *,
        session: str,
        unit: str = "bytes",
        n: int = 4096,
        close: bool = False,
        timeout_s: float = 60.0,
    ) -> list[ChunkReceipt]:
        """See :meth:`SignerClient.stream_receipts`."""
        requests = _output_chunks(parent, pieces, session, unit, n, close)
        try:
            return [_chunk_receipt(a) async for a in self._stub.StreamReceipts(requests, timeout=timeout_s)]
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncSignerClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()
