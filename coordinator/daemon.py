"""The coordinator daemon: stores, serves and streams the operator-signed admission log.

It holds no private key of anyone. It accepts a statement only if the pinned operator key signed it
and it extends the chain; it stores the statement durably before anyone can see it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import prometheus_client

from coordinator.store import LogConflict, LogStore, open_log_store
from countersign._daemon.config import parse_operator_key, validate_daemon
from countersign._daemon.edge import servicer_edge
from countersign._daemon.limits import LimitsConfig
from countersign._daemon.tls import peer_identity
from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import AdmissionError, AdmissionLog, SignedStatement
from countersign.checkpoint import CheckpointError, SignedCheckpoint, check_served
from countersign.client.tls import TlsConfig
from countersign.errors import ConfigError, MalformedError, ServiceError
from countersign.keys import PublicKey

log = logging.getLogger("countersign.coordinator")
MAX_WATCH_BATCH = 1_000
# What each method needs at most (ADR 0027): Submit a statement (at most 1 MiB, spec section 10) with
# its checkpoint; the others a checkpoint or a few numbers. Health and reflection get the server's
# small default. A larger message is refused before it is parsed.
METHOD_MESSAGE_BYTES = {
    "/countersign.v1.Coordinator/Submit": 2 << 20,
    "/countersign.v1.Coordinator/SubmitCheckpoint": 16 << 10,
    "/countersign.v1.Coordinator/GetLog": 4 << 10,
    "/countersign.v1.Coordinator/Watch": 4 << 10,
}


@dataclasses.dataclass
class CoordinatorConfig:
    operator_public_key: str
    listen: str = "127.0.0.1:7400"
    metrics_listen: str = "127.0.0.1:9400"
    log_store: str = "sqlite:///countersign-coordinator.db"
    heartbeat_ms: int = 1_000
    # Each open watch stream holds one handler thread for its lifetime: allow every follower plus
    # room for submissions and log reads.
    max_workers: int = 64
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)  # per-peer limits ([limits])
    ready_file: str = ""
    log_level: str = "info"
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)

    def validate(self) -> None:
        self.limits.validate()
        addresses = {"listen": self.listen, "metrics_listen": self.metrics_listen}
        validate_daemon("coordinator", self.tls, self.operator_public_key, addresses, optional=("metrics_listen",))
        if not 50 <= self.heartbeat_ms <= 60_000:
            raise ConfigError("heartbeat_ms must be between 50 and 60000")


class CoordinatorMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.submissions = prometheus_client.Counter(
            "countersign_coordinator_submissions", "Statements submitted, by result", ["result"], registry=registry
        )
        self.sequence = prometheus_client.Gauge(
            "countersign_registry_sequence", "Statements in the registry log", registry=registry
        )
        self.watchers = prometheus_client.Gauge(
            "countersign_coordinator_watchers", "Open watch streams", registry=registry
        )
        self.checkpoints = prometheus_client.Counter(
            "countersign_coordinator_checkpoints", "Checkpoints submitted, by result", ["result"], registry=registry
        )
        self.checkpoint_expires = prometheus_client.Gauge(
            "countersign_coordinator_checkpoint_expires_ms",
            "expires_ms of the checkpoint served (0: none yet)", registry=registry,
        )  # fmt: skip


class CoordinatorService(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(
        self, key: PublicKey, store: LogStore, heartbeat_ms: int, metrics: CoordinatorMetrics, *, require_operator: bool
    ) -> None:
        self._store = store
        self._heartbeat_ms = heartbeat_ms
        self._metrics = metrics
        self._require_operator = require_operator
        self._changed = threading.Condition()
        # Serialises writers, so a checkpoint is stored without holding _changed: readers (GetLog,
        # Watch) never wait on a durable write of the operator's routine checkpoint renewal.
        self._writing = threading.Lock()
        self._closing = threading.Event()
        self._log = AdmissionLog(key)
        try:
            self._log.extend([SignedStatement.from_bytes(b) for b in store.load()])
        except (AdmissionError, MalformedError) as exc:
            raise ConfigError(f"stored registry log does not verify under the operator key: {exc}") from None
        self._checkpoint: SignedCheckpoint | None = None
        self._checkpoint_bytes = b""
        stored = store.load_checkpoint()
        if stored is not None:
            try:
                checkpoint = SignedCheckpoint.from_bytes(stored)
                check_served(self._log, checkpoint, None, exact=True)
            except (CheckpointError, MalformedError) as exc:
                # Not fatal: followers go stale until the operator's next checkpoint, which is the
                # fail-closed outcome anyway; refusing to start would also stop the log being served.
                log.error("stored checkpoint is unusable; waiting for the operator's next", extra={"error": str(exc)})
            else:
                self._checkpoint, self._checkpoint_bytes = checkpoint, checkpoint.to_bytes()
                metrics.checkpoint_expires.set(checkpoint.checkpoint.expires_ms)
        metrics.sequence.set(self._log.head_sequence)

    def close(self) -> None:
        self._closing.set()
        self._wake()

    def _wake(self) -> None:
        """Wake every waiting watch stream; each checks whether it should still run."""
        with self._changed:
            self._changed.notify_all()

    @servicer_edge
    def Submit(
        self, request: coordinator_pb2.SubmitRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.SubmitResponse:
        if self._require_operator:
            identity = peer_identity(context)
            if identity is None or identity.role != "operator":
                raise ServiceError("NOT_AUTHORISED", "only the operator submits statements")
        try:
            signed = SignedStatement.from_bytes(request.statement)
            checkpoint = SignedCheckpoint.from_bytes(request.checkpoint) if request.checkpoint else None
        except MalformedError as exc:
            self._metrics.submissions.labels("malformed").inc()
            raise ServiceError("INVALID_STATEMENT", str(exc)) from None
        with self._writing, self._changed:
            try:
                registry = self._log.prepare(signed)
                if checkpoint is not None:
                    # Checked against the log as it will be once the statement is appended.
                    after = AdmissionLog(self._log.operator_key, [*self._log.entries, signed], registry)
                    self._check_checkpoint(after, checkpoint)
                stored = None if checkpoint is None else checkpoint.to_bytes()
                self._store.append(signed.statement.sequence, signed.digest(), signed.to_bytes(), stored)
            except AdmissionError as exc:
                self._metrics.submissions.labels(exc.code.lower()).inc()
                raise ServiceError(exc.code, str(exc)) from None
            except LogConflict as exc:
                raise ServiceError("SEQUENCE_CONFLICT", str(exc)) from None
            self._log.commit(signed, registry)
            if checkpoint is not None:
                self._set_checkpoint(checkpoint)
            self._changed.notify_all()
            head, digest = self._log.head_sequence, self._log.head_digest or ""
        self._metrics.submissions.labels("accepted").inc()
        self._metrics.sequence.set(head)
        log.info(
            "statement appended",
            extra={"sequence": signed.statement.sequence, "kind": signed.statement.kind.value,
                   "deployer": signed.statement.deployer, "key_id": signed.statement.key_id},
        )  # fmt: skip
        return coordinator_pb2.SubmitResponse(sequence=signed.statement.sequence, head_digest=digest)

    def _check_checkpoint(self, log_after: AdmissionLog, checkpoint: SignedCheckpoint) -> None:
        """Raises AdmissionError with the checkpoint's refusal code (so Submit maps it like a statement's)."""
        try:
            check_served(log_after, checkpoint, self._checkpoint, exact=True)
        except CheckpointError as exc:
            self._metrics.checkpoints.labels(exc.code.lower()).inc()
            # An older checkpoint is a stale operator loop, not a fork: the same code as a lost race.
            code = "SEQUENCE_CONFLICT" if exc.code == "ROLLBACK" else exc.code
            raise AdmissionError(code, str(exc)) from None

    def _set_checkpoint(self, checkpoint: SignedCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._checkpoint_bytes = checkpoint.to_bytes()
        self._metrics.checkpoints.labels("accepted").inc()
        self._metrics.checkpoint_expires.set(checkpoint.checkpoint.expires_ms)

    @servicer_edge
    def SubmitCheckpoint(
        self, request: coordinator_pb2.SubmitCheckpointRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.SubmitCheckpointResponse:
        if self._require_operator:
            identity = peer_identity(context)
            if identity is None or identity.role != "operator":
                raise ServiceError("NOT_AUTHORISED", "only the operator submits checkpoints")
        try:
            checkpoint = SignedCheckpoint.from_bytes(request.checkpoint)
        except MalformedError as exc:
            self._metrics.checkpoints.labels("malformed").inc()
            raise ServiceError("INVALID_STATEMENT", str(exc)) from None
        with self._writing:
            try:
                with self._changed:
                    self._check_checkpoint(self._log, checkpoint)
                self._store.store_checkpoint(checkpoint.to_bytes())  # only writers wait on this
            except AdmissionError as exc:
                raise ServiceError(exc.code, str(exc)) from None
            with self._changed:
                self._set_checkpoint(checkpoint)
                self._changed.notify_all()  # watchers send it at once, in a heartbeat
                head, digest = self._log.head_sequence, self._log.head_digest or ""
        return coordinator_pb2.SubmitCheckpointResponse(sequence=head, head_digest=digest)

    def _snapshot(self, start: int) -> tuple[list[bytes], int, str, bytes]:
        with self._changed:
            entries = self._log.entries[start : start + MAX_WATCH_BATCH]
            head, digest = self._log.head_sequence, self._log.head_digest or ""
            return [e.to_bytes() for e in entries], head, digest, self._checkpoint_bytes

    @servicer_edge
    def GetLog(
        self, request: coordinator_pb2.GetLogRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.GetLogResponse:
        statements, head, digest, checkpoint = self._snapshot(request.from_sequence)
        return coordinator_pb2.GetLogResponse(
            statements=statements, head_sequence=head, head_digest=digest, checkpoint=checkpoint
        )

    def Watch(
        self, request: coordinator_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[coordinator_pb2.WatchEvent]:
        """Backlog from ``from_sequence``, then each new statement at once, and a heartbeat when idle."""
        interval = (request.heartbeat_ms or self._heartbeat_ms) / 1000
        interval = min(max(interval, 0.05), 60.0)
        position = request.from_sequence
        # Wake this stream as soon as its client goes away, instead of at the end of a heartbeat
        # interval the client chose (up to 60 s): a cancelled watch gives its thread back at once.
        context.add_callback(self._wake)
        self._metrics.watchers.inc()
        try:
            while context.is_active() and not self._closing.is_set():
                statements, head, digest, checkpoint = self._snapshot(position)
                for statement in statements:
                    yield coordinator_pb2.WatchEvent(statement=statement)
                position += len(statements)
                if statements and position < head:
                    continue
                yield coordinator_pb2.WatchEvent(
                    heartbeat=coordinator_pb2.Heartbeat(
                        head_sequence=head,
                        head_digest=digest,
                        sent_ms=time.time_ns() // 1_000_000,
                        checkpoint=checkpoint,
                    )
                )
                with self._changed:
                    if (
                        self._log.head_sequence <= position
                        and self._checkpoint_of(checkpoint)
                        and not self._closing.is_set()
                    ):
                        self._changed.wait(interval)
        finally:
            self._metrics.watchers.dec()

    def _checkpoint_of(self, sent: bytes) -> bool:
        """The checkpoint just sent is still the served one (call with the condition held)."""
        return sent == self._checkpoint_bytes


class CoordinatorDaemon:
    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.metrics_registry = prometheus_client.CollectorRegistry()
        self.metrics = CoordinatorMetrics(self.metrics_registry)
        self.store = open_log_store(config.log_store)
        self.service = CoordinatorService(
            parse_operator_key(config.operator_public_key),
            self.store,
            config.heartbeat_ms,
            self.metrics,
            require_operator=not config.tls.insecure_loopback,
        )

    def register(self, server: grpc.Server) -> Sequence[str]:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.service, server)
        return [coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name]

    def start(self) -> None:
        return None

    def stopping(self) -> None:
        """Shutdown has begun: end the watch streams now (followers reconnect), so they do not hold
        the server for the whole grace period."""
        self.service.close()

    def close(self) -> None:
        self.service.close()
        self.store.close()
