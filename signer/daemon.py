"""The signer daemon: one per deployer, the only holder of the deployer's key.

Its runtime asks it to sign root records, local children and output receipts, and to open grants
for named child deployers. A child deployer's signer asks it to co-sign an edge manifest; it co-signs
only an edge that spends an open grant of its own runtime and keeps its policy. When this signer is
the child, it asks the parent's signer over mTLS and fails closed on refusal, timeout or outage,
leaving no record behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Generic, TypeVar

import grpc
import prometheus_client

from countersign._daemon.config import parse_address, parse_operator_key, validate_daemon, validate_follower
from countersign._daemon.edge import refusal_error, servicer_edge, stream_edge
from countersign._daemon.lane_slots import LaneSlots
from countersign._daemon.limits import LimitsConfig
from countersign._daemon.registry_follower import RegistryFollower, now_ms
from countersign._daemon.tls import peer_identity
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.canonical import sha256_digest
from countersign.client.runtime_calls import RUNTIME_METHODS, runtime_answer
from countersign.client.tls import TlsConfig
from countersign.constructions import EdgeProposal, RecordFields, cosign, draft_record, seal
from countersign.cosigning import (
    CONSTRUCTION,
    DEFAULT_MAX_SESSION_OUTPUTS,
    AgentRequest,
    ChunkBuffer,
    EarlierAnswer,
    EarlierClose,
    ReceiptRequest,
    Refusal,
    SignerPolicy,
    advanced,
    delegation_parent_key,
    delegation_request_refusal,
    edge_refusal,
    fanout_refusal,
    grant_request_refusal,
    local_child_refusal,
    open_grant,
    parent_cosignature,
    parent_failure,
    peer_certificate_refusal,
    peer_refusal,
    positioned,
    proposal_refusal,
    receipt_fields,
    receipt_parent_refusal,
    record_fields,
    runtime_refusal,
    session_position,
    spend_grant,
    stream_spec,
)
from countersign.errors import ConfigError, ErrorCode, MalformedError, ServiceError
from countersign.keys import PublicKey, Signer
from countersign.records import (
    MAX_DEPTH,
    CoSignature,
    CoSignerRole,
    Envelope,
    LifecycleEvent,
    NodeRecord,
    Path,
    StreamChunk,
    parse_json,
)
from countersign.registry import Registry
from countersign.verify import MAX_CLOCK_SKEW_MS
from signer.backends import load_signer
from signer.peers import PeerPool, Peers
from signer.store import DEFAULT_COLLECT_BATCH, SignerStore, Transaction

log = logging.getLogger("countersign.signer")
PARSED_PATH_CACHE = 1024
MAX_LANES = 64
# Every signer method carries at most a path (1 MiB, spec section 10) and small fields, so each is held
# to this (ADR 0027); health and reflection get the server's small default.
SIGNER_MESSAGE_BYTES = 2 << 20
METHOD_MESSAGE_BYTES = {
    f"/countersign.v1.Signer/{method.name}": SIGNER_MESSAGE_BYTES
    for method in signer_pb2.DESCRIPTOR.services_by_name["Signer"].methods
}
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0)


@dataclasses.dataclass
class SignerConfig:
    deployer: str
    signer_key: str
    operator_public_key: str
    coordinator: str
    registry_cache: str
    listen: str = "127.0.0.1:7401"
    metrics_listen: str = "127.0.0.1:9401"
    state_url: str = "sqlite:///countersign-signer.db"
    allowed_children: list[str] = dataclasses.field(default_factory=list)
    max_depth: int = 16
    max_ttl_ms: int = 24 * 3_600_000
    max_grant_ttl_ms: int = 600_000
    max_session_outputs: int = DEFAULT_MAX_SESSION_OUTPUTS  # receipts per session (ADR 0018)
    # One StreamReceipts call signs at most this many chunks and reads at most this many messages
    # (a message without output still costs a read): a stream is a slot held, so it must end.
    max_stream_chunks: int = 10_000
    max_stream_messages: int = 100_000
    cosign_timeout_ms: int = 2_000
    # Lanes (countersign/client/lanes.py): at most this many open from each peer deployer's signer
    # and from each runtime connection, and as many co-signing lanes opened to each parent; a
    # co-signing lane idle this long is closed.
    lanes_per_peer: int = 4
    lane_idle_ms: int = 1_000
    clock_skew_ms: int = 60_000
    staleness_ms: int = 30_000
    heartbeat_ms: int = 1_000
    ready_file: str = ""
    log_level: str = "info"
    # A delegation's handler waits on the parent's signer while holding its thread, two signers may
    # wait on each other, and each open lane from a peer holds a thread: keep enough threads that
    # neither starves the other calls.
    max_workers: int = 32
    # The state collector (ADR 0026): every this often, forget rows past their expiry plus clock_skew_ms,
    # at most collect_batch rows per table per transaction.
    collect_interval_ms: int = 60_000
    collect_batch: int = DEFAULT_COLLECT_BATCH
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)  # per-peer limits ([limits])
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)

    def validate(self) -> None:
        self.limits.validate()
        addresses = {"listen": self.listen, "metrics_listen": self.metrics_listen, "coordinator": self.coordinator}
        validate_daemon("signer", self.tls, self.operator_public_key, addresses, optional=("metrics_listen",))
        validate_follower(self.clock_skew_ms, self.registry_cache, MAX_CLOCK_SKEW_MS)
        if not 0 <= self.max_depth <= MAX_DEPTH:
            raise ConfigError(f"max_depth must be between 0 and {MAX_DEPTH}")
        if self.cosign_timeout_ms < 1:
            raise ConfigError("cosign_timeout_ms must be positive")
        if not 1 <= self.lanes_per_peer <= MAX_LANES:
            raise ConfigError(f"lanes_per_peer must be between 1 and {MAX_LANES}")
        if self.lane_idle_ms < 1:
            raise ConfigError("lane_idle_ms must be positive")
        if self.max_session_outputs < 1:
            raise ConfigError("max_session_outputs must be positive")
        if self.max_stream_chunks < 1 or self.max_stream_messages < 1:
            raise ConfigError("max_stream_chunks and max_stream_messages must be positive")
        if self.collect_interval_ms < 1 or self.collect_batch < 1:
            raise ConfigError("collect_interval_ms and collect_batch must be positive")

    @property
    def policy(self) -> SignerPolicy:
        return SignerPolicy(
            deployer=self.deployer, allowed_children=frozenset(self.allowed_children), max_depth=self.max_depth,
            max_ttl_ms=self.max_ttl_ms, max_grant_ttl_ms=self.max_grant_ttl_ms, clock_skew_ms=self.clock_skew_ms,
        )  # fmt: skip


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
            "countersign_signer_commit_seconds", "State commits, by sync (full: survives power loss; normal)",
            ["sync"], registry=registry, buckets=LATENCY_BUCKETS,
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


class SignerService(signer_pb2_grpc.SignerServicer):
    """The signer's RPCs: each reads what it needs (the request, the registry copy, its state), asks
    the rules in :mod:`countersign.cosigning`, and signs, stores and answers what they allow.

    ``peers`` reaches the parents' signers (default: a :class:`PeerPool` over mTLS).
    """

    def __init__(
        self,
        config: SignerConfig,
        key: Signer,
        store: SignerStore,
        follower: RegistryFollower,
        metrics: SignerMetrics,
        peers: Peers | None = None,
    ) -> None:
        self._config = config
        self._policy = config.policy
        self._key = key
        self._store = store
        self._follower = follower
        self._metrics = metrics
        self._peers = peers or PeerPool(config.tls, config.lanes_per_peer, config.lane_idle_ms / 1000)
        self._parsed: Bounded[bytes, Path] = Bounded(PARSED_PATH_CACHE)
        self._own_parents: Bounded[bytes, tuple[Path, str]] = Bounded(PARSED_PATH_CACHE)
        self._lane_slots = LaneSlots(config.lanes_per_peer, metrics.lanes)

    def close(self) -> None:
        self._peers.close()

    def stopping(self) -> None:
        """Shutdown has begun: end the idle lanes now (a busy one ends once its call is answered), so
        lanes do not hold the server for its grace period. Peers open new lanes to wherever this
        deployer's signer comes back."""
        self._lane_slots.stop()

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

    def _own_parent(self, data: bytes) -> tuple[Path, str]:
        """The path of a record this signer issued (as stored when issued), and that record's digest.

        The stored path was checked when the record was issued and its leaf binds the prefix by
        digest, so it is not verified again here. Kept by the digest of the bytes naming it.
        """
        key = hashlib.sha256(data).digest()
        known = self._own_parents.get(key)
        if known is not None:
            return known
        digest = self._parse_path(data).leaf.digest()
        stored = self._store.issued_path(digest)
        if stored is None:
            raise _refuse(ErrorCode.PARENT_UNKNOWN, "the parent record was not issued by this signer")
        known = (Path.from_bytes(stored), digest)
        self._own_parents.put(key, known)
        return known

    # --- answering ------------------------------------------------------------------------------

    def _response(self, envelopes: Sequence[Envelope]) -> signer_pb2.IssueResponse:
        path = Path(tuple(envelopes))
        return signer_pb2.IssueResponse(path=path.to_bytes(), record_digest=path.leaf.digest())

    def _record(self, method: str, path: Path) -> signer_pb2.IssueResponse:
        """Store a newly issued record that spent nothing here (a root, or an accepted delegation whose
        child slot the parent's signer spent durably) and answer with it."""
        data, digest = path.to_bytes(), path.leaf.digest()
        self._store.transaction(lambda tx: tx.record_issued(digest, data, path.leaf.record.expires_ms), durable=False)
        self._metrics.requests.labels(method, "OK").inc()
        return signer_pb2.IssueResponse(path=data, record_digest=digest)

    def _issue_local(self, parent: Path, parent_digest: str, fields: RecordFields) -> Envelope:
        """Sign a same-deployer child of ``parent``, spending a child slot."""
        _check(local_child_refusal(self._policy, parent))

        def work(tx: Transaction) -> Envelope:
            _check(fanout_refusal(parent.leaf.record, tx.child_count(parent_digest)))
            envelope = seal(draft_record(CONSTRUCTION, fields, self._key.key_id, parent.envelopes), self._key)
            tx.add_child(parent_digest, envelope.record.nonce)
            tx.record_issued(
                envelope.digest(), Path((*parent.envelopes, envelope)).to_bytes(), envelope.record.expires_ms
            )
            return envelope

        return self._store.transaction(work)

    def _issue_receipt(self, parent: Path, parent_digest: str, fields: RecordFields) -> bytes:
        """Sign the next receipt of its session under ``parent`` and store the session's new state, in
        one transaction: receipts spend no child slot (ADR 0018), only a place in their session.
        Answers the new path's bytes (for a retried close, the close receipt issued before)."""
        _check(local_child_refusal(self._policy, parent))
        _check(receipt_parent_refusal(parent.leaf.record))
        output = fields.output
        assert output is not None  # a receipt's fields carry its output
        limit = self._config.max_session_outputs

        def work(tx: Transaction) -> bytes:
            state = tx.session(parent_digest, output.session)
            position = session_position(state, agent_digest=parent_digest, output=output, max_outputs=limit)
            if isinstance(position, Refusal):
                raise refusal_error(position)
            if isinstance(position, EarlierClose):
                return self._store_path(tx, position.digest)
            placed = replace(fields, output=positioned(output, position[0], position[1]))
            envelope = seal(draft_record(CONSTRUCTION, placed, self._key.key_id, parent.envelopes), self._key)
            digest, data = envelope.digest(), Path((*parent.envelopes, envelope)).to_bytes()
            tx.record_issued(digest, data, envelope.record.expires_ms)
            assert envelope.record.output is not None
            tx.store_session(advanced(state, output.session, parent_digest, envelope.record.output, digest))
            return data

        return self._store.transaction(work)

    @staticmethod
    def _store_path(tx: Transaction, digest: str) -> bytes:
        data = tx.issued_path(digest)
        if data is None:  # the close receipt's record was collected: nothing to answer again
            raise _refuse(ErrorCode.SESSION_CLOSED, "the session is closed")
        return data

    def _receipt_response(self, method: str, data: bytes) -> signer_pb2.IssueResponse:
        self._metrics.requests.labels(method, "OK").inc()
        return signer_pb2.IssueResponse(path=data, record_digest=Path.from_bytes(data).leaf.digest())

    # --- runtime RPCs ---------------------------------------------------------------------------

    @servicer_edge
    def IssueRoot(
        self, request: signer_pb2.IssueRootRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        agent = _agent_request(request.agent, request.agent.system)
        fields = _allowed(record_fields(self._policy, agent, None, LifecycleEvent.NEW, now_ms()))
        envelope = seal(draft_record(CONSTRUCTION, fields, self._key.key_id, ()), self._key)
        return self._record("IssueRoot", Path((envelope,)))

    @servicer_edge
    def IssueLocalChild(
        self, request: signer_pb2.IssueLocalChildRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()  # every signing refuses on a stale registry copy (spec 7.3), not only delegations
        parent, digest = self._own_parent(request.parent_path)
        parent_record = parent.leaf.record
        agent = _agent_request(request.agent, parent_record.agent.system)
        fields = _allowed(record_fields(self._policy, agent, parent_record.expires_ms, LifecycleEvent.BRANCH, now_ms()))
        envelope = self._issue_local(parent, digest, fields)
        self._metrics.requests.labels("IssueLocalChild", "OK").inc()
        return self._response([*parent.envelopes, envelope])

    @servicer_edge
    def IssueReceipt(
        self, request: signer_pb2.IssueReceiptRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        parent, digest = self._own_parent(request.parent_path)
        receipt = ReceiptRequest(
            output_sha256=request.output_sha256, binding_scope=request.binding_scope, session=request.session,
            instance=request.instance, ttl_ms=request.ttl_ms,
        )  # fmt: skip
        fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
        return self._receipt_response("IssueReceipt", self._issue_receipt(parent, digest, fields))

    @servicer_edge
    def CloseSession(
        self, request: signer_pb2.CloseSessionRequest, context: grpc.ServicerContext
    ) -> signer_pb2.IssueResponse:
        self._require_runtime(context)
        self._registry()
        parent, digest = self._own_parent(request.parent_path)
        receipt = ReceiptRequest(
            output_sha256=hashlib.sha256(b"").digest(), session=request.session, instance=request.instance,
            ttl_ms=request.ttl_ms, close=True,
        )  # fmt: skip
        fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
        answer = self._receipt_response("CloseSession", self._issue_receipt(parent, digest, fields))
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
        parent, digest = self._own_parent(first.parent_path)
        buffer = ChunkBuffer(unit, n)

        signed = 0

        def sign(data: bytes, units: int, close: bool = False) -> signer_pb2.ChunkReceipt:
            nonlocal signed
            signed += not close  # the close receipt ends the stream: it is not a chunk
            if signed > config.max_stream_chunks:
                raise _refuse(
                    ErrorCode.RESOURCE_EXHAUSTED,
                    f"a stream signs at most {config.max_stream_chunks} chunks; continue the session in another stream",
                )
            receipt = ReceiptRequest(
                output_sha256=hashlib.sha256(data).digest(), session=first.session, instance=first.instance,
                ttl_ms=first.ttl_ms, stream=None if close else StreamChunk(unit, n, units), close=close,
            )  # fmt: skip
            fields = _allowed(receipt_fields(self._policy, parent.leaf.record, receipt, now_ms()))
            path = Path.from_bytes(self._issue_receipt(parent, digest, fields))
            output = path.leaf.record.output
            assert output is not None
            self._metrics.requests.labels("StreamReceipts", "OK").inc()
            return signer_pb2.ChunkReceipt(
                path=path.to_bytes(), record_digest=path.leaf.digest(), seq=output.seq,
                units=0 if close else units, closed=close,
            )  # fmt: skip

        message: signer_pb2.OutputChunk | None = first
        closing = False
        while message is not None:
            if message is not first and (message.parent_path or message.session or message.unit or message.n):
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
        parent, digest = self._own_parent(request.parent_path)
        child, grant_id = request.child_deployer, secrets.token_hex(16)
        grant = _allowed(open_grant(self._policy, parent, digest, child, request.ttl_ms, registry, now_ms(), grant_id))
        self._store.transaction(lambda tx: tx.open_grant(grant))
        self._metrics.requests.labels("OpenGrant", "OK").inc()
        log.info("grant opened", extra={"grant_id": grant.grant_id, "child_deployer": child, "parent": digest})
        return signer_pb2.OpenGrantResponse(
            grant_id=grant.grant_id, parent_digest=digest, parent_key_id=self._key.key_id, expires_ms=grant.expires_ms
        )

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
        # The parent path is not verified here: the parent's signer co-signs only a record it issued
        # (its leaf binds the prefix by digest), and the parent's co-signature is verified below.
        parent = self._parse_path(request.parent_path)
        _check(delegation_request_refusal(request.grant_id, request.parent_key_id))
        try:
            parse_address(request.parent_signer, "parent_signer")
        except ConfigError as exc:
            raise _refuse(ErrorCode.INVALID_ARGUMENT, str(exc)) from None
        parent_record = parent.leaf.record
        parent_key = _allowed(
            delegation_parent_key(self._policy, parent_record, request.parent_key_id, registry, now_ms())
        )
        proposal, child_cosig, sealed = self._proposal(request, parent)
        if sealed is not None:  # this delegation completed before; its answer may have been lost
            self._metrics.requests.labels("AcceptDelegation", "OK").inc()
            return signer_pb2.IssueResponse(path=sealed, record_digest=Path.from_bytes(sealed).leaf.digest())
        parent_cosig = self._ask_parent(request, proposal, child_cosig, parent_key)
        envelope = seal(replace(proposal.child, cosigs=(parent_cosig, child_cosig)), self._key)
        path = Path((*parent.envelopes, envelope))
        data, digest = path.to_bytes(), envelope.digest()

        def seal_edge(tx: Transaction) -> None:
            tx.record_issued(digest, data, envelope.record.expires_ms)
            tx.seal_proposal(request.grant_id, data)

        self._store.transaction(seal_edge, durable=False)
        self._metrics.requests.labels("AcceptDelegation", "OK").inc()
        log.info("delegation accepted", extra={"parent_deployer": parent_record.deployer, "record": digest})
        return signer_pb2.IssueResponse(path=data, record_digest=digest)

    def _proposal(
        self, request: signer_pb2.AcceptDelegationRequest, parent: Path
    ) -> tuple[EdgeProposal, CoSignature, bytes | None]:
        """The edge to propose under this grant: the one proposed before if this is a retry (so that a
        parent that co-signed it but whose answer was lost answers the same again), else a new one.

        Kept until it expires, so a delegation interrupted after the parent spent the grant is
        completed by retrying it, instead of leaving a spent grant and no record; and a retry after
        success returns the same record. One grant, one edge, whatever the runtime asks again.
        """
        parent_digest = parent.leaf.digest()
        parent_record = parent.leaf.record

        def propose(tx: Transaction) -> tuple[EdgeProposal, CoSignature, bytes | None]:
            earlier = tx.proposal(request.grant_id)
            if earlier is not None:
                earlier_parent, child_bytes, cosig_json, sealed = earlier
                _check(proposal_refusal(earlier_parent, parent_digest))
                child = NodeRecord.from_json(parse_json(child_bytes))
                cosig = CoSignature.from_json(parse_json(cosig_json))
                return EdgeProposal(parent.leaf, child, request.parent_key_id), cosig, sealed
            now = now_ms()
            tx.forget_expired_proposals(now)
            agent = _agent_request(request.agent, parent_record.agent.system)
            fields = _allowed(record_fields(self._policy, agent, parent_record.expires_ms, LifecycleEvent.NEW, now))
            draft = draft_record(CONSTRUCTION, fields, self._key.key_id, parent.envelopes)
            proposal = EdgeProposal(parent.leaf, draft, request.parent_key_id)
            child_cosig = cosign(proposal, self._key, CoSignerRole.CHILD)
            tx.save_proposal(
                request.grant_id,
                parent_digest,
                proposal.child_bytes,
                json.dumps(child_cosig.to_json()),
                draft.expires_ms,
            )
            return proposal, child_cosig, None

        return self._store.transaction(propose, durable=False)

    def _ask_parent(
        self,
        request: signer_pb2.AcceptDelegationRequest,
        proposal: EdgeProposal,
        child_cosig: CoSignature,
        parent_key: PublicKey,
    ) -> CoSignature:
        """Ask the parent's signer for its co-signature; any failure fails the delegation closed."""
        parent_deployer = proposal.parent.record.deployer
        call = signer_pb2.CoSignEdgeRequest(
            grant_id=request.grant_id,
            parent_path=request.parent_path,
            child_record=proposal.child_bytes,
            child_cosignature=json.dumps(child_cosig.to_json()),
        )
        started = time.perf_counter()
        outcome = "error"
        lanes = self._peers.lanes(request.parent_signer, parent_deployer)
        try:
            response = lanes.ask(call, self._config.cosign_timeout_ms / 1000)
            outcome = "ok"
        except ServiceError as error:
            if error.code is ErrorCode.UNAVAILABLE:  # the transport failed (a refusal carries its own code)
                self._peers.forget(request.parent_signer, parent_deployer, lanes)
            outcome = "unreachable" if error.retryable else "refused"
            refusal = parent_failure(parent_deployer, error.code, str(error), retryable=error.retryable)
            raise refusal_error(refusal, details={"parent_code": error.code}) from None
        finally:
            self._metrics.cosign_latency.labels(outcome).observe(time.perf_counter() - started)
        return _allowed(parent_cosignature(proposal, response.parent_cosignature, parent_key))

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
        max_children = parent.leaf.record.max_children

        def work(tx: Transaction) -> str:
            decision = spend_grant(
                tx.grant(request.grant_id), child_deployer=child.deployer, parent_digest=parent_digest,
                manifest_digest=manifest_digest, max_children=max_children,
                child_count=tx.child_count(parent_digest), now_ms=now_ms(),
            )  # fmt: skip
            if isinstance(decision, EarlierAnswer):  # the same edge asked again (a retry): same answer
                return decision.parent_cosig
            _check(decision)
            if not context.is_active():  # the child gave up (deadline, cancel): do not spend the grant
                raise _refuse(ErrorCode.CANCELLED, "the request was cancelled before the grant was spent")
            answer = json.dumps(cosign(proposal, self._key, CoSignerRole.PARENT).to_json())
            tx.use_grant(request.grant_id, manifest_digest, answer)
            tx.add_child(parent_digest, child.nonce)
            return answer

        answer = self._store.transaction(work)
        log.info("edge co-signed", extra={"grant_id": request.grant_id, "child_deployer": child.deployer})
        return signer_pb2.CoSignEdgeResponse(parent_cosignature=answer)


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
        full, normal = self.metrics.commit_latency.labels("full"), self.metrics.commit_latency.labels("normal")
        self.store = SignerStore(
            config.state_url, on_commit=lambda durable, seconds: (full if durable else normal).observe(seconds)
        )
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
        """One collection round: batches until a batch comes back short. Returns rows forgotten per table."""
        batch = self.config.collect_batch
        total: dict[str, int] = {}
        while not self._stop.is_set():
            # The margin covers a clock that steps back: nothing goes while this signer could still
            # believe it unexpired.
            removed = self.store.collect_expired(now_ms() - self.config.clock_skew_ms, limit=batch)
            for table, count in removed.items():
                total[table] = total.get(table, 0) + count
                self.metrics.state_collected.labels(table).inc(count)
            if max(removed.values()) < batch:
                break
        for table, count in self.store.row_counts().items():
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
