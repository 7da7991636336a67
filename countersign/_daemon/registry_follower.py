"""A daemon's verified, persisted copy of the admission log, kept current by the coordinator's stream.

Signers and verifiers both hold one. Every statement is checked against the pinned operator key and
the chain before it is applied; the copy is written to disk after each change, so a restart resumes
from it. A served log that is shorter (rollback) or different (fork) is refused and logged, and the
copy stops counting as fresh: once no trusted heartbeat has arrived for ``staleness_ms``, the owner
fails closed (the verifier answers ``REGISTRY_STALE``).

A follower may name several coordinators (replicas serving one log, comma-separated): it follows one
at a time and moves to the next when the stream breaks, goes silent, or the coordinator is refused;
with several, also when the copy stays stale while connected (a coordinator that withholds or froze).
No coordinator is trusted more than another: every statement and checkpoint is checked the same.

Heartbeats are unsigned, so they only show the stream is alive. The copy is fresh only while it also
holds an operator-signed checkpoint (countersign.checkpoint) that has not expired and that the copy
extends: a coordinator that withholds a statement, freezes, or serves an old checkpoint makes every
follower stale by the checkpoint's ``expires_ms`` at the latest.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import prometheus_client

from countersign._clock import now_ms
from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import AdmissionError, AdmissionLog, SignedStatement
from countersign.checkpoint import CheckpointError, SignedCheckpoint, check_served
from countersign.checkpoint import fresh as checkpoint_fresh
from countersign.client.tls import TlsConfig, coordinator_dns, open_channel
from countersign.errors import ConfigError, MalformedError
from countersign.keys import PublicKey
from countersign.registry import Registry

log = logging.getLogger("countersign.registry")


class RegistryFollower:
    def __init__(
        self,
        *,
        operator_key: PublicKey,
        coordinator: str,
        tls: TlsConfig,
        cache_path: str,
        staleness_ms: int,
        heartbeat_ms: int = 1_000,
        clock: Callable[[], int] = now_ms,
        on_change: Callable[[Registry], None] | None = None,
    ) -> None:
        self._operator_key = operator_key
        self._coordinators = [address.strip() for address in coordinator.split(",") if address.strip()]
        if not self._coordinators:
            raise ConfigError("coordinator must name at least one address")
        self._next = 0  # the coordinator the next stream is opened to
        self._tls = tls
        self._cache = Path(cache_path) if cache_path else None
        self.staleness_ms = staleness_ms
        self._heartbeat_ms = heartbeat_ms
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._call: grpc.Future | None = None
        self._log = AdmissionLog(operator_key)
        self._last_fresh_ms = 0
        self._persisted_fresh_ms = 0
        self._checkpoint: SignedCheckpoint | None = None
        self.trusted = True
        self._load()

    # --- the view the daemon uses --------------------------------------------------------------

    def view(self) -> tuple[Registry, bool]:
        """The current registry and whether it is fresh: a heartbeat within staleness_ms, and an
        unexpired operator checkpoint this copy extends."""
        with self._lock:
            registry = self._log.registry
            now = self._clock()
            alive = now - self._last_fresh_ms <= self.staleness_ms
            fresh = alive and checkpoint_fresh(self._log, self._checkpoint, now)
        return registry, fresh

    @property
    def checkpoint(self) -> SignedCheckpoint | None:
        with self._lock:
            return self._checkpoint

    def checkpoint_expires_in_seconds(self) -> float:
        """Seconds until the held checkpoint expires (negative once expired; -inf with none)."""
        with self._lock:
            if self._checkpoint is None:
                return float("-inf")
            return (self._checkpoint.checkpoint.expires_ms - self._clock()) / 1000

    def register_gauges(self, registry: prometheus_client.CollectorRegistry) -> None:
        """Export this copy's position and age (read when Prometheus scrapes)."""
        sequence = prometheus_client.Gauge(
            "countersign_registry_sequence", "Statements in this daemon's registry copy", registry=registry
        )
        sequence.set_function(lambda: self.sequence)
        staleness = prometheus_client.Gauge(
            "countersign_registry_staleness_seconds", "Seconds since the last trusted registry heartbeat",
            registry=registry,
        )  # fmt: skip
        staleness.set_function(self.staleness_seconds)
        expires = prometheus_client.Gauge(
            "countersign_registry_checkpoint_expires_in_seconds",
            "Seconds until the operator checkpoint this copy holds expires (negative: expired, stale)",
            registry=registry,
        )
        expires.set_function(self.checkpoint_expires_in_seconds)

    def staleness_seconds(self) -> float:
        with self._lock:
            return max(0.0, (self._clock() - self._last_fresh_ms) / 1000) if self._last_fresh_ms else float("inf")

    @property
    def sequence(self) -> int:
        with self._lock:
            return self._log.head_sequence

    def wait_for_sequence(self, sequence: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.sequence >= sequence:
                return True
            time.sleep(0.01)
        return self.sequence >= sequence

    # --- persistence -------------------------------------------------------------------------

    def _load(self) -> None:
        if self._cache is None or not self._cache.exists():
            return
        try:
            body = json.loads(self._cache.read_text())
            statements = [SignedStatement.from_bytes(base64.b64decode(s)) for s in body["statements"]]
            self._log.extend(statements)
            self._last_fresh_ms = int(body.get("last_fresh_ms", 0))
            if body.get("checkpoint"):
                checkpoint = SignedCheckpoint.from_bytes(base64.b64decode(body["checkpoint"]))
                check_served(self._log, checkpoint, None)
                self._checkpoint = checkpoint
        except (OSError, ValueError, KeyError, TypeError, MalformedError, AdmissionError, CheckpointError) as exc:
            raise ConfigError(f"registry cache {self._cache} is unusable ({exc}); remove it to resync") from None
        self._persisted_fresh_ms = self._last_fresh_ms
        log.info("registry cache loaded", extra={"sequence": self._log.head_sequence})

    def _persist(self) -> None:
        if self._cache is None:
            return
        body = {
            "operator_key_id": self._operator_key.key_id,
            "last_fresh_ms": self._last_fresh_ms,
            "checkpoint": None if self._checkpoint is None else base64.b64encode(self._checkpoint.to_bytes()).decode(),
            "statements": [base64.b64encode(s.to_bytes()).decode() for s in self._log.entries],
        }
        temporary = self._cache.with_name(self._cache.name + ".tmp")
        temporary.write_text(json.dumps(body))
        os.replace(temporary, self._cache)
        self._persisted_fresh_ms = self._last_fresh_ms

    # --- following the coordinator -----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._follow, name="registry-follower", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _follow(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._stream_once()
                backoff = 0.05
            except grpc.RpcError as exc:
                if not self._stop.is_set():
                    log.warning(
                        "registry stream interrupted", extra={"code": str(exc.code()), "coordinator": self.coordinator}
                    )
                self._move_on()
            except (AdmissionError, MalformedError, CheckpointError) as exc:
                self.trusted = False
                log.error(
                    "registry refused from coordinator",
                    extra={"error": str(exc), "code": getattr(exc, "code", ""), "coordinator": self.coordinator},
                )
                self._move_on()
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    @property
    def coordinator(self) -> str:
        """The coordinator followed now (or next)."""
        return self._coordinators[self._next % len(self._coordinators)]

    def _move_on(self) -> None:
        """Follow the next coordinator from now on (the same one, when only one is named)."""
        self._next = (self._next + 1) % len(self._coordinators)

    def _stream_once(self) -> None:
        channel = open_channel(self.coordinator, self._tls, coordinator_dns())
        try:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            request = coordinator_pb2.WatchRequest(from_sequence=self.sequence, heartbeat_ms=self._heartbeat_ms)
            call = stub.Watch(request)
            self._call = call
            watchdog = threading.Thread(target=self._watchdog, args=(call,), daemon=True)
            self._last_event = time.monotonic()
            watchdog.start()
            for event in call:
                self._last_event = time.monotonic()
                if event.HasField("statement"):
                    self._apply(SignedStatement.from_bytes(event.statement))
                else:
                    self._heartbeat(event.heartbeat)
                if self._stop.is_set():
                    call.cancel()
                    return
        finally:
            self._call = None
            channel.close()

    def _watchdog(self, call: grpc.Future) -> None:
        """Cancel a stream that went silent (no statement or heartbeat for three intervals)."""
        limit = max(3 * self._heartbeat_ms / 1000, 1.0)
        stale_since: float | None = None
        while call.running() if hasattr(call, "running") else True:
            if self._stop.wait(limit / 3):
                call.cancel()
                return
            if time.monotonic() - self._last_event > limit:
                log.warning("registry stream silent; reconnecting", extra={"coordinator": self.coordinator})
                call.cancel()
                return
            if len(self._coordinators) > 1 and not self.view()[1]:
                stale_since = stale_since or time.monotonic()
                if time.monotonic() - stale_since > limit:
                    log.warning("registry copy stale while connected; trying the next coordinator",
                                extra={"coordinator": self.coordinator})  # fmt: skip
                    call.cancel()
                    return
            else:
                stale_since = None
            if call.done():
                return

    def _apply(self, signed: SignedStatement) -> None:
        with self._lock:
            added = self._log.extend([signed])
            if added:
                self._persist()
            registry = self._log.registry
        if added:
            log.info(
                "registry statement applied",
                extra={"sequence": signed.statement.sequence, "kind": signed.statement.kind.value,
                       "deployer": signed.statement.deployer, "key_id": signed.statement.key_id},
            )  # fmt: skip
            if self._on_change is not None:
                self._on_change(registry)

    def _heartbeat(self, heartbeat: coordinator_pb2.Heartbeat) -> None:
        with self._lock:
            self._log.check_head(heartbeat.head_sequence, heartbeat.head_digest or None)
            if heartbeat.head_sequence > self._log.head_sequence:
                return  # statements still on their way; freshness waits until they arrive
            new_checkpoint = self._take_checkpoint(heartbeat.checkpoint)
            self._last_fresh_ms = self._clock()
            self.trusted = True
            if new_checkpoint or self._last_fresh_ms - self._persisted_fresh_ms > self.staleness_ms / 4:
                self._persist()

    def _take_checkpoint(self, served: bytes) -> bool:
        """Hold a served checkpoint if it is valid and newer than the one held; True if taken.

        Raises CheckpointError (the coordinator is refused, like a fork) if it is not the operator's or
        names a head off this copy's chain. An older checkpoint than the one held (a coordinator
        replaying an old one) is ignored: the held one still expires when it says."""
        if not served:
            return False
        checkpoint = SignedCheckpoint.from_bytes(served)
        if self._checkpoint is not None and checkpoint.to_bytes() == self._checkpoint.to_bytes():
            return False
        if checkpoint.checkpoint.sequence > self._log.head_sequence:
            return False  # names statements this copy has not received yet
        try:
            check_served(self._log, checkpoint, self._checkpoint)
        except CheckpointError as exc:
            if exc.code != "ROLLBACK":
                raise
            log.warning("coordinator served an older checkpoint than the one held; ignored")
            return False
        self._checkpoint = checkpoint
        return True
