"""The verifier service: ``VerifyPath`` over gRPC, stateless apart from its durable store.

Any number of replicas can share one store. The registry comes from the coordinator's stream (a
persisted, verified copy); past the staleness bound every path is rejected with ``REGISTRY_STALE``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import grpc
import prometheus_client

from countersign._clock import now_ms
from countersign._daemon.config import parse_addresses, parse_operator_key, validate_daemon, validate_follower
from countersign._daemon.edge import servicer_edge, stream_edge
from countersign._daemon.lane_slots import LaneSlots
from countersign._daemon.limits import LimitsConfig
from countersign._daemon.registry_follower import RegistryFollower
from countersign._daemon.server import usable_cpus
from countersign._daemon.tls import peer_identity
from countersign._proto.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from countersign.client.tls import TlsConfig
from countersign.errors import ConfigError, CountersignError, MalformedError, ServiceError, StateUnavailable
from countersign.policy import MAX_POLICY_BYTES, POLICY_NAME_PATTERN, ConsumerPolicy, PolicyError, parse_policy
from countersign.prefix_cache import DEFAULT_MAX_ENTRIES as DEFAULT_PREFIX_CACHE_ENTRIES
from countersign.prefix_cache import MAX_ENTRIES_LIMIT as MAX_PREFIX_CACHE_ENTRIES
from countersign.prefix_cache import PrefixCache
from countersign.reasons import Attribution, Reason, VerificationResult
from countersign.records import MAX_INPUT_BYTES, Path
from countersign.sessions import (
    MAX_SESSION_INPUT_BYTES,
    MAX_SESSION_RECEIPTS,
    SessionEvidence,
    SessionSummary,
    verify_session_evidence,
)
from countersign.state import InMemoryVerdictLog, ReplayState, VerdictLog
from countersign.verify import (
    DEFAULT_POLICY,
    MAX_CLOCK_SKEW_MS,
    SERIAL,
    Mode,
    OutputDigest,
    SignatureBatch,
    VerifierPolicy,
    malformed_result,
    verify_path,
)
from verifier.signature_threads import ThreadedSignatures
from verifier.stores import StoreConfigError, open_verifier_stores
from verifier.verdict_log import Revalidator, VerdictLogMetrics, VerdictRecorder, answer_impact

log = logging.getLogger("countersign.verifier")
MAX_SIGNATURE_THREADS = 16
# Output bytes sent whole (ADR 0027): larger outputs are presented by their SHA-256 (output_sha256),
# which the SDK always does, so no request needs more than a path and this.
MAX_OUTPUT_BYTES = 1 << 20
# What each method needs at most: VerifyPath(s) a path of 1 MiB (a longer one is a MALFORMED verdict
# up to this bound) and the output, with 16 KiB for the other fields; Impact only names and numbers.
VERIFY_MESSAGE_BYTES = MAX_INPUT_BYTES + MAX_OUTPUT_BYTES + (16 << 10)
# VerifySession(s): session evidence of up to max_session_receipts receipts (about 850 bytes each, so
# 1 MiB holds the default 1,024), outputs sent whole up to MAX_OUTPUT_BYTES in all (larger ones by
# their SHA-256, 32 bytes each), and the other fields. Kept near VerifyPath's limit: the receive budget
# (ADR 0027) is four of the largest message, so a larger one here would let more large requests be
# parsed at once.
SESSION_INPUT_BYTES = 1 << 20
SESSION_MESSAGE_BYTES = SESSION_INPUT_BYTES + MAX_OUTPUT_BYTES + (64 << 10)
METHOD_MESSAGE_BYTES = {
    "/countersign.v1.Verifier/VerifyPath": VERIFY_MESSAGE_BYTES,
    "/countersign.v1.Verifier/VerifyPaths": VERIFY_MESSAGE_BYTES,
    "/countersign.v1.Verifier/Impact": 16 << 10,
    "/countersign.v1.Verifier/VerifySession": SESSION_MESSAGE_BYTES,
    "/countersign.v1.Verifier/VerifySessions": SESSION_MESSAGE_BYTES,
}
OUTPUT_SHA256_BYTES = 32
MAX_REQUEST_ID = 128
MAX_VERDICT_RETENTION_MS = 10 * 366 * 86_400_000
DEFAULT_MAX_SESSION_RECEIPTS = 1_024


def signature_batch(threads: int) -> SignatureBatch:
    """How a verifier with ``signature_threads = threads`` checks a path's signatures on this host."""
    return SERIAL if threads == 1 else ThreadedSignatures(threads, cores=usable_cpus())


@dataclasses.dataclass
class VerifierConfig:
    operator_public_key: str
    coordinator: str
    registry_cache: str
    listen: str = "127.0.0.1:7402"
    metrics_listen: str = "127.0.0.1:9402"
    # Replay state (consumed nonces, child sets) and, unless verdict_log_url names another store, the
    # verdict log: both in the one backend store_url names (every built-in backend keeps both).
    store_url: str = "sqlite:///countersign-verifier.db"
    verdict_log_url: str = ""
    staleness_ms: int = 30_000
    heartbeat_ms: int = 1_000
    clock_skew_ms: int = DEFAULT_POLICY.clock_skew_ms
    allow_baselines: bool = False
    collect_interval_ms: int = 60_000
    ready_file: str = ""
    lifeline_fd: int = -1  # set by a supervisor that starts the daemon (the local mesh): see run_daemon
    log_level: str = "info"
    # Each open verification lane holds a handler thread: at most lanes_per_client per client
    # connection and max_lanes in all, and the server gets max_lanes threads on top of max_workers.
    lanes_per_client: int = 4
    max_lanes: int = 64
    # Threads that may check one path's signatures side by side (libsodium releases the GIL), on cores
    # no other path's checks occupy: one verification's latency falls while cores are idle, and a
    # verifier busy on every core checks each path on its own thread. 1 checks them one after another.
    signature_threads: int = 2
    # Verified prefixes remembered (ADR 0028): a path under a prefix verified before, under the same
    # registry, checks only its new records' signatures. 0 turns the cache off. Each entry holds one
    # prefix's digests and walk state (about 1.1 KB), and half as many parsed envelopes are kept
    # (about 4.5 KB each): about 14 MB at the default (countersign/prefix_cache.py).
    prefix_cache_entries: int = DEFAULT_PREFIX_CACHE_ENTRIES
    max_workers: int = 0  # 0: two per usable CPU (verification is CPU-bound under the GIL)
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)  # per-peer limits ([limits])
    # Named consumer policies a request may choose (VerifyPathRequest.policy): name -> a policy
    # file's path, or the policy document itself as inline JSON (a value starting with "{").
    policies: dict[str, str] = dataclasses.field(default_factory=dict)
    # The verdict log (ADR 0015): every verdict answered, kept verdict_retention_ms, and at most
    # verdict_log_max_rows verdicts and verdict_log_max_bytes bytes (as the log counts them), collected
    # with the expired nonces. Over either bound the oldest verdicts of the client identity holding the
    # most go first, so one consumer cannot push another's verdicts out (issue 29).
    verdict_log: bool = True
    verdict_retention_ms: int = 30 * 86_400_000
    verdict_log_max_rows: int = 1_000_000
    verdict_log_max_bytes: int = 4 << 30
    # The most receipts one VerifySession request may carry (ADR 0022). In accept mode the store may
    # bound it further: DynamoDB consumes a session in one transaction of at most 100 items.
    max_session_receipts: int = DEFAULT_MAX_SESSION_RECEIPTS
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)

    def validate(self) -> None:
        self.limits.validate()
        addresses = {"listen": self.listen, "metrics_listen": self.metrics_listen}
        validate_daemon("verifier", self.tls, self.operator_public_key, addresses, optional=("metrics_listen",))
        parse_addresses(self.coordinator, "coordinator", self.tls)
        validate_follower(self.clock_skew_ms, self.registry_cache, MAX_CLOCK_SKEW_MS)
        if self.staleness_ms < 1:
            raise ConfigError("staleness_ms must be positive")
        if not 1 <= self.lanes_per_client <= self.max_lanes:
            raise ConfigError("lanes_per_client must be between 1 and max_lanes")
        if not 1 <= self.max_lanes <= 1024:
            raise ConfigError("max_lanes must be between 1 and 1024")
        if not 0 <= self.prefix_cache_entries <= MAX_PREFIX_CACHE_ENTRIES:
            raise ConfigError(f"prefix_cache_entries must be between 0 and {MAX_PREFIX_CACHE_ENTRIES}")
        if not 1 <= self.signature_threads <= MAX_SIGNATURE_THREADS:
            raise ConfigError(f"signature_threads must be between 1 and {MAX_SIGNATURE_THREADS}")
        load_policies(self.policies)
        if not 1 <= self.verdict_retention_ms <= MAX_VERDICT_RETENTION_MS:
            raise ConfigError(f"verdict_retention_ms must be between 1 and {MAX_VERDICT_RETENTION_MS}")
        if self.verdict_log_max_rows < 1:
            raise ConfigError("verdict_log_max_rows must be positive")
        if self.verdict_log_max_bytes < 1 << 20:
            raise ConfigError("verdict_log_max_bytes must be at least 1 MiB (1048576)")
        if not 1 <= self.max_session_receipts <= MAX_SESSION_RECEIPTS:
            raise ConfigError(f"max_session_receipts must be between 1 and {MAX_SESSION_RECEIPTS}")

    @property
    def policy(self) -> VerifierPolicy:
        if self.allow_baselines:
            return VerifierPolicy.unsafe_allow_baselines(self.clock_skew_ms)
        return VerifierPolicy(clock_skew_ms=self.clock_skew_ms)


def load_policies(settings: Mapping[str, str]) -> dict[str, ConsumerPolicy]:
    """Parse the ``policies`` setting (name -> file path or inline JSON). Raises ConfigError."""
    loaded: dict[str, ConsumerPolicy] = {}
    for name, source in settings.items():
        if POLICY_NAME_PATTERN.fullmatch(name) is None:
            raise ConfigError(f"policies: {name!r} must match {POLICY_NAME_PATTERN.pattern}")
        try:
            if source.lstrip().startswith("{"):
                document: bytes | str = source
            else:
                with open(source, "rb") as handle:
                    document = handle.read(MAX_POLICY_BYTES + 1)
            loaded[name] = parse_policy(document)
        except OSError as exc:
            raise ConfigError(f"policies.{name}: cannot read {source}: {exc.strerror}") from None
        except PolicyError as exc:
            raise ConfigError(f"policies.{name}: {exc}") from None
    return loaded


class VerifierMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry, follower: RegistryFollower) -> None:
        self.verdicts = prometheus_client.Counter(
            "countersign_verifications", "VerifyPath verdicts by verdict and reason", ["verdict", "reason", "mode"],
            registry=registry,
        )  # fmt: skip
        self.errors = prometheus_client.Counter(
            "countersign_verifier_errors", "VerifyPath calls that could not complete", ["code"], registry=registry
        )
        self.latency = prometheus_client.Histogram(
            "countersign_verify_seconds", "VerifyPath latency inside the service", ["mode"], registry=registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )  # fmt: skip
        self.lanes = prometheus_client.Gauge(
            "countersign_lanes_open", "Verification lanes open to this verifier", ["kind"], registry=registry
        )
        follower.register_gauges(registry)
        self.session_verdicts = prometheus_client.Counter(
            "countersign_session_verifications", "VerifySession verdicts by verdict and reason",
            ["verdict", "reason", "mode"], registry=registry,
        )  # fmt: skip
        self.store_entries = prometheus_client.Gauge(
            "countersign_store_entries", "Consumed nonces and child-set entries held", registry=registry
        )


_MODES = {
    verifier_pb2.VerifyPathRequest.MODE_UNSPECIFIED: Mode.ACCEPT,
    verifier_pb2.VerifyPathRequest.ACCEPT: Mode.ACCEPT,
    verifier_pb2.VerifyPathRequest.AUDIT: Mode.AUDIT,
}


def verdict_message(result: VerificationResult) -> common_pb2.Verdict:
    return common_pb2.Verdict(
        verdict=common_pb2.Verdict.ACCEPT if result else common_pb2.Verdict.REJECT,
        reason="" if result.reason is None else result.reason.value,
        index=-1 if result.index is None else result.index,
        detail=result.detail,
    )


def attribution_message(attribution: Attribution) -> common_pb2.Attribution:
    emitter = attribution.emitter
    return common_pb2.Attribution(
        emitter=common_pb2.Emitter(
            index=emitter.index, deployer=emitter.deployer, key_id=emitter.key_id,
            agent_instance=emitter.agent_instance, agent_system=emitter.agent_system,
            construction=emitter.construction.value, created_ms=emitter.created_ms,
            output_sha256=emitter.output_sha256, binding_scope=emitter.binding_scope.value,
            session=emitter.session, seq=emitter.seq,
        ),
        edges=[
            common_pb2.ProvenEdge(
                index=edge.index, parent_deployer=edge.parent_deployer, parent_key_id=edge.parent_key_id,
                deployer=edge.deployer, key_id=edge.key_id, construction=edge.construction.value,
                cross_deployer=edge.cross_deployer,
                cosigners=[
                    common_pb2.CoSigner(role=c.role.value, deployer=c.deployer, key_id=c.key_id, sig=c.sig)
                    for c in edge.cosigners
                ],
            )
            for edge in attribution.edges
        ],
    )  # fmt: skip


def response_message(result: VerificationResult, registry_sequence: int) -> verifier_pb2.VerifyPathResponse:
    response = verifier_pb2.VerifyPathResponse(verdict=verdict_message(result), registry_sequence=registry_sequence)
    if result.attribution is not None:
        response.attribution.CopyFrom(attribution_message(result.attribution))
    if result.retry_of_ms is not None:
        response.retry_of.accepted_ms = result.retry_of_ms
    return response


def session_response_message(
    result: VerificationResult, registry_sequence: int, summary: SessionSummary | None
) -> verifier_pb2.VerifySessionResponse:
    response = verifier_pb2.VerifySessionResponse(verdict=verdict_message(result), registry_sequence=registry_sequence)
    if result.attribution is not None and summary is not None:
        response.attribution.CopyFrom(attribution_message(result.attribution))
        response.session.CopyFrom(
            verifier_pb2.SessionFacts(session=summary.session, receipts=summary.receipts, closed=summary.closed)
        )
    if result.retry_of_ms is not None:
        response.retry_of.accepted_ms = result.retry_of_ms
    return response


class VerifierService(verifier_pb2_grpc.VerifierServicer):
    def __init__(
        self,
        *,
        state: ReplayState,
        follower: RegistryFollower,
        policy: VerifierPolicy,
        metrics: VerifierMetrics,
        lanes_per_client: int = 4,
        max_lanes: int = 64,
        signatures: SignatureBatch = SERIAL,
        verdicts: VerdictRecorder | None = None,
        verdict_log_metrics: VerdictLogMetrics | None = None,
        require_identity: bool = True,
        consumer_policies: Mapping[str, ConsumerPolicy] | None = None,
        prefix_cache: PrefixCache | None = None,
        max_session_receipts: int = DEFAULT_MAX_SESSION_RECEIPTS,
        verdict_log: VerdictLog | None = None,
    ) -> None:
        self._max_session_receipts = max_session_receipts
        # The log Impact reads: given, or the state's own backend's; with neither, an empty one (a
        # verifier recording no verdicts, on a backend that keeps none, has nothing to answer with).
        if verdict_log is None:
            verdict_log = state if isinstance(state, VerdictLog) else InMemoryVerdictLog()
        self._verdict_log = verdict_log
        self._consumer_policies = dict(consumer_policies or {})
        self._prefix_cache = prefix_cache
        self._state = state
        self._verdicts = verdicts
        self._verdict_log_metrics = verdict_log_metrics or VerdictLogMetrics(
            prometheus_client.CollectorRegistry(), verdict_log
        )
        self._require_identity = require_identity
        self._follower = follower
        self._policy = policy
        self._metrics = metrics
        self._lane_slots = LaneSlots(lanes_per_client, metrics.lanes, total=max_lanes)
        self._signatures = signatures

    @servicer_edge
    def VerifyPath(
        self, request: verifier_pb2.VerifyPathRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifyPathResponse:
        return self._verify(request, context)

    @stream_edge
    def VerifyPaths(
        self, requests: Iterator[verifier_pb2.VerifyPathRequest], context: grpc.ServicerContext
    ) -> Iterator[verifier_pb2.VerifyPathResponse]:
        """A verification lane: each path answered as by VerifyPath, in order; an error ends the lane.
        Lanes are counted per connection, and in all (each holds a handler thread)."""
        peer = str(context.peer())
        yield from self._lane_slots.serve("verify", peer, requests, context, lambda r: self._verify(r, context))

    @servicer_edge
    def VerifySession(
        self, request: verifier_pb2.VerifySessionRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifySessionResponse:
        return self._verify_session(request, context)

    @stream_edge
    def VerifySessions(
        self, requests: Iterator[verifier_pb2.VerifySessionRequest], context: grpc.ServicerContext
    ) -> Iterator[verifier_pb2.VerifySessionResponse]:
        """Sessions one at a time, each answered as by VerifySession; counted as lanes like VerifyPaths."""
        peer = str(context.peer())
        yield from self._lane_slots.serve(
            "session", peer, requests, context, lambda r: self._verify_session(r, context)
        )

    @servicer_edge
    def Impact(self, request: verifier_pb2.ImpactRequest, context: grpc.ServicerContext) -> verifier_pb2.ImpactResponse:
        return answer_impact(
            request, context, self._verdict_log, self._verdict_log_metrics, require_identity=self._require_identity
        )

    def stopping(self) -> None:
        self._lane_slots.stop()

    def _verify(
        self, request: verifier_pb2.VerifyPathRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifyPathResponse:
        started = time.perf_counter()
        mode = _MODES.get(request.mode)
        if mode is None:
            raise ServiceError("INVALID_ARGUMENT", f"unknown mode {request.mode}")
        request_id = self._request_id(request.request_id, context)
        consumer_policy = self._consumer_policy(request.policy)
        output = self._output(request)
        path: Path | None = None
        registry, fresh = self._follower.view()
        if not fresh:
            result = VerificationResult.reject(
                Reason.REGISTRY_STALE,
                None,
                f"no trusted registry update for over {self._follower.staleness_ms} ms,"
                " or no unexpired operator checkpoint naming the registry held",
            )
        elif len(request.path) > MAX_INPUT_BYTES:
            result = VerificationResult.reject(Reason.MALFORMED, None, f"path exceeds {MAX_INPUT_BYTES} bytes")
        else:
            try:
                known = None if self._prefix_cache is None else self._prefix_cache.known_envelope
                path = Path.from_bytes(request.path, known)
            except MalformedError as exc:
                result = malformed_result(exc)
            else:
                try:
                    result = verify_path(
                        path, output, registry=registry, state=self._state, mode=mode,
                        now_ms=now_ms(), policy=self._policy, request_id=request_id, signatures=self._signatures,
                        consumer_policy=consumer_policy, prefix_cache=self._prefix_cache,
                    )  # fmt: skip
                except StateUnavailable:
                    self._metrics.errors.labels("STATE_UNAVAILABLE").inc()
                    raise
        if self._verdicts is not None:  # answered only once logged (ADR 0015)
            self._verdicts.record(path, result, mode.value, registry, context, request.request_id)
        self._metrics.verdicts.labels(result.verdict.value, result.reason or "", mode.value).inc()
        self._metrics.latency.labels(mode.value).observe(time.perf_counter() - started)
        return response_message(result, registry.sequence)

    @staticmethod
    def _output(request: verifier_pb2.VerifyPathRequest) -> bytes | OutputDigest:
        """The output as presented: its bytes, or exactly one SHA-256 instead of them."""
        if request.output_sha256:
            if request.output:
                raise ServiceError("INVALID_ARGUMENT", "send output or output_sha256, not both")
            if len(request.output_sha256) != OUTPUT_SHA256_BYTES:
                raise ServiceError(
                    "INVALID_ARGUMENT", f"output_sha256 must be {OUTPUT_SHA256_BYTES} bytes",
                )  # fmt: skip
            return OutputDigest(request.output_sha256)
        if len(request.output) > MAX_OUTPUT_BYTES:
            raise ServiceError(
                "INVALID_ARGUMENT", f"output exceeds {MAX_OUTPUT_BYTES >> 20} MiB: send its SHA-256 as output_sha256",
            )  # fmt: skip
        return request.output

    @staticmethod
    def _session_output(presented: verifier_pb2.SessionOutput) -> bytes | OutputDigest | None:
        """One receipt's output as presented: not at all, its bytes, or exactly its SHA-256."""
        given = [presented.absent, bool(presented.data), bool(presented.sha256)]
        if sum(given) > 1:
            raise ServiceError(
                "INVALID_ARGUMENT", "an output is absent, its data or its sha256: one of them",
            )  # fmt: skip
        if presented.absent:
            return None
        if presented.sha256:
            if len(presented.sha256) != OUTPUT_SHA256_BYTES:
                raise ServiceError(
                    "INVALID_ARGUMENT", f"an output's sha256 must be {OUTPUT_SHA256_BYTES} bytes",
                )  # fmt: skip
            return OutputDigest(presented.sha256)
        return presented.data

    def _session_limit(self, mode: Mode) -> int:
        """The most receipts a request may carry: the configured bound, and in accept mode also the
        most the store consumes in one atomic step."""
        if mode is Mode.ACCEPT:
            return min(self._max_session_receipts, self._state.max_session_leaves)
        return self._max_session_receipts

    def _verify_session(
        self, request: verifier_pb2.VerifySessionRequest, context: grpc.ServicerContext
    ) -> verifier_pb2.VerifySessionResponse:
        """Translate, check with the core's :func:`countersign.sessions.verify_session`, log, answer."""
        started = time.perf_counter()
        mode = _MODES.get(request.mode)
        if mode is None:
            raise ServiceError("INVALID_ARGUMENT", f"unknown mode {request.mode}")
        request_id = self._request_id(request.request_id, context)
        consumer_policy = self._consumer_policy(request.policy)
        if sum(len(o.data) for o in request.outputs) > MAX_OUTPUT_BYTES:
            raise ServiceError(
                "INVALID_ARGUMENT", f"outputs exceed {MAX_OUTPUT_BYTES >> 20} MiB in all: send their SHA-256 instead",
            )  # fmt: skip
        if len(request.outputs) > MAX_SESSION_RECEIPTS:
            raise ServiceError("INVALID_ARGUMENT", "too many outputs")
        outputs = [self._session_output(o) for o in request.outputs] or None
        if len(request.session) > SESSION_INPUT_BYTES:
            raise ServiceError(
                "INVALID_ARGUMENT", f"session evidence exceeds {SESSION_INPUT_BYTES >> 20} MiB",
            )  # fmt: skip
        session: SessionEvidence | None = None
        summary: SessionSummary | None = None
        registry, fresh = self._follower.view()
        if not fresh:
            result = VerificationResult.reject(
                Reason.REGISTRY_STALE, None, f"no trusted registry update for over {self._follower.staleness_ms} ms"
            )
        elif len(request.session) > MAX_SESSION_INPUT_BYTES:
            result = VerificationResult.reject(
                Reason.MALFORMED, None, f"session exceeds {MAX_SESSION_INPUT_BYTES} bytes"
            )
        else:
            try:
                session = SessionEvidence.from_bytes(request.session)
            except MalformedError as exc:
                result = malformed_result(exc)
            else:
                limit = self._session_limit(mode)
                if len(session.receipts) > limit:
                    raise ServiceError(
                        "INVALID_ARGUMENT",
                        f"{len(session.receipts)} receipts: this verifier takes at most {limit} per {mode.value}"
                        " request (max_session_receipts; ADR 0022)",
                    )
                if outputs is not None and len(outputs) != len(session.receipts):
                    result = VerificationResult.reject(
                        Reason.MALFORMED, None, f"{len(outputs)} outputs for {len(session.receipts)} receipts"
                    )
                else:
                    try:
                        result = verify_session_evidence(
                            session, outputs, registry=registry, state=self._state, mode=mode, now_ms=now_ms(),
                            require_closed=request.require_closed, policy=self._policy,
                            signatures=self._signatures, request_id=request_id, consumer_policy=consumer_policy,
                        )  # fmt: skip
                    except StateUnavailable:
                        self._metrics.errors.labels("STATE_UNAVAILABLE").inc()
                        raise
                    if result.attribution is not None:
                        summary = SessionSummary.of(session)
        if self._verdicts is not None:  # answered only once logged (ADR 0015)
            # The log names every record the verdict relied on: the agent path, then each receipt.
            relied_on = None if session is None else Path((*session.agent.envelopes, *session.receipts))
            self._verdicts.record(relied_on, result, mode.value, registry, context, request.request_id)
        self._metrics.session_verdicts.labels(result.verdict.value, result.reason or "", mode.value).inc()
        self._metrics.latency.labels(mode.value).observe(time.perf_counter() - started)
        return session_response_message(result, registry.sequence, summary)

    def _consumer_policy(self, name: str) -> ConsumerPolicy | None:
        """The named policy the request chose (empty: none). An unknown name is the caller's error."""
        if not name:
            return None
        policy = self._consumer_policies.get(name)
        if policy is None:
            raise ServiceError("INVALID_ARGUMENT", f"unknown policy {name[:64]!r}")
        return policy

    @staticmethod
    def _request_id(key: str, context: grpc.ServicerContext) -> str:
        """The idempotency key, scoped to the client's certificate identity: one client's key can
        never make another client's presentation count as a retry."""
        if not key:
            return ""
        if len(key) > MAX_REQUEST_ID or not key.isascii() or not key.isprintable():
            raise ServiceError(
                "INVALID_ARGUMENT", f"request_id must be 1 to {MAX_REQUEST_ID} printable ASCII characters",
            )  # fmt: skip
        identity = peer_identity(context)
        return f"{identity.uri if identity is not None else 'plaintext'}|{key}"


class VerifierDaemon:
    def __init__(self, config: VerifierConfig) -> None:
        self.config = config
        self.metrics_registry = prometheus_client.CollectorRegistry()
        try:
            self.stores = open_verifier_stores(config.store_url, config.verdict_log_url, recording=config.verdict_log)
        except StoreConfigError as exc:
            raise ConfigError(str(exc)) from None
        self.state = self.stores.replay
        self.verdict_log = self.stores.verdict_log
        self.verdict_log_metrics = VerdictLogMetrics(self.metrics_registry, self.verdict_log)
        self.revalidator = Revalidator(self.verdict_log, self.verdict_log_metrics, lambda: self.follower.view()[0])
        self.follower = RegistryFollower(
            operator_key=parse_operator_key(config.operator_public_key),
            coordinator=config.coordinator,
            tls=config.tls,
            cache_path=config.registry_cache,
            staleness_ms=config.staleness_ms,
            heartbeat_ms=config.heartbeat_ms,
            on_change=self.revalidator.registry_changed,
        )
        self.metrics = VerifierMetrics(self.metrics_registry, self.follower)
        # Counted when Prometheus scrapes, not on every collection round (a full scan on DynamoDB).
        self.metrics.store_entries.set_function(self._entry_count)
        self.signatures = signature_batch(config.signature_threads)
        self.verdicts = VerdictRecorder(
            self.verdict_log, self.verdict_log_metrics, self.metrics.errors, lambda: self.follower.view()[0],
            enabled=config.verdict_log, retention_ms=config.verdict_retention_ms,
        )  # fmt: skip
        self.service = VerifierService(
            state=self.state,
            follower=self.follower,
            policy=config.policy,
            metrics=self.metrics,
            lanes_per_client=config.lanes_per_client,
            max_lanes=config.max_lanes,
            signatures=self.signatures,
            verdicts=self.verdicts,
            verdict_log_metrics=self.verdict_log_metrics,
            require_identity=not config.tls.insecure_loopback,
            consumer_policies=load_policies(config.policies),
            prefix_cache=PrefixCache(config.prefix_cache_entries) if config.prefix_cache_entries else None,
            max_session_receipts=config.max_session_receipts,
            verdict_log=self.verdict_log,
        )
        self._stop = threading.Event()
        self._collector: threading.Thread | None = None

    def register(self, server: grpc.Server) -> Sequence[str]:
        verifier_pb2_grpc.add_VerifierServicer_to_server(self.service, server)
        return [verifier_pb2.DESCRIPTOR.services_by_name["Verifier"].full_name]

    def stopping(self) -> None:
        self.service.stopping()

    def start(self) -> None:
        self.follower.start()
        self.revalidator.start()
        self._collector = threading.Thread(target=self._collect, name="store-collector", daemon=True)
        self._collector.start()

    def _collect(self) -> None:
        """Forget expired nonces, child-set entries and verdicts, and verdicts beyond the row and byte
        bounds, in bounded batches, so the store stays bounded."""
        max_rows, max_bytes = self.config.verdict_log_max_rows, self.config.verdict_log_max_bytes
        while not self._stop.wait(self.config.collect_interval_ms / 1000):
            try:
                while self.stores.collect_expired(now_ms(), limit=10_000) == 10_000 and not self._stop.is_set():
                    pass
                while (
                    self.verdict_log.trim_verdict_log(max_rows, limit=10_000, max_bytes=max_bytes) == 10_000
                    and not self._stop.is_set()
                ):
                    pass
            except Exception as exc:  # the collector must survive a store outage; the next round retries
                log.warning("collecting expired entries failed", extra={"error": str(exc)})

    def _entry_count(self) -> float:
        try:
            return float(self.state.entry_count())
        except CountersignError:
            return float("nan")

    def close(self) -> None:
        self._stop.set()
        self.follower.close()
        self.revalidator.close()
        self.signatures.close()
        self.stores.close()
