"""The coordinator daemon: stores, serves and streams the operator-signed admission log.

It holds no private key of anyone. It accepts a statement only if the pinned operator key signed it
and it extends the chain; it stores the statement durably before anyone can see it.

Several coordinators may serve one log (replicas on a shared ``log_store``, ADR 0033): each accepts
statements and checkpoints, the store lets one statement take each sequence number and only a newer
checkpoint replace the stored one, and each replica reads what the others stored every ``refresh_ms``
(and before every write), verifying it as it verifies a submission. No replica is trusted more than
another: followers check every statement and checkpoint they are served, whoever serves it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator, Sequence

import grpc
import prometheus_client

from coordinator.log_stores import open_log_store
from coordinator.store import LogConflict, LogStore, StoredCheckpoint
from countersign._clock import now_ms
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
    # How often this replica reads what other replicas appended to the shared log_store (and the
    # checkpoint they stored), so its watchers see every statement within about this long.
    refresh_ms: int = 200
    # Each open watch stream holds one handler thread for its lifetime: allow every follower plus
    # room for submissions and log reads.
    max_workers: int = 64
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)  # per-peer limits ([limits])
    ready_file: str = ""
    lifeline_fd: int = -1  # set by a supervisor that starts the daemon (the local mesh): see run_daemon
    log_level: str = "info"
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)

    def validate(self) -> None:
        self.limits.validate()
        addresses = {"listen": self.listen, "metrics_listen": self.metrics_listen}
        validate_daemon("coordinator", self.tls, self.operator_public_key, addresses, optional=("metrics_listen",))
        if not 50 <= self.heartbeat_ms <= 60_000:
            raise ConfigError("heartbeat_ms must be between 50 and 60000")
        if not 10 <= self.refresh_ms <= 60_000:
            raise ConfigError("refresh_ms must be between 10 and 60000")


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


def _admission_error(exc: AdmissionError) -> ServiceError:
    """The refusal a statement's admission error ends a call with (its status: the edge's table)."""
    return ServiceError(exc.code, str(exc))


def _stored(checkpoint: SignedCheckpoint) -> StoredCheckpoint:
    return StoredCheckpoint(checkpoint.to_bytes(), checkpoint.checkpoint.sequence, checkpoint.checkpoint.issued_ms)


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
        self._checkpoint: SignedCheckpoint | None = None
        self._checkpoint_bytes = b""
        with self._writing:
            self._refresh()
        metrics.sequence.set(self._log.head_sequence)

    def refresh(self) -> int:
        """Take what other replicas stored since this one last looked (statements beyond its head, a
        newer checkpoint); returns the statements taken. Raises ConfigError when the store holds a
        statement that does not verify or forks from this replica's log (it is never served)."""
        with self._writing:
            return self._refresh()

    def _refresh(self) -> int:
        """:meth:`refresh`, with ``_writing`` held. The checkpoint is read before the statements, so the
        statements read reach at least as far as it names."""
        stored_checkpoint = self._store.load_checkpoint()
        stored = self._store.load(self._log.head_sequence)
        added = 0
        if stored:
            try:
                statements = [SignedStatement.from_bytes(b) for b in stored]
                with self._changed:
                    added = self._log.extend(statements)
            except (AdmissionError, MalformedError) as exc:
                raise ConfigError(f"stored registry log does not verify under the operator key: {exc}") from None
        if stored_checkpoint is not None and stored_checkpoint != self._checkpoint_bytes:
            self._take_stored_checkpoint(stored_checkpoint)
        if added:
            with self._changed:
                self._changed.notify_all()
            self._metrics.sequence.set(self._log.head_sequence)
            log.info(
                "statements taken from the shared log", extra={"added": added, "sequence": self._log.head_sequence}
            )
        return added

    def _take_stored_checkpoint(self, stored: bytes) -> None:
        try:
            checkpoint = SignedCheckpoint.from_bytes(stored)
            with self._changed:
                check_served(self._log, checkpoint, self._checkpoint)
        except CheckpointError as exc:
            if exc.code != "ROLLBACK":  # an older one: this replica already serves a newer checkpoint
                # Not fatal: followers go stale until the operator's next checkpoint (the fail-closed
                # outcome anyway); refusing to serve would also stop the log being served.
                log.error("stored checkpoint is unusable; waiting for the operator's next", extra={"error": str(exc)})
            return
        except MalformedError as exc:
            log.error("stored checkpoint is unusable; waiting for the operator's next", extra={"error": str(exc)})
            return
        with self._changed:
            self._set_checkpoint(checkpoint, counted=False)
            self._changed.notify_all()

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
        sequence = signed.statement.sequence
        with self._writing:
            self._refresh()  # another replica may have appended since this one last looked
            if self._holds(signed):  # already in the log (a retry, at this replica or another): accepted
                self._metrics.submissions.labels("retried").inc()
                return coordinator_pb2.SubmitResponse(sequence=sequence, head_digest=self._log.head_digest or "")
            with self._changed:
                try:
                    registry = self._log.prepare(signed)
                    if checkpoint is not None:
                        # Checked against the log as it will be once the statement is appended.
                        after = AdmissionLog(self._log.operator_key, [*self._log.entries, signed], registry)
                        self._check_checkpoint(after, checkpoint)
                except AdmissionError as exc:
                    self._metrics.submissions.labels(exc.code.lower()).inc()
                    raise _admission_error(exc) from None
            stored = None if checkpoint is None else _stored(checkpoint)
            try:
                self._store.append(sequence, signed.digest(), signed.to_bytes(), stored)
            except LogConflict as exc:
                # Another replica took the sequence (or stored a newer checkpoint) first. The very same
                # statement taken by another replica (an operator's retry there) is accepted as it is.
                self._refresh()
                if not self._holds(signed):
                    self._metrics.submissions.labels("sequence_conflict").inc()
                    raise ServiceError("SEQUENCE_CONFLICT", str(exc)) from None
            else:
                with self._changed:
                    self._log.commit(signed, registry)
                    if checkpoint is not None:
                        self._set_checkpoint(checkpoint)
                    self._changed.notify_all()
            with self._changed:
                head, digest = self._log.head_sequence, self._log.head_digest or ""
        self._metrics.submissions.labels("accepted").inc()
        self._metrics.sequence.set(head)
        log.info(
            "statement appended",
            extra={"sequence": signed.statement.sequence, "kind": signed.statement.kind.value,
                   "deployer": signed.statement.deployer, "key_id": signed.statement.key_id},
        )  # fmt: skip
        return coordinator_pb2.SubmitResponse(sequence=signed.statement.sequence, head_digest=digest)

    def _holds(self, signed: SignedStatement) -> bool:
        """Whether the log already holds this very statement at its sequence."""
        with self._changed:
            entries = self._log.entries
            sequence = signed.statement.sequence
            return sequence < len(entries) and entries[sequence].digest() == signed.digest()

    def _check_checkpoint(self, log_after: AdmissionLog, checkpoint: SignedCheckpoint) -> None:
        """Raises AdmissionError with the checkpoint's refusal code (so Submit maps it like a statement's)."""
        try:
            check_served(log_after, checkpoint, self._checkpoint, exact=True)
        except CheckpointError as exc:
            self._metrics.checkpoints.labels(exc.code.lower()).inc()
            # An older checkpoint is a stale operator loop, not a fork: the same code as a lost race.
            code = "SEQUENCE_CONFLICT" if exc.code == "ROLLBACK" else exc.code
            raise AdmissionError(code, str(exc)) from None

    def _set_checkpoint(self, checkpoint: SignedCheckpoint, *, counted: bool = True) -> None:
        self._checkpoint = checkpoint
        self._checkpoint_bytes = checkpoint.to_bytes()
        if counted:  # submitted here (not taken from another replica's write)
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
            self._refresh()
            try:
                with self._changed:
                    self._check_checkpoint(self._log, checkpoint)
            except AdmissionError as exc:
                raise _admission_error(exc) from None
            if not self._store.store_checkpoint(_stored(checkpoint)):  # only writers wait on this
                self._refresh()  # another replica stored a newer one: serve that
                self._metrics.checkpoints.labels("sequence_conflict").inc()
                raise ServiceError("SEQUENCE_CONFLICT", "a newer checkpoint is stored")
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
                        sent_ms=now_ms(),
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
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def register(self, server: grpc.Server) -> Sequence[str]:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.service, server)
        return [coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name]

    def start(self) -> None:
        self._refresher = threading.Thread(target=self._refresh_periodically, name="log-refresher", daemon=True)
        self._refresher.start()

    def _refresh_periodically(self) -> None:
        """Read what other replicas appended: every ``refresh_ms``; an unreachable store is retried."""
        while not self._stop.wait(self.config.refresh_ms / 1000):
            try:
                self.service.refresh()
            except Exception as exc:  # the refresher must survive a store outage; the next round retries
                log.warning("reading the shared registry log failed", extra={"error": str(exc)})

    def stopping(self) -> None:
        """Shutdown has begun: end the watch streams now (followers reconnect), so they do not hold
        the server for the whole grace period."""
        self.service.close()

    def close(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(timeout=5)
        self.service.close()
        self.store.close()
