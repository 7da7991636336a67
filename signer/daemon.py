"""The signer daemon: the only holder of a deployer's key, run as one or more replicas over one state.

Its runtime asks it to sign root records, local children and output receipts, and to open grants
for named child deployers. A child deployer's signer asks it to co-sign an edge manifest; it co-signs
only an edge that spends an open grant of its own runtime and keeps its policy. When this signer is
the child, it asks the parent's signer over mTLS and fails closed on refusal, timeout or outage,
leaving no record behind.

Every signing call has one shape (ADR 0033): read what it needs from the state, decide in the core
(:mod:`countersign.cosigning`), sign, and write once, conditionally (:mod:`countersign.signer_state`).
A write another replica overtook is decided again from a fresh read; concurrent calls' writes share
one durable commit (group commit). A call carrying a ``request_id`` is answered once: a retry, on
this replica or another, gets the first answer back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import grpc
import prometheus_client

from countersign._clock import now_ms
from countersign._daemon.config import parse_addresses, parse_operator_key
from countersign._daemon.edge import refusal_error, servicer_edge, stream_edge
from countersign._daemon.group_commit import GroupApply
from countersign._daemon.lane_slots import LaneSlots
from countersign._daemon.registry_follower import RegistryFollower
from countersign._daemon.tls import peer_identity
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.canonical import sha256_digest
from countersign.client.runtime_calls import RUNTIME_METHODS, runtime_answer
from countersign.constructions import EdgeProposal, RecordFields, cosign, draft_record, seal
from countersign.cosigning import (
    CONSTRUCTION,
    AgentRequest,
    ChunkBuffer,
    EarlierAnswer,
    EarlierClose,
    ReceiptRequest,
    Refusal,
    delegation_parent_key,
    delegation_request_refusal,
    edge_refusal,
    edge_write,
    fanout_refusal,
    grant_request_refusal,
    grant_write,
    local_child_refusal,
    local_child_write,
    open_grant,
    parent_cosignature,
    parent_failure,
    peer_certificate_refusal,
    peer_refusal,
    positioned,
    proposal_refusal,
    proposal_write,
    receipt_fields,
    receipt_parent_refusal,
    receipt_write,
    record_fields,
    root_write,
    runtime_refusal,
    seal_write,
    session_position,
    spend_grant,
    stream_spec,
)
from countersign.errors import ConfigError, ErrorCode, MalformedError, ServiceError
from countersign.keys import PublicKey, Signer
from countersign.records import CoSignature, CoSignerRole, LifecycleEvent, NodeRecord, Path, StreamChunk, parse_json
from countersign.registry import Registry
from countersign.signer_state import (
    RequestRecord,
    RequestReused,
    SessionState,
    StateReads,
    StateView,
    StateWrite,
    earlier_answer,
    request_fingerprint,
    request_id_problem,
)
from signer.backends import load_signer
from signer.config import MAX_LANES, SignerConfig
from signer.peers import PeerPool, Peers
from signer.stores import SignerStateStore, open_signer_state

__all__ = ["MAX_LANES", "SignerConfig", "SignerDaemon", "SignerMetrics", "SignerService"]

log = logging.getLogger("countersign.signer")
PARSED_PATH_CACHE = 1024
MAX_PARENT_SIGNERS = 8  # addresses one AcceptDelegation may name for the parent's signer replicas
# Every signer method carries at most a path (1 MiB, spec section 10) and small fields, so each is held
# to this (ADR 0027); health and reflection get the server's small default.
SIGNER_MESSAGE_BYTES = 2 << 20
METHOD_MESSAGE_BYTES = {
    f"/countersign.v1.Signer/{method.name}": SIGNER_MESSAGE_BYTES
    for method in signer_pb2.DESCRIPTOR.services_by_name["Signer"].methods
}
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)


class SignerMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry, follower: RegistryFollower) -> None:
        self.requests = prometheus_client.Counter(
            "countersign_signer_requests", "Signer requests by method and outcome code", ["method", "code"],
            registry=registry,
        )  # fmt: skip
        self.lanes = prometheus_client.Gauge(
            "countersign_lanes_open", "Lanes open to this signer by kind (cosign, runtime, stream)", ["kind"],
            registry=registry,
        )  # fmt: skip
        self.cosign_latency = prometheus_client.Histogram(
            "countersign_cosign_seconds", "Round trip of asking the parent's signer to co-sign", ["outcome"],
            registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        # The two halves of a delegation, timed inside this signer: with the co-signing round trip
        # above, they say where an issuance's time goes (in the handlers, in a commit, on the wire).
        self.handler_latency = prometheus_client.Histogram(
            "countersign_signer_seconds", "Time inside this signer deciding a delegation, by method", ["method"],
            registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.commit_latency = prometheus_client.Histogram(
            "countersign_signer_commit_seconds", "State writes from submission to durable, by sync",
            ["sync"], registry=registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.commit_batch = prometheus_client.Histogram(
            "countersign_signer_commit_batch", "Writes per durable commit (group commit)", registry=registry,
            buckets=BATCH_BUCKETS,
        )  # fmt: skip
        self.conflicts = prometheus_client.Counter(
            "countersign_signer_state_conflicts",
            "Writes whose state another replica or call changed first (decided again), by method", ["method"],
            registry=registry,
        )  # fmt: skip
        self.retries_answered = prometheus_client.Counter(
            "countersign_signer_retries_answered", "Calls answered with their first answer (same request_id)",
            ["method"], registry=registry,
        )  # fmt: skip
        self.state_collected = prometheus_client.Counter(
            "countersign_signer_state_collected", "Signer state rows the collector forgot, by table", ["table"],
            registry=registry,
        )  # fmt: skip
        self.state_rows = prometheus_client.Gauge(
            "countersign_signer_state_rows", "Signer state rows held, by table (after the last collection)",
            ["table"], registry=registry,
        )  # fmt: skip
        follower.register_gauges(registry)


K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class Bounded(Generic[K, V]):
    """A thread-safe map that forgets its oldest entry beyond ``size``."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: dict[K, V] = {}
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if len(self._items) >= self._size:
                self._items.pop(next(iter(self._items)))
            self._items[key] = value


def _refuse(code: ErrorCode, message: str) -> ServiceError:
    return refusal_error(Refusal(code, message))


def _check(refusal: Refusal | None) -> None:
    """End the call with ``refusal``, if there is one."""
    if refusal is not None:
        raise refusal_error(refusal)


def _allowed(outcome: T | Refusal) -> T:
    """``outcome``, unless it is a refusal: then end the call with it."""
    if isinstance(outcome, Refusal):
        raise refusal_error(outcome)
    return outcome


def _agent_request(agent: signer_pb2.AgentFields, system: str) -> AgentRequest:
    return AgentRequest(
        instance=agent.instance,
        system=system,
        ttl_ms=agent.ttl_ms,
        max_children=agent.max_children,
        event=agent.event,
        allowed_children=tuple(agent.allowed_children) if agent.restrict_children else None,
        max_depth=agent.max_depth if agent.HasField("max_depth") else None,
    )


@dataclass(frozen=True, slots=True)
class Call:
    """A signing call's identity for the state: its method, its request id ("" for none) and what it
    asked (the fingerprint a retry must match)."""

    method: str
    request_id: str = ""
    fingerprint: str = ""

    @property
    def key(self) -> str | None:
        """The request id a call's reads name (None: the call has none)."""
        return self.request_id or None


def _call(method: str, request: Any) -> Call:
    """The :class:`Call` of a runtime request (a protobuf message with a ``request_id`` field)."""
    request_id = request.request_id
    if not request_id:
        return Call(method)
    problem = request_id_problem(request_id)
    if problem is not None:
        raise _refuse(ErrorCode.INVALID_ARGUMENT, problem)
    asked = type(request)()
    asked.CopyFrom(request)
    asked.request_id = ""
    return Call(method, request_id, request_fingerprint(method, asked.SerializeToString(deterministic=True)))


@dataclass(frozen=True, slots=True)
class Decided:
    """What a call decided from one view of the state: its ``answer`` (the serialised response), the
    ``write`` that makes it so (None: answer without writing, e.g. an edge co-signed before), and how
    long its request id keeps the answer. ``record``/``kept``: when the answer carries the path of the
    record the write issues, that record's digest and the answer without the path, which is what the
    request id keeps (the path is kept once, with the record)."""

    answer: bytes
    write: StateWrite | None = None
    expires_ms: int = 0
    record: str = ""
    kept: bytes = b""


@dataclass(slots=True)
class StreamSession:
    """What one receipt stream knows of its session: the state this replica's last write for it left
    (None: not known, read it from the store)."""

    state: SessionState | None = None


# How a kept answer gets its path back: the response without it, the path -> the response.
Restore = Callable[[bytes, bytes], bytes]


def _issue_answer(path: bytes, digest: str | None = None) -> bytes:
    """An IssueResponse, serialised (a stored path's digest is read from it)."""
    if digest is None:
        digest = Path.from_bytes(path).leaf.digest()
    return signer_pb2.IssueResponse(path=path, record_digest=digest).SerializeToString()


def _issued_decision(path: Path, data: bytes, write: StateWrite, expires_ms: int) -> Decided:
    """A call that issues the record at the end of ``path``: answered with it; its request id keeps the
    answer without the path (the record keeps that)."""
    digest = path.leaf.digest()
    kept = signer_pb2.IssueResponse(record_digest=digest).SerializeToString()
    return Decided(_issue_answer(data, digest), write, expires_ms, digest, kept)


def _restore_issued(kept: bytes, path: bytes) -> bytes:
    answer = signer_pb2.IssueResponse.FromString(kept)
    answer.path = path
    return answer.SerializeToString()


def _restore_chunk(kept: bytes, path: bytes) -> bytes:
    answer = signer_pb2.ChunkReceipt.FromString(kept)
    answer.path = path
    return answer.SerializeToString()


class SignerService(signer_pb2_grpc.SignerServicer):
    """The signer's RPCs: each reads what it needs (the request, the registry copy, its state), asks
    the rules in :mod:`countersign.cosigning`, signs what they allow and writes it once, conditionally.

    ``peers`` reaches the parents' signers (default: a :class:`PeerPool` over mTLS).
    """

    def __init__(
        self,
        config: SignerConfig,
        key: Signer,
        state: SignerStateStore,
        follower: RegistryFollower,
        metrics: SignerMetrics,
        peers: Peers | None = None,
    ) -> None:
        self._config = config
        self._policy = config.policy
        self._key = key
        self._state = state
        self._follower = follower
        self._metrics = metrics
        self._peers = peers or PeerPool(config.tls, config.lanes_per_peer, config.lane_idle_ms / 1000)
        self._parsed: Bounded[bytes, Path] = Bounded(PARSED_PATH_CACHE)
        self._own_parents: Bounded[bytes, tuple[Path, str]] = Bounded(PARSED_PATH_CACHE)
        self._lane_slots = LaneSlots(config.lanes_per_peer, metrics.lanes)
        # Parent signer address -> asked last until (monotonic); bounded, as the addresses come from calls.
        self._parent_down: Bounded[str, float] = Bounded(PARSED_PATH_CACHE)
        self._commits: GroupApply[StateWrite, bool] | None = (
            GroupApply(self._apply, max_batch=config.commit_batch) if state.batches else None
        )
        self._durable = metrics.commit_latency.labels("full")

    def close(self) -> None:
        self._peers.close()

    def stopping(self) -> None:
        """Shutdown has begun: end the idle lanes now (a busy one ends once its call is answered), so
        lanes do not hold the server for its grace period. Peers open new lanes to wherever this
        deployer's signer comes back."""
        self._lane_slots.stop()

    # --- the state: read, decide, write once --------------------------------------------------------

    def _apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        self._metrics.commit_batch.observe(len(writes))
        return self._state.apply(writes)

    def _commit(self, write: StateWrite) -> bool:
        """Write durably (with concurrent calls' writes, where the store batches); False on a conflict."""
        started = time.perf_counter()
        applied = self._commits.submit(write) if self._commits is not None else self._apply([write])[0]
        self._durable.observe(time.perf_counter() - started)
        return applied

    def _signing(
        self, call: Call, reads: StateReads, decide: Callable[[StateView], Decided], restore: Restore = _restore_issued,
        presumed: StateView | None = None, written: Callable[[StateWrite], None] | None = None,
    ) -> bytes:  # fmt: skip
        """Answer ``call``: its first answer if its request id was answered before; else read, decide
        and write, again from a fresh read when the write's state moved meanwhile, at most
        ``decide_attempts`` times (then STATE_CONFLICT, retryable: nothing was issued).

        ``presumed``: what the caller knows the read would answer (the state this replica wrote last),
        decided from without reading. Safe because the write is conditional on every part of the view
        the decision used: a state moved since (another replica's receipt, a request id answered
        before) fails the write, and the call reads and decides again. ``written`` is told the write
        that applied."""
        assert reads.request == (call.request_id or None), "a call reads its own request id"
        for _ in range(self._config.decide_attempts):
            view = presumed if presumed is not None else self._state.read(reads)
            presumed = None  # after a conflict, the store's own state
            earlier = self._earlier(call, view, restore)
            if earlier is not None:
                return earlier
            decided = decide(view)
            if decided.write is None:
                return decided.answer
            answered = None
            if call.request_id:
                kept = decided.kept if decided.record else decided.answer
                answered = RequestRecord(call.request_id, call.fingerprint, kept, decided.expires_ms, decided.record)
            if self._commit(decided.write.answering(answered)):
                if written is not None:
                    written(decided.write)
                return decided.answer
            self._metrics.conflicts.labels(call.method).inc()
        raise _refuse(
            ErrorCode.STATE_CONFLICT,
            f"the state this call needs was changed concurrently {self._config.decide_attempts} times; retry",
        )

    def _earlier(self, call: Call, view: StateView, restore: Restore) -> bytes | None:
        """The first answer of a call asked again under its request id (None: not answered before)."""
        if not call.request_id:
            return None
        earlier = earlier_answer(view.request, call.fingerprint)
        if isinstance(earlier, RequestReused):
            raise _refuse(earlier.code, earlier.message)
        if earlier is None:
            return None
        self._metrics.retries_answered.labels(call.method).inc()
        if not earlier.record:
            return earlier.answer
        path = self._issued_path(earlier.record)
        if path is None:  # the record it answered with has expired and been forgotten: nothing to give again
            raise _refuse(ErrorCode.INVALID_ARGUMENT, "request_id answered a record that has expired")
        return restore(earlier.answer, path)

    # --- reading the request and the state ------------------------------------------------------

    def _registry(self) -> Registry:
        registry, fresh = self._follower.view()
        if not fresh:
            raise _refuse(ErrorCode.REGISTRY_STALE, "this signer's registry copy is stale; refusing")
        return registry

    def _require_runtime(self, context: grpc.ServicerContext) -> None:
        if not self._config.tls.insecure_loopback:
            _check(runtime_refusal(self._policy, peer_identity(context)))

    def _require_peer(self, context: grpc.ServicerContext, child_deployer: str, registry: Registry) -> None:
        """Only the child deployer's own signer may ask, and only an enrolled deployer."""
        _check(peer_refusal(self._policy, child_deployer, registry))
        if not self._config.tls.insecure_loopback:
            _check(peer_certificate_refusal(child_deployer, peer_identity(context)))

    def _parse_path(self, data: bytes, what: str = "parent_path") -> Path:
        """The parsed path (structure only, not verified), kept by the bytes' digest: a runtime names
        the same parent record on call after call."""
        key = hashlib.sha256(data).digest()
        path = self._parsed.get(key)
        if path is None:
            try:
                path = Path.from_bytes(data)
            except MalformedError as exc:
                raise _refuse(ErrorCode.INVALID_ARGUMENT, f"{what}: {exc}") from None
            self._parsed.put(key, path)
        return path

    def _issued_path(self, digest: str) -> bytes | None:
        """The canonical path this deployer's signer (any replica) returned when it issued ``digest``."""
        return self._state.read(StateReads(issued=digest)).issued

    def _own_parent(self, data: bytes) -> tuple[Path, str]:
        """The path of a record this deployer's signer issued (as stored when issued), and its digest.

        The stored path was checked when the record was issued and its leaf binds the prefix by
        digest, so it is not verified again here. Kept by the digest of the bytes naming it (a record,
        once issued, never changes).
        """
        key = hashlib.sha256(data).digest()
        known = self._own_parents.get(key)
        if known is not None:
            return known
        digest = self._parse_path(data).leaf.digest()
        stored = self._issued_path(digest)
        if stored is None:
            raise _refuse(ErrorCode.PARENT_UNKNOWN, "the parent record was not issued by this signer")
        known = (Path.from_bytes(stored), digest)
        self._own_parents.put(key, known)
        return known

    def _sealed(self, fields: RecordFields, prefix: Path | None) -> tuple[Path, bytes]:
        """A new record of this signer under ``prefix`` (None: a root), signed; its path and bytes."""
        envelopes = () if prefix is None else prefix.envelopes
        envelope = seal(draft_record(CONSTRUCTION, fields, self._key.key_id, envelopes), self._key)
        path = Path((*envelopes, envelope))
        return path, path.to_bytes()

    def _issued(self, method: str, answer: bytes) -> signer_pb2.IssueResponse:
        self._metrics.requests.labels(method, "OK").inc()
        return signer_pb2.IssueResponse.FromString(answer)

    # --- runtime RPCs ---------------------------------------------------------------------------

    @servicer_edge
    def IssueRoot(
        self, request: signer_pb2.IssueRootRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        call = _call("IssueRoot", request)
        agent = _agent_request(request.agent, request.agent.system)
        fields = _allowed(record_fields(self._policy, agent, None, LifecycleEvent.NEW, now_ms()))

        def decide(view: StateView) -> Decided:
            path, data = self._sealed(fields, None)
            return _issued_decision(path, data, root_write(path, data), fields.expires_ms)

        return self._issued("IssueRoot", self._signing(call, StateReads(request=call.key), decide))

    @servicer_edge
    def IssueLocalChild(
        self, request: signer_pb2.IssueLocalChildRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()  # every signing refuses on a stale registry copy (spec 7.3), not only delegations
        call = _call("IssueLocalChild", request)
        parent, digest = self._own_parent(request.parent_path)
        parent_record = parent.leaf.record
        agent = _agent_request(request.agent, parent_record.agent.system)
        fields = _allowed(record_fields(self._policy, agent, parent_record.expires_ms, LifecycleEvent.BRANCH, now_ms()))
        _check(local_child_refusal(self._policy, parent))

        def decide(view: StateView) -> Decided:
            _check(fanout_refusal(parent_record, view.child_count))
            child, data = self._sealed(fields, parent)
            return _issued_decision(child, data, local_child_write(parent, digest, child, data), fields.expires_ms)

        reads = StateReads(children_of=digest, request=call.key)
        return self._issued("IssueLocalChild", self._signing(call, reads, decide))

    def _issue_receipt(
        self, call: Call, parent: Path, parent_digest: str, fields: RecordFields,
        answer_of: Callable[[Path, bytes], bytes], restore: Restore = _restore_issued,
        stream: StreamSession | None = None,
    ) -> bytes:  # fmt: skip
        """Sign the next receipt of its session under ``parent`` and move the session on, in one write:
        receipts spend no child slot (ADR 0018), only a place in their session. Answers ``answer_of``
        the new path and its bytes (for a retried close, the close receipt issued before); ``restore``
        puts the path back into an answer kept without it. A ``stream``'s next receipt decides from the
        session as this replica wrote it last, without reading it again."""
        _check(local_child_refusal(self._policy, parent))
        _check(receipt_parent_refusal(parent.leaf.record))
        output = fields.output
        assert output is not None  # a receipt's fields carry its output
        limit = self._config.max_session_outputs

        def decide(view: StateView) -> Decided:
            position = session_position(view.session, agent_digest=parent_digest, output=output, max_outputs=limit)
            if isinstance(position, Refusal):
                raise refusal_error(position)
            if isinstance(position, EarlierClose):
                data = self._issued_path(position.digest)
                if data is None:  # the close receipt's record was collected: nothing to answer again
                    raise _refuse(ErrorCode.SESSION_CLOSED, "the session is closed")
                return Decided(answer_of(Path.from_bytes(data), data))
            placed = replace(fields, output=positioned(output, position[0], position[1]))
            receipt, data = self._sealed(placed, parent)
            write = receipt_write(view.session, parent, parent_digest, receipt, data)
            kept = answer_of(receipt, b"")  # without the path, which the record keeps
            return Decided(answer_of(receipt, data), write, fields.expires_ms, receipt.leaf.digest(), kept)

        reads = StateReads(session=(parent_digest, output.session), request=call.key)
        if stream is None:
            return self._signing(call, reads, decide, restore)
        presumed = None if stream.state is None else StateView(session=stream.state)
        stream.state = None  # known again only once this receipt's own write applies

        def written(write: StateWrite) -> None:
            stream.state = None if write.session is None else write.session.state

        return self._signing(call, reads, decide, restore, presumed, written)

    @staticmethod
    def _receipt_answer(path: Path, data: bytes) -> bytes:
        return _issue_answer(data, path.leaf.digest())

    @servicer_edge
    def IssueReceipt(
        self, request: signer_pb2.IssueReceiptRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        call = _call("IssueReceipt", request)
        parent, digest = self._own_parent(request.parent_path)
        receipt = ReceiptRequest(
            output_sha256=request.output_sha256, binding_scope=request.binding_scope, session=request.session,
            instance=request.instance, ttl_ms=request.ttl_ms,
        )  # fmt: skip
        fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
        answer = self._issue_receipt(call, parent, digest, fields, self._receipt_answer)
        return self._issued("IssueReceipt", answer)

    @servicer_edge
    def CloseSession(
        self, request: signer_pb2.CloseSessionRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        call = _call("CloseSession", request)
        parent, digest = self._own_parent(request.parent_path)
        receipt = ReceiptRequest(
            output_sha256=hashlib.sha256(b"").digest(), session=request.session, instance=request.instance,
            ttl_ms=request.ttl_ms, close=True,
        )  # fmt: skip
        fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
        answer = self._issued("CloseSession", self._issue_receipt(call, parent, digest, fields, self._receipt_answer))
        log.info("session closed", extra={"parent": digest})
        return answer

    @stream_edge
    def StreamReceipts(
        self, chunks: Iterator[signer_pb2.OutputChunk], context: grpc.ServicerContext
    ) -> Iterator[signer_pb2.ChunkReceipt]:
        """A stream's pieces in, one receipt per n units out (docs/spec.md 17.6): the chunking is
        :class:`countersign.cosigning.ChunkBuffer`'s, each receipt issued as by IssueReceipt.

        Each stream holds one of the connection's runtime lane slots (``lanes_per_peer``, counted with
        its ``RuntimeCalls`` lanes) for its whole life, and reads at most ``max_stream_messages``
        messages and signs at most ``max_stream_chunks`` chunks: one connection cannot hold more
        handler threads than its lanes may, nor keep one busy without end."""
        self._require_runtime(context)
        release = self._lane_slots.hold("stream", str(context.peer()), context)
        try:
            yield from self._stream_receipts(chunks, context)
        finally:
            release()

    def _stream_receipts(
        self, chunks: Iterator[signer_pb2.OutputChunk], context: grpc.ServicerContext
    ) -> Iterator[signer_pb2.ChunkReceipt]:
        config = self._config
        read = 0

        def next_message() -> signer_pb2.OutputChunk | None:
            nonlocal read
            message = next(chunks, None)
            read += message is not None
            if read > config.max_stream_messages:
                raise _refuse(
                    ErrorCode.RESOURCE_EXHAUSTED, f"a stream carries at most {config.max_stream_messages} messages"
                )
            return message

        self._registry()
        first = next_message()
        if first is None:
            return
        unit, n = _allowed(stream_spec(first.unit, first.n))
        stream_id = first.request_id
        if stream_id and (problem := request_id_problem(stream_id)) is not None:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, problem)
        parent, digest = self._own_parent(first.parent_path)
        buffer = ChunkBuffer(unit, n)
        session = StreamSession()
        index = first.first_chunk  # the stream's chunk index of the next receipt
        signed = 0

        def sign(data: bytes, units: int, close: bool = False) -> signer_pb2.ChunkReceipt:
            nonlocal signed, index
            signed += not close  # the close receipt ends the stream: it is not a chunk
            if signed > config.max_stream_chunks:
                raise _refuse(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"a stream signs at most {config.max_stream_chunks} chunks; continue the session in another stream",
                )
            output_sha256 = hashlib.sha256(data).digest()
            receipt = ReceiptRequest(
                output_sha256=output_sha256, session=first.session, instance=first.instance,
                ttl_ms=first.ttl_ms, stream=None if close else StreamChunk(unit, n, units), close=close,
            )  # fmt: skip
            fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
            call = _chunk_call(stream_id, index, digest, first, output_sha256, units, close)
            index += 1

            def answer_of(path: Path, data: bytes) -> bytes:
                output = path.leaf.record.output
                assert output is not None
                return signer_pb2.ChunkReceipt(
                    path=data, record_digest=path.leaf.digest(), seq=output.seq, units=0 if close else units,
                    closed=close,
                ).SerializeToString()  # fmt: skip

            issued = self._issue_receipt(call, parent, digest, fields, answer_of, _restore_chunk, session)
            answer = signer_pb2.ChunkReceipt.FromString(issued)
            self._metrics.requests.labels("StreamReceipts", "OK").inc()
            return answer

        message: signer_pb2.OutputChunk | None = first
        closing = False
        while message is not None:
            if message is not first and (
                message.parent_path or message.session or message.unit or message.n or message.request_id
                or message.first_chunk
            ):  # fmt: skip
                raise _refuse(ErrorCode.INVALID_ARGUMENT, "only the first message names the stream")
            pieces = _allowed(buffer.add(message.data, message.units)) if message.data or message.units else []
            for data, units in pieces:
                yield sign(data, units)
            if message.close:
                closing = True
                break
            message = next_message()
        rest = buffer.flush()
        if rest is not None:
            yield sign(*rest)
        if closing:
            yield sign(b"", 0, close=True)

    @servicer_edge
    def OpenGrant(
        self, request: signer_pb2.OpenGrantRequest, context: grpc.ServicerContext
    ) -> signer_pb2.OpenGrantResponse:
        self._require_runtime(context)
        _check(grant_request_refusal(request.ttl_ms))
        registry = self._registry()
        call = _call("OpenGrant", request)
        parent, digest = self._own_parent(request.parent_path)
        child = request.child_deployer

        def decide(view: StateView) -> Decided:
            grant_id = secrets.token_hex(16)
            grant = _allowed(
                open_grant(self._policy, parent, digest, child, request.ttl_ms, registry, now_ms(), grant_id)
            )
            answer = signer_pb2.OpenGrantResponse(
                grant_id=grant.grant_id, parent_digest=digest, parent_key_id=self._key.key_id,
                expires_ms=grant.expires_ms,
            )  # fmt: skip
            return Decided(answer.SerializeToString(), grant_write(grant), grant.expires_ms)

        answer = signer_pb2.OpenGrantResponse.FromString(self._signing(call, StateReads(request=call.key), decide))
        self._metrics.requests.labels("OpenGrant", "OK").inc()
        log.info("grant opened", extra={"grant_id": answer.grant_id, "child_deployer": child, "parent": digest})
        return answer

    @servicer_edge
    def AcceptDelegation(
        self, request: signer_pb2.AcceptDelegationRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        with self._metrics.handler_latency.labels("AcceptDelegation").time():
            return self._accept_delegation(request, context)

    def _accept_delegation(
        self, request: signer_pb2.AcceptDelegationRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        registry = self._registry()
        call = _call("AcceptDelegation", request)
        # The parent path is not verified here: the parent's signer co-signs only a record it issued
        # (its leaf binds the prefix by digest), and the parent's co-signature is verified below.
        parent = self._parse_path(request.parent_path)
        _check(delegation_request_refusal(request.grant_id, request.parent_key_id))
        try:
            parent_signers = parse_addresses(request.parent_signer, "parent_signer")
        except ConfigError as exc:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
        if len(parent_signers) > MAX_PARENT_SIGNERS:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, f"parent_signer names at most {MAX_PARENT_SIGNERS} addresses")
        parent_record = parent.leaf.record
        parent_key = _allowed(
            delegation_parent_key(self._policy, parent_record, request.parent_key_id, registry, now_ms())
        )
        proposed = self._proposal(call, request, parent)
        if isinstance(proposed, bytes):  # this delegation completed before; its answer may have been lost
            return self._issued("AcceptDelegation", proposed)
        proposal, child_cosig = proposed
        parent_cosig = self._ask_parent(request, parent_signers, proposal, child_cosig, parent_key)
        envelope = seal(replace(proposal.child, cosigs=(parent_cosig, child_cosig)), self._key)
        path = Path((*parent.envelopes, envelope))
        data = path.to_bytes()

        def decide(view: StateView) -> Decided:
            sealed = None if view.proposal is None else view.proposal.sealed_path
            if sealed is not None:  # another replica sealed this very edge first (Ed25519: the same bytes)
                return Decided(_issue_answer(sealed))
            return _issued_decision(path, data, seal_write(request.grant_id, path, data), envelope.record.expires_ms)

        reads = StateReads(proposal=request.grant_id, request=call.key)
        answer = self._issued("AcceptDelegation", self._signing(call, reads, decide))
        log.info(
            "delegation accepted", extra={"parent_deployer": parent_record.deployer, "record": answer.record_digest}
        )
        return answer

    def _proposal(
        self, call: Call, request: signer_pb2.AcceptDelegationRequest, parent: Path
    ) -> tuple[EdgeProposal, CoSignature] | bytes:
        """The edge to propose under this grant: the one proposed before if this is a retry (so that a
        parent that co-signed it but whose answer was lost answers the same again), else a new one,
        kept (one conditional write) before the parent is asked. Or the answer, if the delegation was
        sealed before (or its request id answered).

        Kept until it expires, so a delegation interrupted after the parent spent the grant is
        completed by retrying it, instead of leaving a spent grant and no record; and a retry after
        success returns the same record. One grant, one edge, whatever the runtime asks again.
        """
        parent_digest = parent.leaf.digest()
        reads = StateReads(proposal=request.grant_id, request=call.key)
        for _ in range(self._config.decide_attempts):
            view = self._state.read(reads)
            earlier = self._earlier(call, view, _restore_issued)
            if earlier is not None:
                return earlier
            if view.proposal is not None:
                kept = view.proposal
                _check(proposal_refusal(kept.parent, parent_digest))
                if kept.sealed_path is not None:
                    return _issue_answer(kept.sealed_path)
                child = NodeRecord.from_json(parse_json(kept.child_record))
                cosig = CoSignature.from_json(parse_json(kept.child_cosig))
                return EdgeProposal(parent.leaf, child, request.parent_key_id), cosig
            agent = _agent_request(request.agent, parent.leaf.record.agent.system)
            fields = _allowed(
                record_fields(self._policy, agent, parent.leaf.record.expires_ms, LifecycleEvent.NEW, now_ms())
            )
            draft = draft_record(CONSTRUCTION, fields, self._key.key_id, parent.envelopes)
            proposal = EdgeProposal(parent.leaf, draft, request.parent_key_id)
            child_cosig = cosign(proposal, self._key, CoSignerRole.CHILD)
            if self._commit(
                proposal_write(request.grant_id, parent_digest, proposal, json.dumps(child_cosig.to_json()))
            ):
                return proposal, child_cosig
            self._metrics.conflicts.labels(call.method).inc()  # another replica proposed first: take its edge
        raise _refuse(ErrorCode.STATE_CONFLICT, "the delegation's proposal was changed concurrently; retry")

    def _ask_parent(
        self,
        request: signer_pb2.AcceptDelegationRequest,
        parent_signers: Sequence[str],
        proposal: EdgeProposal,
        child_cosig: CoSignature,
        parent_key: PublicKey,
    ) -> CoSignature:
        """Ask the parent's signer for its co-signature, at each of its addresses in turn while they
        cannot be reached (co-signing one edge again is answered the same: spec 21.2); a refusal, or
        no answer from any, fails the delegation closed."""
        parent_deployer = proposal.parent.record.deployer
        call = signer_pb2.CoSignEdgeRequest(
            grant_id=request.grant_id,
            parent_path=request.parent_path,
            child_record=proposal.child_bytes,
            child_cosignature=json.dumps(child_cosig.to_json()),
        )
        failure: ServiceError | None = None
        now = time.monotonic()
        # Replicas that just failed to answer are asked last for a while (about ten co-signing
        # timeouts): a partitioned parent replica costs one timeout per child replica, not one per edge.
        ordered = sorted(parent_signers, key=lambda address: (self._parent_down.get(address) or 0.0) > now)
        for address in ordered:
            try:
                response = self._ask_one(address, parent_deployer, call)
            except ServiceError as error:
                failure = error
                if error.retryable:
                    self._parent_down.put(address, time.monotonic() + 10 * self._config.cosign_timeout_ms / 1000)
                    continue  # this replica cannot be reached (or timed out): ask the next
                if error.code is ErrorCode.WRONG_SERVER:
                    continue  # not the parent's signer at all (its certificate names another): ask the next
                break
            self._parent_down.put(address, 0.0)
            return _allowed(parent_cosignature(proposal, response.parent_cosignature, parent_key))
        assert failure is not None  # parse_addresses gives at least one address
        refusal = parent_failure(parent_deployer, failure.code, str(failure), retryable=failure.retryable)
        raise refusal_error(refusal, details={"parent_code": failure.code})

    def _ask_one(
        self, address: str, parent_deployer: str, call: signer_pb2.CoSignEdgeRequest
    ) -> signer_pb2.CoSignEdgeResponse:
        started = time.perf_counter()
        outcome = "error"
        lanes = self._peers.lanes(address, parent_deployer)
        try:
            response = lanes.ask(call, self._config.cosign_timeout_ms / 1000)
            outcome = "ok"
            return response
        except ServiceError as error:
            if error.code is ErrorCode.UNAVAILABLE:  # the transport failed (a refusal carries its own code)
                self._peers.forget(address, parent_deployer, lanes)
            outcome = "unreachable" if error.retryable else "refused"
            raise
        finally:
            self._metrics.cosign_latency.labels(outcome).observe(time.perf_counter() - started)

    # --- peer RPC -------------------------------------------------------------------------------

    @servicer_edge
    def CoSignEdge(
        self, request: signer_pb2.CoSignEdgeRequest, context: grpc.ServicerContext
    ) -> signer_pb2.CoSignEdgeResponse:
        answer = self._cosign_edge(request, context)
        self._metrics.requests.labels("CoSignEdge", "OK").inc()
        return answer

    @stream_edge
    def CoSignEdges(
        self, requests: Iterator[signer_pb2.CoSignEdgeRequest], context: grpc.ServicerContext
    ) -> Iterator[signer_pb2.CoSignEdgeResponse]:
        """A co-signing lane: each edge decided as by CoSignEdge, in order; a refusal ends the lane.
        Lanes are counted per peer deployer (another operator's signer may open many connections)."""
        identity = None if self._config.tls.insecure_loopback else peer_identity(context)
        peer = identity.deployer if identity is not None and identity.deployer else str(context.peer())

        def decide(edge: signer_pb2.CoSignEdgeRequest) -> signer_pb2.CoSignEdgeResponse:
            answer = self._cosign_edge(edge, context)
            self._metrics.requests.labels("CoSignEdges", "OK").inc()
            return answer

        yield from self._lane_slots.serve("cosign", peer, requests, context, decide)

    @stream_edge
    def RuntimeCalls(
        self, calls: Iterator[signer_pb2.RuntimeCall], context: grpc.ServicerContext
    ) -> Iterator[signer_pb2.RuntimeAnswer]:
        """A runtime lane: each call answered as its unary form would, in order; a refusal ends the lane.
        Lanes are counted per connection: a deployer may run many runtime processes under one identity."""
        self._require_runtime(context)
        yield from self._lane_slots.serve(
            "runtime", str(context.peer()), calls, context, lambda c: self._runtime_call(c, context)
        )

    def _runtime_call(self, call: signer_pb2.RuntimeCall, context: grpc.ServicerContext) -> signer_pb2.RuntimeAnswer:
        kind = call.WhichOneof("call")
        if kind is None:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, "a runtime call must name one call")
        method = RUNTIME_METHODS[kind]  # the unary method that decides this call
        return runtime_answer(method, getattr(self, method)(getattr(call, kind), context))

    def _cosign_edge(
        self, request: signer_pb2.CoSignEdgeRequest, context: grpc.ServicerContext
    ) -> signer_pb2.CoSignEdgeResponse:
        with self._metrics.handler_latency.labels("CoSignEdge").time():
            return self._decide_edge(request, context)

    def _decide_edge(
        self, request: signer_pb2.CoSignEdgeRequest, context: grpc.ServicerContext
    ) -> signer_pb2.CoSignEdgeResponse:
        registry = self._registry()
        try:
            child = NodeRecord.from_json(parse_json(request.child_record))
            child_cosig = CoSignature.from_json(parse_json(request.child_cosignature))
        except MalformedError as exc:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, f"child record: {exc}") from None
        self._require_peer(context, child.deployer, registry)
        parent, parent_digest = self._own_parent(request.parent_path)
        proposal = EdgeProposal(parent.leaf, child, self._key.key_id)
        _check(edge_refusal(self._policy, parent, parent_digest, proposal, child_cosig, registry, now_ms()))
        manifest_digest = sha256_digest(proposal.manifest())
        grant_id = request.grant_id

        def decide(view: StateView) -> Decided:
            decision = spend_grant(
                view.grant, child_deployer=child.deployer, parent_digest=parent_digest,
                manifest_digest=manifest_digest, max_children=parent.leaf.record.max_children,
                child_count=view.child_count, now_ms=now_ms(),
            )  # fmt: skip
            if isinstance(decision, EarlierAnswer):  # the same edge asked again (a retry): same answer
                return Decided(decision.parent_cosig.encode())
            _check(decision)
            if not context.is_active():  # the child gave up (deadline, cancel): do not spend the grant
                raise _refuse(ErrorCode.CANCELLED, "the request was cancelled before the grant was spent")
            answer = json.dumps(cosign(proposal, self._key, CoSignerRole.PARENT).to_json())
            return Decided(answer.encode(), edge_write(grant_id, parent, parent_digest, child, manifest_digest, answer))

        reads = StateReads(grant=grant_id, children_of=parent_digest)
        answer = self._signing(Call("CoSignEdge"), reads, decide).decode()
        log.info("edge co-signed", extra={"grant_id": grant_id, "child_deployer": child.deployer})
        return signer_pb2.CoSignEdgeResponse(parent_cosignature=answer)


def _chunk_call(
    stream_id: str, index: int, parent_digest: str, first: signer_pb2.OutputChunk, output_sha256: bytes, units: int,
    close: bool,
) -> Call:  # fmt: skip
    """Chunk ``index`` of a stream as a call of its own: kept under ``<stream request id>/<index>``, with
    what identifies the chunk (the stream's parent, session, unit, n and its output) as its fingerprint."""
    if not stream_id:
        return Call("StreamReceipts")
    asked = json.dumps(
        [parent_digest, first.session, first.unit, first.n, first.instance, first.ttl_ms, output_sha256.hex(), units,
         close],
        separators=(",", ":"),
    )  # fmt: skip
    return Call("StreamReceipts", f"{stream_id}/{index}", request_fingerprint("StreamReceipts", asked.encode()))


class SignerDaemon:
    def __init__(self, config: SignerConfig) -> None:
        self.config = config
        self.metrics_registry = prometheus_client.CollectorRegistry()
        self.key = load_signer(config.signer_key)
        self.follower = RegistryFollower(
            operator_key=parse_operator_key(config.operator_public_key),
            coordinator=config.coordinator,
            tls=config.tls,
            cache_path=config.registry_cache,
            staleness_ms=config.staleness_ms,
            heartbeat_ms=config.heartbeat_ms,
        )
        self.metrics = SignerMetrics(self.metrics_registry, self.follower)
        self.store = open_signer_state(config.state_url)
        self.service = SignerService(config, self.key, self.store, self.follower, self.metrics)
        self._stop = threading.Event()
        self._collector: threading.Thread | None = None

    def register(self, server: grpc.Server) -> Sequence[str]:
        signer_pb2_grpc.add_SignerServicer_to_server(self.service, server)
        return [signer_pb2.DESCRIPTOR.services_by_name["Signer"].full_name]

    def start(self) -> None:
        self.follower.start()
        self.collect()  # once at start, so the row gauges say something before the first interval
        self._collector = threading.Thread(target=self._collect_periodically, name="state-collector", daemon=True)
        self._collector.start()

    def collect(self) -> dict[str, int]:
        """One collection round: batches until a batch comes back short. Returns rows forgotten per table.
        Every replica collects; the stores make concurrent collection safe (ADR 0033)."""
        batch = self.config.collect_batch
        total: dict[str, int] = {}
        while not self._stop.is_set():
            # The margin covers a clock that steps back: nothing goes while this signer could still
            # believe it unexpired.
            removed = self.store.collect_expired(now_ms() - self.config.clock_skew_ms, batch)
            for table, count in removed.items():
                total[table] = total.get(table, 0) + count
                self.metrics.state_collected.labels(table).inc(count)
            if max(removed.values(), default=0) < batch:
                break
        counts = self.store.row_counts()
        for table, count in (counts or {}).items():
            self.metrics.state_rows.labels(table).set(count)
        if any(total.values()):
            log.info("signer state collected", extra={"collected": total})
        return total

    def _collect_periodically(self) -> None:
        while not self._stop.wait(self.config.collect_interval_ms / 1000):
            try:
                self.collect()
            except Exception as exc:  # the collector must survive a state outage; the next round retries
                log.warning("collecting expired signer state failed", extra={"error": str(exc)})

    def stopping(self) -> None:
        self.service.stopping()

    def close(self) -> None:
        self._stop.set()
        if self._collector is not None:
            self._collector.join(timeout=5)
        self.service.close()
        self.follower.close()
        self.store.close()
