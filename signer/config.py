"""The signer daemon's settings (``countersign signer serve --config FILE``; docs/operations.md) and
their validation. Every replica of one deployer's signer has the same settings but its listen
addresses (and certificate): the same key, the same ``state_url`` (ADR 0033)."""

from __future__ import annotations

import dataclasses

from countersign._daemon.config import parse_addresses, validate_daemon, validate_follower
from countersign._daemon.limits import LimitsConfig
from countersign.client.tls import TlsConfig
from countersign.cosigning import DEFAULT_MAX_SESSION_OUTPUTS, SignerPolicy
from countersign.errors import ConfigError
from countersign.records import MAX_DEPTH
from countersign.verify import MAX_CLOCK_SKEW_MS

MAX_LANES = 64
DEFAULT_COLLECT_BATCH = 1_000  # rows per table per collection transaction


@dataclasses.dataclass
class SignerConfig:
    deployer: str
    signer_key: str
    operator_public_key: str
    # The coordinator's address, or several (its replicas) separated by commas: followed in turn.
    coordinator: str
    registry_cache: str
    listen: str = "127.0.0.1:7401"
    metrics_listen: str = "127.0.0.1:9401"
    # Where the signer keeps what it spent (sqlite:///…, postgresql://…, dynamodb://…; docs/stores.md).
    # Every replica of the deployer's signer names the same store.
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
    lifeline_fd: int = -1  # set by a supervisor that starts the daemon (the local mesh): see run_daemon
    log_level: str = "info"
    # A delegation's handler waits on the parent's signer while holding its thread, two signers may
    # wait on each other, and each open lane from a peer holds a thread: keep enough threads that
    # neither starves the other calls.
    max_workers: int = 32
    # Group commit (ADR 0033): concurrent calls' writes share one durable commit, at most this many
    # (1: one commit per call). Stores without a shared commit (DynamoDB) write each call on its own.
    commit_batch: int = 64
    # A write whose state another replica changed first is decided again from a fresh read, at most
    # this many times in all; then the call is refused STATE_CONFLICT (retryable).
    decide_attempts: int = 8
    # The state collector (ADR 0026): every this often, forget rows past their expiry plus clock_skew_ms,
    # at most collect_batch rows per table per transaction.
    collect_interval_ms: int = 60_000
    collect_batch: int = DEFAULT_COLLECT_BATCH
    limits: LimitsConfig = dataclasses.field(default_factory=LimitsConfig)  # per-peer limits ([limits])
    tls: TlsConfig = dataclasses.field(default_factory=TlsConfig)

    def validate(self) -> None:
        self.limits.validate()
        addresses = {"listen": self.listen, "metrics_listen": self.metrics_listen}
        validate_daemon("signer", self.tls, self.operator_public_key, addresses, optional=("metrics_listen",))
        parse_addresses(self.coordinator, "coordinator", self.tls)
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
        if not 1 <= self.commit_batch <= 1_024:
            raise ConfigError("commit_batch must be between 1 and 1024")
        if not 1 <= self.decide_attempts <= 100:
            raise ConfigError("decide_attempts must be between 1 and 100")

    @property
    def policy(self) -> SignerPolicy:
        return SignerPolicy(
            deployer=self.deployer, allowed_children=frozenset(self.allowed_children), max_depth=self.max_depth,
            max_ttl_ms=self.max_ttl_ms, max_grant_ttl_ms=self.max_grant_ttl_ms, clock_skew_ms=self.clock_skew_ms,
        )  # fmt: skip
