"""A deployer's runtime talking to its own signer: issue roots, local children and receipts, open a
grant for another deployer, accept another deployer's grant (the co-signed delegation).

The signer may run as several replicas (ADR 0033): a client names them all (or one DNS name with
several addresses), sends each signing call with a ``request_id``, and when a replica cannot answer,
retries the call at the next one under the same id, so a retry gets the first answer back and never
a second record (:mod:`countersign.client.failover`). A stream broken mid-way is resumed at the next
replica from its first unanswered chunk, the chunks already signed answered again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import grpc

from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.errors import from_rpc_error
from countersign.client.failover import ReplicaOrder, RetryPolicy, aask_replicas, addresses_of, ask_replicas
from countersign.client.lanes import Lanes, aio_unary, unary
from countersign.client.results import Grant
from countersign.client.runtime_calls import RUNTIME_CALLS, RUNTIME_METHODS, runtime_answer
from countersign.client.tls import TlsConfig, open_aio_channel, open_channel, signer_dns
from countersign.client.verifier import new_request_id
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


def _chunk_receipt(answer: signer_pb2.ChunkReceipt) -> ChunkReceipt:
    return ChunkReceipt(Path.from_bytes(answer.path), answer.seq, answer.units, answer.closed)


class _ResumableStream:
    """One ``StreamReceipts`` call that survives its replica: the pieces sent but not yet covered by a
    receipt are kept, so a broken stream is sent again from its first unanswered chunk (``first_chunk``)
    under the same ``request_id``; the signer answers chunks it signed already with their receipts.

    ``messages()`` is consumed by gRPC on its own thread while the caller reads answers: ``_lock`` keeps
    the two apart, and each attempt's generator stops once a newer attempt began."""

    def __init__(
        self, parent: Path, pieces: Iterable[bytes | tuple[bytes, int]], session: str, unit: str, n: int, close: bool
    ) -> None:
        self._parent, self._session, self._unit, self._n, self._close = parent.to_bytes(), session, unit, n, close
        self._source = iter(pieces)
        self._request_id = new_request_id()
        self._unanswered: deque[tuple[bytes, int]] = deque()  # (data, units) sent, no receipt yet
        self._exhausted = False
        self._attempt = 0
        self._lock = threading.Lock()
        self.receipts: list[ChunkReceipt] = []

    def messages(self) -> Iterator[signer_pb2.OutputChunk]:
        """This attempt's messages: the stream's header, what is unanswered, then the rest as it comes."""
        with self._lock:
            self._attempt += 1
            attempt = self._attempt
            resend = list(self._unanswered)
            first = signer_pb2.OutputChunk(
                parent_path=self._parent, session=self._session, unit=self._unit, n=self._n,
                request_id=self._request_id, first_chunk=len(self.receipts),
            )  # fmt: skip
        yield first
        for data, units in resend:
            yield signer_pb2.OutputChunk(data=data, units=units)
        while True:
            with self._lock:
                if attempt != self._attempt:
                    return  # a newer attempt took over
                if self._exhausted:
                    break
                piece = next(self._source, None)
                if piece is None:
                    self._exhausted = True
                    break
                data, units = (piece, 0) if isinstance(piece, bytes) else piece
                self._unanswered.append((data, len(data) if self._unit == "bytes" else units))
            yield signer_pb2.OutputChunk(data=data, units=units)
        if self._close:
            yield signer_pb2.OutputChunk(close=True)

    def answered(self, answer: signer_pb2.ChunkReceipt) -> None:
        """A receipt arrived: what it covers is no longer kept for a resend."""
        receipt = _chunk_receipt(answer)
        with self._lock:
            self.receipts.append(receipt)
            left = receipt.units
            while left > 0 and self._unanswered:
                data, units = self._unanswered[0]
                if units <= left:
                    self._unanswered.popleft()
                    left -= units
                else:  # bytes: a piece split across chunks keeps its unanswered tail
                    self._unanswered[0] = (data[left:], units - left)
                    left = 0


class _Replica:
    """One address of a deployer's signer: a kept channel, its stub and its runtime lanes."""

    def __init__(self, address: str, tls: TlsConfig, deployer: str, lanes: int, lane_idle_s: float) -> None:
        self.address = address
        self.channel = open_channel(address, tls, signer_dns(deployer))
        self.stub = signer_pb2_grpc.SignerStub(self.channel)
        self.lanes: Lanes[signer_pb2.RuntimeCall, signer_pb2.RuntimeAnswer] | None = (
            Lanes(self.stub.RuntimeCalls, lanes, lane_idle_s, self._unary_call) if lanes > 0 else None
        )

    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        runtime_call = signer_pb2.RuntimeCall(**{RUNTIME_CALLS[method]: request})
        if self.lanes is not None:
            answer = self.lanes.ask(runtime_call, timeout_s)
        else:
            answer = self._unary_call(runtime_call, timeout_s)
        return answer.grant if method == "OpenGrant" else answer.issued

    def _unary_call(self, call: signer_pb2.RuntimeCall, timeout_s: float) -> signer_pb2.RuntimeAnswer:
        kind = call.WhichOneof("call")
        assert kind is not None  # built by call() from RUNTIME_CALLS
        method = RUNTIME_METHODS[kind]
        return runtime_answer(method, unary(getattr(self.stub, method))(getattr(call, kind), timeout_s))

    def stream(self, stream: _ResumableStream, timeout_s: float) -> list[ChunkReceipt]:
        try:
            for answer in self.stub.StreamReceipts(stream.messages(), timeout=timeout_s):
                stream.answered(answer)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return stream.receipts

    def close(self) -> None:
        if self.lanes is not None:
            self.lanes.close()
        self.channel.close()


R = TypeVar("R")


@dataclass
class SignerClient:
    """A deployer's runtime talking to its own signer: over up to ``lanes`` runtime lanes
    (``RuntimeCalls`` streams, ADR 0008) per replica, or with ``lanes=0`` one unary call per request.

    ``address``: the signer's ``host:port``, its replicas' addresses (a list, or one string separated by
    commas), or one DNS name with several addresses. Each call carries a fresh ``request_id``; a call a
    replica cannot answer (its error is retryable) is sent again, under the same id, to the next replica,
    within the call's ``timeout_s`` and ``retry`` (:class:`RetryPolicy`: attempts, each at most its
    ``attempt_timeout_s``, backoff between rounds): the runtime sees one answer, never two records.

    Every method raises :class:`countersign.client.ServiceError` (its ``code`` an
    :class:`countersign.errors.ErrorCode`) when the signer refuses, or no replica answered in time."""

    address: str | Sequence[str]
    tls: TlsConfig
    deployer: str
    lanes: int = 4
    lane_idle_s: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        self._replicas = [_Replica(a, self.tls, self.deployer, self.lanes, self.lane_idle_s) for a in self.addresses]
        self._order = ReplicaOrder(len(self._replicas), self.retry)

    @property
    def addresses(self) -> list[str]:
        """The signer's replicas, in the order they are tried."""
        return addresses_of(self.address)

    def _with_failover(self, ask: Callable[[_Replica, float], R], timeout_s: float, *, whole: bool = False) -> R:
        return ask_replicas(self._order, self._replicas, ask, timeout_s, service="signer", whole=whole)

    def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        if not request.request_id:
            request.request_id = new_request_id()  # one id for every attempt of this call
        return self._with_failover(lambda replica, attempt_s: replica.call(method, request, attempt_s), timeout_s)

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
        at ``parent_signer`` (host:port, or its replicas' separated by commas) under ``grant``."""
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
        ``close`` the close receipt. A replica lost mid-stream is replaced by the next, which carries
        on from the first chunk without a receipt. Raises :class:`ServiceError` as IssueReceipt would."""
        stream = _ResumableStream(parent, pieces, session, unit, n, close)
        return self._with_failover(lambda replica, attempt_s: replica.stream(stream, attempt_s), timeout_s, whole=True)

    def close(self) -> None:
        for replica in self._replicas:
            replica.close()

    def __enter__(self) -> SignerClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class _AsyncReplica:
    def __init__(self, address: str, tls: TlsConfig, deployer: str) -> None:
        self.address = address
        self.channel = open_aio_channel(address, tls, signer_dns(deployer))
        self.stub = signer_pb2_grpc.SignerStub(self.channel)


@dataclass(eq=False)
class AsyncSignerClient:
    """:class:`SignerClient` on ``grpc.aio``, for runtimes that run on an event loop: the same methods
    as coroutines, the same replicas, request ids and failover, the same results and errors. Each call
    is one unary RPC (no lanes). Create it inside the running event loop; close it with
    ``await close()`` or ``async with``."""

    address: str | Sequence[str]
    tls: TlsConfig
    deployer: str
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        self._replicas = [_AsyncReplica(a, self.tls, self.deployer) for a in addresses_of(self.address)]
        self._order = ReplicaOrder(len(self._replicas), self.retry)

    async def _with_failover(
        self, ask: Callable[[_AsyncReplica, float], Awaitable[R]], timeout_s: float, *, whole: bool = False
    ) -> R:
        return await aask_replicas(self._order, self._replicas, ask, timeout_s, service="signer", whole=whole)

    async def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        if not request.request_id:
            request.request_id = new_request_id()

        async def ask(replica: _AsyncReplica, attempt_s: float) -> Any:
            return await aio_unary(getattr(replica.stub, method))(request, attempt_s)

        return await self._with_failover(ask, timeout_s)

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
        """See :meth:`SignerClient.stream_receipts` (``pieces`` is a plain iterable, read as sent)."""
        stream = _ResumableStream(parent, pieces, session, unit, n, close)

        async def ask(replica: _AsyncReplica, attempt_s: float) -> list[ChunkReceipt]:
            try:
                async for answer in replica.stub.StreamReceipts(stream.messages(), timeout=attempt_s):
                    stream.answered(answer)
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None
            return stream.receipts

        return await self._with_failover(ask, timeout_s, whole=True)

    async def close(self) -> None:
        for replica in self._replicas:
            await replica.channel.close()

    async def __aenter__(self) -> AsyncSignerClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()
