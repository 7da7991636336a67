"""One object a consumer checks evidence with (ADR 0034), in the spirit of sigstore's ``Verifier``.

A :class:`Consumer` holds where and how to check: online through a verifier service (its address and
this client's mTLS material) or offline against a registry with the core's own verification; the
consumer's own policy (:func:`countersign.policy.parse_policy`); and, offline, the state that
remembers consumed nonces. Every check answers with the one verdict shape,
:class:`countersign.consumer.EvidenceVerdict`::

    consumer = Consumer.from_env()               # COUNTERSIGN_VERIFIER or COUNTERSIGN_REGISTRY
    verdict = consumer.path(receipt, output)     # or await consumer.apath(...)
    verdict = consumer.session(receipts, outputs)

The integrations (LangGraph, MCP, A2A) take a Consumer and nothing else. A rejected path is a
verdict; an error is a :class:`countersign.client.ServiceError` (online: the verifier refused the
request or could not be reached) or a ConfigError (nowhere to check).

Configuration from the environment (:meth:`Consumer.from_env`), named so that no daemon setting reads it:
``COUNTERSIGN_VERIFIER`` (host:port, online) or ``COUNTERSIGN_REGISTRY`` (a registry file, offline),
and ``COUNTERSIGN_CLIENT_{CA,CERT,KEY}`` for online (``countersign demo --keep-running`` prints them).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from countersign._clock import now_ms
from countersign.client.failover import ReplicaOrder, RetryPolicy, aask_replicas, addresses_of, ask_replicas
from countersign.client.tls import TlsConfig, tls_from_env
from countersign.client.verifier import AsyncVerifierClient, VerifierClient, new_request_id
from countersign.consumer import (
    EvidenceVerdict,
    SessionInput,
    as_session_evidence,
    parse_registry,
    verify_offline,
    verify_session_offline,
)
from countersign.errors import ConfigError
from countersign.policy import ConsumerPolicy
from countersign.reasons import Reason
from countersign.records import MAX_INPUT_BYTES, Path
from countersign.registry import Registry
from countersign.state import InMemoryState, VerifierState
from countersign.verify import DEFAULT_POLICY, OutputDigest, VerifierPolicy

ENV_VERIFIER = "COUNTERSIGN_VERIFIER"
ENV_REGISTRY = "COUNTERSIGN_REGISTRY"

Outputs = Sequence[bytes | OutputDigest | None] | None


def load_registry(location: str) -> Registry:
    """The registry file at ``location`` (:func:`countersign.consumer.parse_registry` of its bytes),
    read to at most the input limit (spec 10). Raises ConfigError when it cannot be read, is larger,
    or is not a registry."""
    try:
        with open(location, "rb") as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the registry {location}: {exc.strerror}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(f"the registry {location} exceeds {MAX_INPUT_BYTES} bytes")
    return parse_registry(data, location)


@dataclass(eq=False)
class Consumer:
    """Where and how a consumer checks evidence. Build it with :meth:`online`, :meth:`offline` or
    :meth:`from_env`; give exactly one of ``verifier`` and ``registry``.

    Online (``verifier``, host:port, with ``tls``): the verifier service checks and, in accept mode,
    consumes each leaf nonce for good; ``policy`` names a consumer policy configured on it. Offline
    (``registry``): the core checks in this process as of ``clock_ms()`` under ``verifier_policy``,
    consuming nonces in ``state`` (by default an in-memory state for this object's life, so a replay
    to the same Consumer is ``NONCE_REPLAYED`` as it is online; pass a durable one to remember across
    processes). ``consumer_policy``: your own policy, the same verdict online and offline: evidence
    it refuses is ``CONSUMER_POLICY_VIOLATION`` and consumes nothing (spec 16.4).

    The connections are opened on first use (the asyncio one inside the running event loop) and
    closed by :meth:`close` / :meth:`aclose` or the context managers."""

    verifier: str = ""
    tls: TlsConfig | None = None
    registry: Registry | None = None
    consumer_policy: ConsumerPolicy | None = None
    policy: str = ""
    state: VerifierState | None = None
    verifier_policy: VerifierPolicy = DEFAULT_POLICY
    clock_ms: Callable[[], int] = now_ms
    lanes: int = 4
    # Online, with several verifier replicas: each check is asked at the first named replica that is up, then
    # the others in turn, under one request id (a retry is answered as the first attempt was).
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_s: float = 30.0
    _clients: list[VerifierClient] | None = field(default=None, init=False, repr=False)
    _aclients: list[AsyncVerifierClient] | None = field(default=None, init=False, repr=False)
    _order: ReplicaOrder = field(init=False, repr=False)
    _aloop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if bool(self.verifier) == (self.registry is not None):
            raise ConfigError("a Consumer checks online (verifier=) or offline (registry=): give exactly one")
        if self.verifier and self.tls is None:
            raise ConfigError("an online Consumer needs tls= (or Consumer.online, which reads the environment)")
        if self.registry is not None and self.state is None:
            self.state = InMemoryState()
        self._order = ReplicaOrder(len(addresses_of(self.verifier)) if self.verifier else 1, self.retry)

    @classmethod
    def online(
        cls,
        verifier: str,
        tls: TlsConfig | None = None,
        *,
        consumer_policy: ConsumerPolicy | None = None,
        policy: str = "",
        environ: Mapping[str, str] | None = None,
    ) -> Consumer:
        """Check through the verifier service at ``verifier`` (host:port, or its replicas' separated by
        commas, each check asked at the next when one cannot answer) with ``tls`` (default
        :func:`tls_from_env`). Raises ConfigError."""
        return cls(
            verifier=verifier, tls=tls_from_env(environ) if tls is None else tls, consumer_policy=consumer_policy,
            policy=policy,
        )  # fmt: skip

    @classmethod
    def offline(
        cls,
        registry: Registry | str,
        *,
        consumer_policy: ConsumerPolicy | None = None,
        state: VerifierState | None = None,
        verifier_policy: VerifierPolicy = DEFAULT_POLICY,
        clock_ms: Callable[[], int] = now_ms,
    ) -> Consumer:
        """Check in this process against ``registry`` (a Registry, or a registry file). Raises ConfigError."""
        loaded = load_registry(registry) if isinstance(registry, str) else registry
        return cls(
            registry=loaded, consumer_policy=consumer_policy, state=state, verifier_policy=verifier_policy,
            clock_ms=clock_ms,
        )  # fmt: skip

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, consumer_policy: ConsumerPolicy | None = None
    ) -> Consumer:
        """Online when ``COUNTERSIGN_VERIFIER`` is set (with ``COUNTERSIGN_CLIENT_{CA,CERT,KEY}``),
        offline when ``COUNTERSIGN_REGISTRY`` is. Raises ConfigError for neither, or both."""
        env = os.environ if environ is None else environ
        verifier, registry = env.get(ENV_VERIFIER, ""), env.get(ENV_REGISTRY, "")
        if verifier and registry:
            raise ConfigError(f"set {ENV_VERIFIER} or {ENV_REGISTRY}, not both")
        if verifier:
            return cls.online(verifier, consumer_policy=consumer_policy, environ=env)
        if registry:
            return cls.offline(registry, consumer_policy=consumer_policy)
        raise ConfigError(
            f"nowhere to check evidence: set {ENV_VERIFIER} (a verifier service) or {ENV_REGISTRY} (a registry file)"
        )

    @property
    def is_online(self) -> bool:
        return bool(self.verifier)

    # --- checks ---------------------------------------------------------------------------------

    def path(
        self, path: Path | bytes, output: bytes | OutputDigest, *, audit: bool = False, request_id: str | None = None
    ) -> EvidenceVerdict:
        """Check ``path`` (a Path, or its bytes as received) for the exact ``output`` bytes (or their
        :class:`~countersign.verify.OutputDigest`; online only the SHA-256 is sent, ADR 0027). Accept
        mode consumes the leaf nonce, so the same path shown again is ``NONCE_REPLAYED``; ``audit``
        consumes nothing. ``request_id`` (online): the idempotency key, by default a fresh one, returned
        as the verdict's ``request_id``: pass it again to retry after a lost answer."""
        if self.registry is not None:
            return verify_offline(
                path, output, self.registry, now_ms=self.clock_ms(), audit=audit, state=self.state,
                policy=self.verifier_policy, consumer_policy=self.consumer_policy,
            )  # fmt: skip
        key = request_id or new_request_id()  # one id for every replica this check is asked at

        def ask(client: VerifierClient, timeout_s: float) -> EvidenceVerdict:
            return client.verify(
                path, output, audit=audit, timeout_s=timeout_s, request_id=key, policy=self.policy,
                consumer_policy=self.consumer_policy,
            )  # fmt: skip

        return ask_replicas(self._order, self._sync(), ask, self.timeout_s, service="verifier", settles=_checked)

    def session(
        self, session: SessionInput, outputs: Outputs = None, *, audit: bool = False, require_closed: bool = False
    ) -> EvidenceVerdict:
        """Check one agent's session as a whole (docs/spec.md section 17): ``session`` is the receipt
        paths in session order (as ``Runtime.receipt`` returned them), or SessionEvidence (or its
        bytes); ``outputs[i]`` the exact bytes of output *i* (None: not checked). Accept mode consumes
        every receipt's nonce, all or nothing. ``require_closed``: the session must end with its close
        receipt. The verdict's index is the first offending receipt; on accept its ``emitter`` is the
        last output's and ``session`` says what the session is. Raises ValueError when ``outputs``
        does not have one entry per receipt."""
        if self.registry is not None:
            return verify_session_offline(
                session, outputs, self.registry, now_ms=self.clock_ms(), audit=audit, require_closed=require_closed,
                state=self.state, policy=self.verifier_policy, consumer_policy=self.consumer_policy,
            )  # fmt: skip
        evidence, key = as_session_evidence(session), new_request_id()

        def ask(client: VerifierClient, timeout_s: float) -> EvidenceVerdict:
            return client.verify_session(
                evidence, outputs, audit=audit, require_closed=require_closed, timeout_s=timeout_s, request_id=key,
                policy=self.policy, consumer_policy=self.consumer_policy,
            )  # fmt: skip

        return ask_replicas(self._order, self._sync(), ask, self.timeout_s, service="verifier", settles=_checked)

    async def apath(
        self, path: Path | bytes, output: bytes | OutputDigest, *, audit: bool = False, request_id: str | None = None
    ) -> EvidenceVerdict:
        """:meth:`path` on an event loop (offline: the same in-process check, about a millisecond of CPU)."""
        if self.registry is not None:
            return self.path(path, output, audit=audit)
        key = request_id or new_request_id()

        async def ask(client: AsyncVerifierClient, timeout_s: float) -> EvidenceVerdict:
            return await client.verify(
                path, output, audit=audit, timeout_s=timeout_s, request_id=key, policy=self.policy,
                consumer_policy=self.consumer_policy,
            )  # fmt: skip

        return await aask_replicas(
            self._order, self._async(), ask, self.timeout_s, service="verifier", settles=_checked
        )

    async def asession(
        self, session: SessionInput, outputs: Outputs = None, *, audit: bool = False, require_closed: bool = False
    ) -> EvidenceVerdict:
        """:meth:`session` on an event loop."""
        if self.registry is not None:
            return self.session(session, outputs, audit=audit, require_closed=require_closed)
        evidence, key = as_session_evidence(session), new_request_id()

        async def ask(client: AsyncVerifierClient, timeout_s: float) -> EvidenceVerdict:
            return await client.verify_session(
                evidence, outputs, audit=audit, require_closed=require_closed, timeout_s=timeout_s, request_id=key,
                policy=self.policy, consumer_policy=self.consumer_policy,
            )  # fmt: skip

        return await aask_replicas(
            self._order, self._async(), ask, self.timeout_s, service="verifier", settles=_checked
        )

    # --- connections ----------------------------------------------------------------------------

    def _sync(self) -> list[VerifierClient]:
        """A client per verifier replica (``verifier`` may name several, separated by commas)."""
        with self._lock:
            if self._clients is None:
                assert self.tls is not None  # __post_init__: online has tls
                tls = self.tls
                self._clients = [VerifierClient(a, tls, lanes=self.lanes) for a in addresses_of(self.verifier)]
            return self._clients

    def _async(self) -> list[AsyncVerifierClient]:
        """The asyncio clients of the running loop (a grpc.aio channel belongs to the loop that made it:
        under another loop new ones are opened, and the old ones are left to their loop)."""
        loop = asyncio.get_running_loop()
        if self._aclients is None or self._aloop is not loop:
            assert self.tls is not None
            tls = self.tls
            self._aclients = [AsyncVerifierClient(a, tls) for a in addresses_of(self.verifier)]
            self._aloop = loop
        return self._aclients

    def close(self) -> None:
        """Close the sync connections (the asyncio ones are closed by :meth:`aclose`)."""
        with self._lock:
            clients, self._clients = self._clients, None
        for client in clients or ():
            client.close()

    async def aclose(self) -> None:
        """Close every connection; call it on the loop that used the asyncio ones."""
        self.close()
        clients, self._aclients, self._aloop = self._aclients, None, None
        for client in clients or ():
            await client.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.aclose()


def _checked(verdict: EvidenceVerdict) -> bool:
    """A verdict settles a check unless its replica checked nothing (its registry copy was stale)."""
    return verdict.reason is not Reason.REGISTRY_STALE
