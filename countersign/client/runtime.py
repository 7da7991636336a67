"""The runtime SDK: the few calls an agent runtime (a producer) needs (docs/quickstart-runtime.md).

Producer side, :class:`Runtime` and its asyncio twin :class:`AsyncRuntime`, over the deployer's own
signer: start an agent (a root record), sign an output (``receipt(parent, output)`` hashes the exact
bytes itself), a same-deployer child, and a cross-deployer delegation in two halves: the parent's
runtime calls :meth:`Runtime.delegate` (its signer opens a grant; the answer is a
:class:`countersign.client.Delegation`, sent to the child as a string), the child's runtime calls
:meth:`Runtime.accept` (its signer obtains the parent signer's co-signature). Closing a session waits
for the signer's close receipt (:meth:`Runtime.close_session`, a :class:`ClosedSession`); a
streamed output is signed one receipt per ``n`` tokens or bytes as it is emitted
(:meth:`Runtime.stream`, :class:`countersign.client.signer.ChunkReceipt` per chunk).

A consumer checks what a runtime signed with :class:`countersign.client.Consumer` (ADR 0034).

Every refusal is a :class:`countersign.client.ServiceError` with a code from the closed
:class:`countersign.errors.ErrorCode`; a rejected path is a verdict, not an error.

Configuration from the environment (:meth:`Runtime.from_env`; a consumer's,
:meth:`countersign.client.Consumer.from_env`), named so that no daemon setting reads them:

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
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType

from countersign import _clock
from countersign.client.signer import AsyncSignerClient, ChunkReceipt, SignerClient
from countersign.client.tls import TlsConfig, tls_from_env
from countersign.errors import ConfigError, ErrorCode
from countersign.handoff import Delegation, HandoffError
from countersign.records import Path

ENV_SIGNER = "COUNTERSIGN_SIGNER"
ENV_DEPLOYER = "COUNTERSIGN_DEPLOYER"
ENV_PUBLIC_SIGNER = "COUNTERSIGN_PUBLIC_SIGNER"


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


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
    now = _clock.now_ms() if now_ms is None else now_ms
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
