"""The runtime SDK: the few calls an agent runtime (producer) and a consumer need (docs/quickstart-runtime.md).

Producer side, :class:`Runtime` and its asyncio twin :class:`AsyncRuntime`, over the deployer's own
signer: start an agent (a root record), sign an output (``receipt(parent, output)`` hashes the exact
bytes itself), a same-deployer child, and a cross-deployer delegation in two halves: the parent's
runtime calls :meth:`Runtime.delegate` (its signer opens a grant; the answer is a
:class:`countersign.client.Delegation`, sent to the child as a string), the child's runtime calls
:meth:`Runtime.accept` (its signer obtains the parent signer's co-signature). Closing a session waits
for the signer's close receipt (:meth:`Runtime.close_session`, a :class:`ClosedSession`); a
streamed output is signed one receipt per ``n`` tokens or bytes as it is emitted
(:meth:`Runtime.stream`, :class:`countersign.client.signer.ChunkReceipt` per chunk).

Consumer side, :func:`verify_path` (and :func:`averify_path`): one path and the exact output bytes,
checked by a verifier service or offline against a registry with the core's own verification; the
verdict, a :class:`PathVerdict`, names who emitted the output (:class:`OutputEmitter`). For a
session, :func:`verify_session` (and :func:`averify_session`): the receipt paths in session order and
the outputs, checked as a whole (order, gaps, duplicates, splices, truncation: docs/spec.md section
17; online through ``VerifySession``); its :class:`SessionVerdict` names the emitter of the last
output and the session (id, receipts, closed).

Every refusal is a :class:`countersign.client.ServiceError` with a code from the closed
:class:`countersign.errors.ErrorCode`; a rejected path is a verdict, not an error.

Configuration from the environment (:meth:`Runtime.from_env`, and :func:`verify_path` when it is
given neither a verifier nor a registry), named so that no daemon setting reads them:

=============================  ===================================================================
``COUNTERSIGN_SIGNER``         host:port of this deployer's signer (producer)
``COUNTERSIGN_DEPLOYER``       this runtime's deployer id (producer)
``COUNTERSIGN_PUBLIC_SIGNER``  host:port other deployers' signers reach it at (default: the above)
``COUNTERSIGN_VERIFIER``       host:port of a verifier service (consumer, online)
``COUNTERSIGN_REGISTRY``       a registry file (consumer, offline; ``countersign verify --registry``)
``COUNTERSIGN_CLIENT_CA``,     this client's mTLS material: CA bundle, certificate, private key
``..._CERT``, ``..._KEY``      (``COUNTERSIGN_CLIENT_INSECURE_LOOPBACK=1`` instead: no TLS, loopback only)
=============================  ===================================================================
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FilePath
from types import TracebackType

from countersign.client.handoff import Delegation, HandoffError
from countersign.client.results import SessionVerifierVerdict, VerifierVerdict
from countersign.client.signer import AsyncSignerClient, ChunkReceipt, SignerClient
from countersign.client.tls import TlsConfig
from countersign.client.verifier import AsyncVerifierClient, VerifierClient
from countersign.errors import ConfigError, ErrorCode, MalformedError
from countersign.policy import ConsumerPolicy
from countersign.reasons import Reason, VerificationResult
from countersign.records import Path, parse_json
from countersign.registry import Registry
from countersign.sessions import SessionEvidence, SessionSummary
from countersign.sessions import verify_session as core_verify_session
from countersign.state import InMemoryState, VerifierState
from countersign.verify import DEFAULT_POLICY, Mode, OutputDigest, VerifierPolicy, malformed_result
from countersign.verify import verify_path as core_verify_path

ENV_SIGNER = "COUNTERSIGN_SIGNER"
ENV_DEPLOYER = "COUNTERSIGN_DEPLOYER"
ENV_PUBLIC_SIGNER = "COUNTERSIGN_PUBLIC_SIGNER"
ENV_VERIFIER = "COUNTERSIGN_VERIFIER"
ENV_REGISTRY = "COUNTERSIGN_REGISTRY"
ENV_CLIENT_TLS = "COUNTERSIGN_CLIENT_"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsConfig:
    """This client's mTLS material from ``COUNTERSIGN_CLIENT_{CA,CERT,KEY}`` (file paths). Raises
    ConfigError naming what is missing or unreadable."""
    env = _environ(environ)
    if env.get(ENV_CLIENT_TLS + "INSECURE_LOOPBACK", "") in ("1", "true"):
        return TlsConfig(insecure_loopback=True)
    ca, cert, key = (env.get(ENV_CLIENT_TLS + part, "") for part in ("CA", "CERT", "KEY"))
    tls = TlsConfig(ca=ca, cert=cert, key=key)
    tls.validate(f"{ENV_CLIENT_TLS}{{CA,CERT,KEY}}")
    return tls


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not value:
        raise ConfigError(f"{name} is not set")
    return value


def _handoff(delegation: Delegation | str, deployer: str, now_ms: int | None) -> Delegation:
    """The delegation, parsed if it is a string, refused unless it is for ``deployer`` and unexpired.
    Nothing here calls a service."""
    parsed = Delegation.from_string(delegation) if isinstance(delegation, str) else delegation
    if parsed.child_deployer != deployer:
        raise HandoffError(
            ErrorCode.GRANT_WRONG_CHILD,
            f"the delegation is for {parsed.child_deployer}, and this runtime is {deployer}",
        )
    now = _now_ms() if now_ms is None else now_ms
    if parsed.expired(now):
        raise HandoffError(
            ErrorCode.GRANT_EXPIRED, f"the delegation expired at {parsed.expires_ms} ms (now {now} ms): ask for another"
        )
    return parsed


# --- producer side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClosedSession:
    """A session's close receipt (docs/spec.md 17): the signer issues no receipt for the session after it.

    ``count``: the receipts of the session before the close receipt (its own ``seq``); ``last``: the
    digest of the last of them (None when the session was closed empty). Present ``path.leaf`` as the
    session's last receipt to a consumer that requires a closed session."""

    path: Path
    session: str
    count: int
    last: str | None

    @classmethod
    def of(cls, path: Path) -> ClosedSession:
        output = path.leaf.record.output
        if output is None or output.close is None:
            raise ValueError("the path's leaf is not a close receipt")
        return cls(path, output.session, output.close.count, output.close.last)


Pieces = Iterable[bytes | tuple[bytes, int]]


@dataclass
class Runtime:
    """A deployer's agent runtime talking to its own signer at ``signer`` (host:port) as ``deployer``.

    ``public_signer``: the address other deployers' signers reach this signer at, written into the
    delegations this runtime hands out (default: ``signer``). Every method raises
    :class:`countersign.client.ServiceError` (its ``code`` an ``ErrorCode``) when a signer refuses or
    cannot be reached."""

    signer: str
    tls: TlsConfig
    deployer: str
    public_signer: str = ""
    lanes: int = 4

    def __post_init__(self) -> None:
        self._client = SignerClient(self.signer, self.tls, self.deployer, lanes=self.lanes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Runtime:
        """A runtime configured by ``COUNTERSIGN_SIGNER``, ``COUNTERSIGN_DEPLOYER``, optionally
        ``COUNTERSIGN_PUBLIC_SIGNER``, and ``COUNTERSIGN_CLIENT_{CA,CERT,KEY}``. Raises ConfigError."""
        env = _environ(environ)
        return cls(
            _required(env, ENV_SIGNER), tls_from_env(env), _required(env, ENV_DEPLOYER), env.get(ENV_PUBLIC_SIGNER, "")
        )

    @property
    def client(self) -> SignerClient:
        """The signer client underneath, for the calls this class does not wrap."""
        return self._client

    def root(
        self,
        instance: str,
        system: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """Start agent ``instance`` of agent system ``system``: its root record (depth 0)."""
        return self._client.root(
            instance, system, ttl_ms=ttl_ms, max_children=max_children, allowed_children=allowed_children
        )

    def local_child(self, parent: Path, instance: str, *, ttl_ms: int = 3_600_000, max_children: int = 8) -> Path:
        """A same-deployer child agent under ``parent`` (a record this deployer's signer issued)."""
        return self._client.local_child(parent, instance, ttl_ms=ttl_ms, max_children=max_children)

    def receipt(self, parent: Path, output: bytes, *, session: str = "", binding_scope: str = "per_turn") -> Path:
        """Sign ``output``, the exact bytes the agent of ``parent`` emitted (hashed here with SHA-256):
        the path to its output receipt. ``session`` defaults to the agent instance; the signer numbers
        the session's receipts (``seq``) and chains each to the one before."""
        digest = hashlib.sha256(output).digest()
        return self._client.receipt(parent, digest, session=session, binding_scope=binding_scope)

    def close_session(self, parent: Path, *, session: str = "", timeout_s: float = 10.0) -> ClosedSession:
        """Close ``session`` (default: the agent instance, as :meth:`receipt`) of the agent of ``parent``:
        its signer signs the close receipt, committing to the session's count and last receipt, and
        refuses later receipts of the session (``SESSION_CLOSED``). Closing again answers the same."""
        return ClosedSession.of(self._client.close_session(parent, session=session, timeout_s=timeout_s))

    def stream(
        self,
        parent: Path,
        pieces: Pieces,
        *,
        session: str = "",
        unit: str = "bytes",
        n: int = 4096,
        close: bool = False,
        timeout_s: float = 60.0,
    ) -> list[ChunkReceipt]:
        """Sign a streamed output as it is emitted: ``pieces`` are sent as the iterable yields them
        (bytes; with ``unit="tokens"``, each ``(bytes, token_count)``), and the signer signs one
        receipt per ``n`` units, each chained to the one before, the rest in a short last chunk; with
        ``close``, then the close receipt. A stream cut short is verifiable up to its last chunk."""
        return self._client.stream_receipts(
            parent, pieces, session=session, unit=unit, n=n, close=close, timeout_s=timeout_s
        )

    def delegate(self, parent: Path, child_deployer: str, *, ttl_ms: int = 60_000) -> Delegation:
        """Let ``child_deployer`` attach one child agent under ``parent`` (this deployer's record)
        within ``ttl_ms``: the handoff to send it (``str(delegation)``)."""
        grant = self._client.open_grant(parent, child_deployer, ttl_ms=ttl_ms)
        return Delegation(parent, grant, self.public_signer or self.signer)

    def accept(
        self,
        delegation: Delegation | str,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        now_ms: int | None = None,
        timeout_s: float = 10.0,
    ) -> Path:
        """Accept another deployer's delegation as agent ``instance``: the child record, co-signed by
        both deployers' signers. A handoff that is malformed, addressed to another deployer or expired
        (by ``now_ms``, default the clock) is refused with :class:`HandoffError` before any call."""
        handoff = _handoff(delegation, self.deployer, now_ms)
        return self._client.accept(
            handoff.parent,
            handoff.grant,
            handoff.parent_signer,
            instance,
            ttl_ms=ttl_ms,
            max_children=max_children,
            timeout_s=timeout_s,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


@dataclass(eq=False)
class AsyncRuntime:
    """:class:`Runtime` on ``grpc.aio``: the same methods as coroutines, the same results and errors.
    Create it inside the running event loop; close it with ``await close()`` or ``async with``."""

    signer: str
    tls: TlsConfig
    deployer: str
    public_signer: str = ""

    def __post_init__(self) -> None:
        self._client = AsyncSignerClient(self.signer, self.tls, self.deployer)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AsyncRuntime:
        """See :meth:`Runtime.from_env`."""
        env = _environ(environ)
        return cls(
            _required(env, ENV_SIGNER), tls_from_env(env), _required(env, ENV_DEPLOYER), env.get(ENV_PUBLIC_SIGNER, "")
        )

    @property
    def client(self) -> AsyncSignerClient:
        """See :attr:`Runtime.client`."""
        return self._client

    async def root(
        self,
        instance: str,
        system: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        allowed_children: Collection[str] | None = None,
    ) -> Path:
        """See :meth:`Runtime.root`."""
        return await self._client.root(
            instance, system, ttl_ms=ttl_ms, max_children=max_children, allowed_children=allowed_children
        )

    async def local_child(self, parent: Path, instance: str, *, ttl_ms: int = 3_600_000, max_children: int = 8) -> Path:
        """See :meth:`Runtime.local_child`."""
        return await self._client.local_child(parent, instance, ttl_ms=ttl_ms, max_children=max_children)

    async def receipt(self, parent: Path, output: bytes, *, session: str = "", binding_scope: str = "per_turn") -> Path:
        """See :meth:`Runtime.receipt`."""
        digest = hashlib.sha256(output).digest()
        return await self._client.receipt(parent, digest, session=session, binding_scope=binding_scope)

    async def close_session(self, parent: Path, *, session: str = "", timeout_s: float = 10.0) -> ClosedSession:
        """See :meth:`Runtime.close_session`."""
        return ClosedSession.of(await self._client.close_session(parent, session=session, timeout_s=timeout_s))

    async def stream(
        self,
        parent: Path,
        pieces: Pieces,
        *,
        session: str = "",
        unit: str = "bytes",
        n: int = 4096,
        close: bool = False,
        timeout_s: float = 60.0,
    ) -> list[ChunkReceipt]:
        """See :meth:`Runtime.stream` (``pieces`` is a plain iterable, read on the event loop)."""
        return await self._client.stream_receipts(
            parent, pieces, session=session, unit=unit, n=n, close=close, timeout_s=timeout_s
        )

    async def delegate(self, parent: Path, child_deployer: str, *, ttl_ms: int = 60_000) -> Delegation:
        """See :meth:`Runtime.delegate`."""
        grant = await self._client.open_grant(parent, child_deployer, ttl_ms=ttl_ms)
        return Delegation(parent, grant, self.public_signer or self.signer)

    async def accept(
        self,
        delegation: Delegation | str,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        now_ms: int | None = None,
        timeout_s: float = 10.0,
    ) -> Path:
        """See :meth:`Runtime.accept`."""
        handoff = _handoff(delegation, self.deployer, now_ms)
        return await self._client.accept(
            handoff.parent,
            handoff.grant,
            handoff.parent_signer,
            instance,
            ttl_ms=ttl_ms,
            max_children=max_children,
            timeout_s=timeout_s,
        )

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncRuntime:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


# --- consumer side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputEmitter:
    """Who emitted a verified output, read from the accepted path's leaf receipt."""

    deployer: str  # the deployer whose signer signed the receipt
    key_id: str  # the key it signed with
    agent: str  # the agent instance the receipt speaks for
    system: str  # the agent system (delegation tree) it belongs to
    session: str
    seq: int  # the receipt's place in its session, from 0
    output_sha256: str  # sha256:<hex> of the output bytes
    lineage: tuple[str, ...]  # the deployer of each record, root to leaf

    @classmethod
    def of(cls, path: Path) -> OutputEmitter:
        """Read from ``path``'s leaf; only meaningful once the path has been accepted."""
        leaf = path.leaf.record
        if leaf.output is None:
            raise ValueError("the path's leaf is not an output receipt")
        return cls(
            deployer=leaf.deployer,
            key_id=leaf.key_id,
            agent=leaf.agent.instance,
            system=leaf.agent.system,
            session=leaf.output.session,
            seq=leaf.output.seq,
            output_sha256=leaf.output.sha256,
            lineage=tuple(envelope.record.deployer for envelope in path.envelopes),
        )


@dataclass(frozen=True)
class PathVerdict:
    """The answer to one presented path and output. Truthy exactly when accepted; then ``emitter``
    names who emitted the output (None on a reject: a rejected path proves nobody emitted it).

    ``registry_sequence``: the registry position the verdict was reached at (the verifier's, or the
    registry file's offline)."""

    result: VerificationResult
    emitter: OutputEmitter | None
    registry_sequence: int

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def reason(self) -> Reason | None:
        """Why the path was rejected; None on accept."""
        return self.result.reason

    def raise_for_reject(self) -> None:
        """Raise :class:`countersign.errors.PathRejected` unless the path was accepted."""
        self.result.raise_for_reject()


def _verdict(result: VerificationResult, path: Path | bytes, registry_sequence: int) -> PathVerdict:
    if not result:
        return PathVerdict(result, None, registry_sequence)
    parsed = path if isinstance(path, Path) else Path.from_bytes(path)
    return PathVerdict(result, OutputEmitter.of(parsed), registry_sequence)


def load_registry(location: str) -> Registry:
    """The registry file at ``location`` (the format of ``countersign verify --registry``). Raises
    ConfigError when it cannot be read or is not a registry."""
    try:
        return Registry.from_json(parse_json(FilePath(location).read_bytes()))
    except OSError as exc:
        raise ConfigError(f"cannot read the registry {location}: {exc.strerror}") from None
    except MalformedError as exc:
        raise ConfigError(f"{location} is not a registry: {exc}") from None


def verify_offline(
    path: Path | bytes,
    output: bytes | OutputDigest,
    registry: Registry,
    *,
    audit: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    policy: VerifierPolicy = DEFAULT_POLICY,
    consumer_policy: ConsumerPolicy | None = None,
) -> PathVerdict:
    """The core's verification of ``path`` for ``output`` against ``registry``, in this process.

    ``state`` keeps consumed nonces and child sets between calls; without one, each call starts from an
    empty state, so a replay across calls is not detected (pass a durable state, or use a verifier).
    ``consumer_policy``: step C (docs/spec.md 16.3); a path it refuses consumes nothing."""
    if not isinstance(path, Path):
        try:
            path = Path.from_bytes(path)
        except MalformedError as exc:
            return PathVerdict(malformed_result(exc), None, registry.sequence)
    result = core_verify_path(
        path,
        output,
        registry=registry,
        state=InMemoryState() if state is None else state,
        mode=Mode.AUDIT if audit else Mode.ACCEPT,
        now_ms=_now_ms() if now_ms is None else now_ms,
        policy=policy,
        consumer_policy=consumer_policy,
    )
    return _verdict(result, path, registry.sequence)


def _where(
    verifier: object, registry: Registry | str | None, environ: Mapping[str, str] | None
) -> tuple[object, Registry | None]:
    """The verifier (client or address) or the registry a consumer check goes to, from the arguments,
    else from the environment. Raises ConfigError when there is neither, or both."""
    if verifier is not None and registry is not None:
        raise ConfigError("verify_path takes a verifier or a registry, not both")
    if verifier is None and registry is None:
        env = _environ(environ)
        verifier, registry = env.get(ENV_VERIFIER) or None, env.get(ENV_REGISTRY) or None
        if verifier is None and registry is None:
            raise ConfigError(
                f"verify_path needs a verifier or a registry: pass verifier= or registry=, "
                f"or set {ENV_VERIFIER} or {ENV_REGISTRY}"
            )
        if verifier is not None and registry is not None:
            raise ConfigError(f"set {ENV_VERIFIER} or {ENV_REGISTRY}, not both")
    return verifier, load_registry(registry) if isinstance(registry, str) else registry


def verify_path(
    path: Path | bytes,
    output: bytes | OutputDigest,
    *,
    verifier: VerifierClient | str | None = None,
    registry: Registry | str | None = None,
    tls: TlsConfig | None = None,
    audit: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    consumer_policy: ConsumerPolicy | None = None,
) -> PathVerdict:
    """Check ``path`` (a Path, or its bytes as received) for the exact ``output`` bytes (or their
    :class:`~countersign.verify.OutputDigest`). Online, only the output's SHA-256 is sent, hashed in
    this process whatever the output's size (ADR 0027).

    Online with ``verifier`` (a :class:`VerifierClient`, or a host:port reached with ``tls``, default
    :func:`tls_from_env`); offline with ``registry`` (a :class:`countersign.registry.Registry` or a
    registry file; see :func:`verify_offline` for ``state``); with neither, from
    ``COUNTERSIGN_VERIFIER`` or ``COUNTERSIGN_REGISTRY``. Accept mode by default: a verifier consumes
    the leaf nonce, so the same path shown again is ``NONCE_REPLAYED``; ``audit=True`` consumes nothing.
    ``consumer_policy``: your own policy (:func:`countersign.policy.parse_policy`), the same verdict
    online and offline: a path it refuses is ``CONSUMER_POLICY_VIOLATION`` and consumes nothing (spec
    16.4).

    A rejected path is a verdict, not an error. Raises ServiceError when the verifier refuses the
    request or cannot be reached, ConfigError when there is nowhere to verify."""
    where, offline = _where(verifier, registry, environ)
    if offline is not None:
        return verify_offline(
            path, output, offline, audit=audit, state=state, now_ms=now_ms, consumer_policy=consumer_policy
        )
    if isinstance(where, VerifierClient):
        return _from_service(where.verify(path, output, audit=audit, consumer_policy=consumer_policy), path)
    if not isinstance(where, str):
        raise TypeError(f"verifier must be a VerifierClient or host:port, not {type(where).__name__}")
    with VerifierClient(where, tls_from_env(environ) if tls is None else tls, lanes=0) as client:
        return _from_service(client.verify(path, output, audit=audit, consumer_policy=consumer_policy), path)


async def averify_path(
    path: Path | bytes,
    output: bytes | OutputDigest,
    *,
    verifier: AsyncVerifierClient | str | None = None,
    registry: Registry | str | None = None,
    tls: TlsConfig | None = None,
    audit: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    consumer_policy: ConsumerPolicy | None = None,
) -> PathVerdict:
    """:func:`verify_path` for an event loop: online through an :class:`AsyncVerifierClient` (or a
    host:port); offline the same in-process check (about a millisecond of CPU)."""
    where, offline = _where(verifier, registry, environ)
    if offline is not None:
        return verify_offline(
            path, output, offline, audit=audit, state=state, now_ms=now_ms, consumer_policy=consumer_policy
        )
    if isinstance(where, AsyncVerifierClient):
        return _from_service(await where.verify(path, output, audit=audit, consumer_policy=consumer_policy), path)
    if not isinstance(where, str):
        raise TypeError(f"verifier must be an AsyncVerifierClient or host:port, not {type(where).__name__}")
    async with AsyncVerifierClient(where, tls_from_env(environ) if tls is None else tls) as client:
        return _from_service(await client.verify(path, output, audit=audit, consumer_policy=consumer_policy), path)


def _from_service(answer: VerifierVerdict, path: Path | bytes) -> PathVerdict:
    return _verdict(answer.result, path, answer.registry_sequence)


# --- consumer side: sessions -------------------------------------------------------------------


@dataclass(frozen=True)
class SessionVerdict:
    """The answer to one presented session. Truthy exactly when accepted; then ``emitter`` names who
    emitted the session's last output (its ``seq`` is the last position) and ``session`` what the
    session is (id, receipts, closed). On a reject ``result.index`` is the first offending receipt."""

    result: VerificationResult
    emitter: OutputEmitter | None
    session: SessionSummary | None
    registry_sequence: int

    def __bool__(self) -> bool:
        return bool(self.result)

    @property
    def reason(self) -> Reason | None:
        """Why the session was rejected; None on accept."""
        return self.result.reason

    def raise_for_reject(self) -> None:
        """Raise :class:`countersign.errors.PathRejected` unless the session was accepted."""
        self.result.raise_for_reject()


SessionInput = SessionEvidence | bytes | Sequence[Path]


def session_evidence(session: SessionInput) -> SessionEvidence | bytes:
    """``session`` as evidence: SessionEvidence and its bytes pass through; a sequence of receipt
    paths (what :meth:`Runtime.receipt` returns, in session order, all under one agent path) becomes
    the agent path and the receipts. Raises ValueError for an empty sequence."""
    if isinstance(session, SessionEvidence | bytes):
        return session
    paths = list(session)
    if not paths:
        raise ValueError("a session has at least one receipt")
    return SessionEvidence(Path(paths[0].envelopes[:-1]), tuple(path.leaf for path in paths))


def _session_verdict(
    result: VerificationResult, evidence: SessionEvidence | bytes, summary: SessionSummary | None, sequence: int
) -> SessionVerdict:
    if not result:
        return SessionVerdict(result, None, None, sequence)
    parsed = evidence if isinstance(evidence, SessionEvidence) else SessionEvidence.from_bytes(evidence)
    last = Path((*parsed.agent.envelopes, parsed.receipts[-1]))
    return SessionVerdict(result, OutputEmitter.of(last), summary or SessionSummary.of(parsed), sequence)


def verify_session_offline(
    session: SessionInput,
    outputs: Sequence[bytes | OutputDigest | None] | None,
    registry: Registry,
    *,
    audit: bool = False,
    require_closed: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    policy: VerifierPolicy = DEFAULT_POLICY,
    consumer_policy: ConsumerPolicy | None = None,
) -> SessionVerdict:
    """The core's session verification (:func:`countersign.sessions.verify_session`) in this process;
    ``state`` as for :func:`verify_offline`."""
    evidence = session_evidence(session)
    if not isinstance(evidence, SessionEvidence):
        try:
            evidence = SessionEvidence.from_bytes(evidence)
        except MalformedError as exc:
            return SessionVerdict(malformed_result(exc), None, None, registry.sequence)
    if outputs is not None and len(outputs) != len(evidence.receipts):
        raise ValueError(f"{len(outputs)} outputs for {len(evidence.receipts)} receipts")
    result = core_verify_session(
        evidence, outputs, registry=registry, state=InMemoryState() if state is None else state,
        mode=Mode.AUDIT if audit else Mode.ACCEPT, now_ms=_now_ms() if now_ms is None else now_ms,
        require_closed=require_closed, policy=policy, consumer_policy=consumer_policy,
    )  # fmt: skip
    return _session_verdict(result, evidence, None, registry.sequence)


def verify_session(
    session: SessionInput,
    outputs: Sequence[bytes | OutputDigest | None] | None = None,
    *,
    verifier: VerifierClient | str | None = None,
    registry: Registry | str | None = None,
    tls: TlsConfig | None = None,
    audit: bool = False,
    require_closed: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    consumer_policy: ConsumerPolicy | None = None,
) -> SessionVerdict:
    """Check one agent's session: ``session`` is the receipt paths in session order (as
    :meth:`Runtime.receipt` returned them), or :class:`countersign.sessions.SessionEvidence` (or its
    bytes); ``outputs[i]`` the exact bytes of output *i* (None: not checked).

    Where, as :func:`verify_path`: ``verifier`` (a client or host:port, ``tls`` default
    :func:`tls_from_env`), or ``registry`` offline, or ``COUNTERSIGN_VERIFIER`` /
    ``COUNTERSIGN_REGISTRY``. Accept mode by default: every receipt's nonce is consumed, all or
    nothing; ``audit=True`` consumes nothing. ``require_closed``: the session must end with its close
    receipt. ``consumer_policy``: your own, applied to each receipt's path as for :func:`verify_path`
    (spec 16.3, 16.4). A rejected session is a verdict; raises ServiceError when the verifier refuses
    or cannot be reached, ConfigError when there is nowhere to verify, ValueError when ``outputs``
    does not have one entry per receipt (offline)."""
    where, offline = _where(verifier, registry, environ)
    if offline is not None:
        return verify_session_offline(
            session, outputs, offline, audit=audit, require_closed=require_closed, state=state, now_ms=now_ms,
            consumer_policy=consumer_policy,
        )  # fmt: skip
    evidence = session_evidence(session)
    if isinstance(where, VerifierClient):
        answer = where.verify_session(
            evidence, outputs, audit=audit, require_closed=require_closed, consumer_policy=consumer_policy
        )
        return _from_session_service(answer, evidence)
    if not isinstance(where, str):
        raise TypeError(f"verifier must be a VerifierClient or host:port, not {type(where).__name__}")
    with VerifierClient(where, tls_from_env(environ) if tls is None else tls, lanes=0) as client:
        answer = client.verify_session(
            evidence, outputs, audit=audit, require_closed=require_closed, consumer_policy=consumer_policy
        )
    return _from_session_service(answer, evidence)


async def averify_session(
    session: SessionInput,
    outputs: Sequence[bytes | OutputDigest | None] | None = None,
    *,
    verifier: AsyncVerifierClient | str | None = None,
    registry: Registry | str | None = None,
    tls: TlsConfig | None = None,
    audit: bool = False,
    require_closed: bool = False,
    state: VerifierState | None = None,
    now_ms: int | None = None,
    environ: Mapping[str, str] | None = None,
    consumer_policy: ConsumerPolicy | None = None,
) -> SessionVerdict:
    """:func:`verify_session` for an event loop (online through an :class:`AsyncVerifierClient`)."""
    where, offline = _where(verifier, registry, environ)
    if offline is not None:
        return verify_session_offline(
            session, outputs, offline, audit=audit, require_closed=require_closed, state=state, now_ms=now_ms,
            consumer_policy=consumer_policy,
        )  # fmt: skip
    evidence = session_evidence(session)
    if isinstance(where, AsyncVerifierClient):
        answer = await where.verify_session(
            evidence, outputs, audit=audit, require_closed=require_closed, consumer_policy=consumer_policy
        )
        return _from_session_service(answer, evidence)
    if not isinstance(where, str):
        raise TypeError(f"verifier must be an AsyncVerifierClient or host:port, not {type(where).__name__}")
    async with AsyncVerifierClient(where, tls_from_env(environ) if tls is None else tls) as client:
        answer = await client.verify_session(
            evidence, outputs, audit=audit, require_closed=require_closed, consumer_policy=consumer_policy
        )
    return _from_session_service(answer, evidence)


def _from_session_service(answer: SessionVerifierVerdict, evidence: SessionEvidence | bytes) -> SessionVerdict:
    return _session_verdict(answer.result, evidence, answer.session, answer.registry_sequence)
