"""The integration kit: what every framework integration is made of (ADR 0037; docs/extending.md).

An integration signs where a framework's agents emit bytes and checks where a consumer reads them.
Whatever the framework, it needs the same few pieces, and they live here, once:

- :func:`require`: import the framework lazily, with an ImportError naming the extra to install;
- :func:`output_bytes`: the exact bytes an output is signed as (text as UTF-8, bytes as they are,
  anything else as RFC 8785 canonical JSON);
- :class:`Signing` / :class:`AsyncSigning` and the mesh behind them (:class:`MeshSigning`,
  :class:`AsyncMeshSigning`): an agent's record (a root, a same-deployer child, a co-signed
  delegation from another deployer's agent, or the acceptance of a handoff) and its output receipts;
- :class:`LazyRuntime`: a deployer's runtime made on first use, inside the framework's event loop;
- :class:`IntegrationRefusal`: a refusal seen through a framework, a ServiceError with its code;
- the consumer's side: :func:`verify_output` / :func:`averify_output` (one output and its receipt),
  :func:`verify_session_output` / :func:`averify_session_output` (one session),
  :func:`verify_outputs` / :func:`averify_outputs` and :class:`OutputVerdicts` (every output of a
  run), each with a :class:`countersign.client.Consumer` and answering the one verdict shape.

What stays in an integration's own module is what only its framework knows: where evidence travels
in the framework's objects, and where the hooks are. This module imports the core and the client,
never a framework.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from countersign.canonical import canonicalize
from countersign.client.consumer import Consumer
from countersign.client.runtime import AsyncRuntime, Runtime
from countersign.consumer import EvidenceVerdict
from countersign.errors import ConfigError, ErrorCode, MalformedError, ServiceError
from countersign.extras import install_command
from countersign.handoff import Delegation
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign.verify import malformed_result

# --- the framework, imported lazily -------------------------------------------------------------


def require(integration: str, extra: str, load: Callable[[], types.ModuleType]) -> types.ModuleType:
    """``load()`` the framework module ``countersign.integrations.<integration>`` is built on (a function
    that imports it by its literal name, so the house's import guard can follow it). Raises ImportError
    naming ``extra`` (``pip install 'countersign-mesh[extra]'``) when it or what it needs is missing."""
    try:
        return load()
    except ImportError as exc:
        raise ImportError(
            f"countersign.integrations.{integration} needs {exc.name or integration}: {install_command(extra)}"
        ) from exc


# --- the signed bytes ---------------------------------------------------------------------------


def output_bytes(value: object) -> bytes:
    """The exact bytes ``value`` is signed as: a ``str`` as UTF-8, ``bytes`` as they are, anything
    else as RFC 8785 canonical JSON. Raises TypeError for a value JSON cannot hold."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    try:
        return canonicalize(value)
    except MalformedError as exc:
        raise TypeError(f"an output must be text, bytes or JSON to be signed ({exc})") from None


# --- refusals -----------------------------------------------------------------------------------


class IntegrationRefusal(ServiceError):
    """A refusal seen through a framework: the other side (a tool server, a child agent) refused or
    could not sign, and said so in the framework's own terms; or the evidence a consumer needs is not
    there. A ServiceError, so one ``except ServiceError`` catches it beside a signer's refusal, each
    with its ``code``."""

    def __init__(self, code: ErrorCode | str, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(code, message, retryable=retryable)


# --- who signs: the mesh, or anything that can stand in for it ----------------------------------


class Signing(Protocol):
    """Issues the evidence of agents that run synchronously."""

    def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        """The record of agent ``instance`` on ``deployer``: under ``handoff`` if one is pending, else
        a root (``parent`` None), a same-deployer child, or a co-signed delegation from ``parent``."""
        ...

    def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        """The receipt of ``output``, emitted by the agent whose record ends ``agent``."""
        ...


class AsyncSigning(Protocol):
    """:class:`Signing` for agents that run in an event loop."""

    async def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path: ...

    async def receipt(self, deployer: str, agent: Path, output: bytes) -> Path: ...


R = TypeVar("R", Runtime, AsyncRuntime)


def runtime_of(runtimes: Mapping[str, R], deployer: str, why: str) -> R:
    """The runtime of ``deployer``. Raises ConfigError when there is none, or it is another deployer's."""
    runtime = runtimes.get(deployer)
    if runtime is None:
        raise ConfigError(f"no runtime for {deployer} ({why}); have {sorted(runtimes)}")
    if runtime.deployer != deployer:
        raise ConfigError(f"the runtime given for {deployer} is {runtime.deployer}'s")
    return runtime


def session_of(agent: Path) -> str:
    """One session per agent record: its receipts are numbered 0, 1, ... under it (spec section 17)."""
    record = agent.leaf.record
    return f"{record.agent.instance}.{record.nonce}"


@dataclass
class MeshSigning:
    """Signs through each deployer's signer: ``runtimes`` maps a deployer id to its runtime. A
    delegation from a deployer whose runtime is not here arrives as a handoff instead. ``system``
    names the agent system of the roots it starts."""

    runtimes: Mapping[str, Runtime]
    system: str = "agents"
    ttl_ms: int = 3_600_000
    max_children: int = 8
    grant_ttl_ms: int = 60_000

    def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        runtime = runtime_of(self.runtimes, deployer, "it hosts the agent")
        if handoff is not None:
            return runtime.accept(handoff, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)
        if parent is None:
            return runtime.root(instance, self.system, ttl_ms=self.ttl_ms, max_children=self.max_children)
        parent_deployer = parent.leaf.record.deployer
        if parent_deployer == deployer:
            return runtime.local_child(parent, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)
        delegation = runtime_of(self.runtimes, parent_deployer, "it delegates").delegate(
            parent, deployer, ttl_ms=self.grant_ttl_ms
        )
        return runtime.accept(delegation, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)

    def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        runtime = runtime_of(self.runtimes, deployer, "it hosts the agent")
        return runtime.receipt(agent, output, session=session_of(agent))


@dataclass
class AsyncMeshSigning:
    """:class:`MeshSigning` over :class:`countersign.client.AsyncRuntime` objects."""

    runtimes: Mapping[str, AsyncRuntime]
    system: str = "agents"
    ttl_ms: int = 3_600_000
    max_children: int = 8
    grant_ttl_ms: int = 60_000

    async def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        runtime = runtime_of(self.runtimes, deployer, "it hosts the agent")
        if handoff is not None:
            return await runtime.accept(handoff, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)
        if parent is None:
            return await runtime.root(instance, self.system, ttl_ms=self.ttl_ms, max_children=self.max_children)
        parent_deployer = parent.leaf.record.deployer
        if parent_deployer == deployer:
            return await runtime.local_child(parent, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)
        delegation = await runtime_of(self.runtimes, parent_deployer, "it delegates").delegate(
            parent, deployer, ttl_ms=self.grant_ttl_ms
        )
        return await runtime.accept(delegation, instance, ttl_ms=self.ttl_ms, max_children=self.max_children)

    async def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        runtime = runtime_of(self.runtimes, deployer, "it hosts the agent")
        return await runtime.receipt(agent, output, session=session_of(agent))


RuntimeSource = AsyncRuntime | Callable[[], AsyncRuntime] | None


@dataclass
class LazyRuntime:
    """A deployer's :class:`AsyncRuntime`, made on first use: an AsyncRuntime belongs to the event
    loop that made it, and a framework's server starts its loop after the integration is built.
    ``source``: the runtime itself, a function making one, or None for
    :meth:`AsyncRuntime.from_env` (``environ``, by default the process's)."""

    source: RuntimeSource
    environ: Mapping[str, str] | None = None
    _runtime: AsyncRuntime | None = None

    def get(self) -> AsyncRuntime:
        """The runtime. Raises ConfigError when the environment does not configure one."""
        if self._runtime is None:
            if isinstance(self.source, AsyncRuntime):
                self._runtime = self.source
            elif self.source is not None:
                self._runtime = self.source()
            else:
                self._runtime = AsyncRuntime.from_env(self.environ)
        return self._runtime

    async def close(self) -> None:
        """Close the runtime if this made it (not one it was given)."""
        if self._runtime is not None and not isinstance(self.source, AsyncRuntime):
            await self._runtime.close()
        self._runtime = None


# --- the consumer's side ------------------------------------------------------------------------

Receipt = Path | bytes  # a receipt path, or its path JSON as received
ReadOutput = Callable[[], tuple[Receipt, bytes]]
ReadSession = Callable[[], tuple[SessionEvidence, list[bytes | None]]]


def malformed_verdict(exc: MalformedError) -> EvidenceVerdict:
    """The verdict on evidence that cannot be read: ``MALFORMED``, registry sequence 0."""
    return EvidenceVerdict(malformed_result(exc), 0)


def _read(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except MalformedError as exc:
        return malformed_verdict(exc)


def verify_output(read: ReadOutput, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """Check one output with ``consumer``: ``read()`` gives its receipt and the bytes the consumer
    holds (raising MalformedError when the framework's object carries no readable evidence, which is
    a ``MALFORMED`` verdict). Accept mode consumes the receipt; ``audit`` nothing."""
    read_out = _read(read)
    if isinstance(read_out, EvidenceVerdict):
        return read_out
    receipt, output = read_out
    return consumer.path(receipt, output, audit=audit)


async def averify_output(read: ReadOutput, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """:func:`verify_output` for an event loop."""
    read_out = _read(read)
    if isinstance(read_out, EvidenceVerdict):
        return read_out
    receipt, output = read_out
    return await consumer.apath(receipt, output, audit=audit)


def verify_session_output(
    read: ReadSession, consumer: Consumer, *, audit: bool = False, require_closed: bool = False
) -> EvidenceVerdict:
    """Check one session as a whole with ``consumer`` (spec section 17): ``read()`` gives its session
    evidence and each output's bytes (MalformedError: a ``MALFORMED`` verdict)."""
    read_out = _read(read)
    if isinstance(read_out, EvidenceVerdict):
        return read_out
    evidence, outputs = read_out
    return consumer.session(evidence, outputs, audit=audit, require_closed=require_closed)


async def averify_session_output(
    read: ReadSession, consumer: Consumer, *, audit: bool = False, require_closed: bool = False
) -> EvidenceVerdict:
    """:func:`verify_session_output` for an event loop."""
    read_out = _read(read)
    if isinstance(read_out, EvidenceVerdict):
        return read_out
    evidence, outputs = read_out
    return await consumer.asession(evidence, outputs, audit=audit, require_closed=require_closed)


T = TypeVar("T")


@dataclass(frozen=True)
class OutputVerdicts(Generic[T]):
    """The verdicts on every signed output of a run, each the one verdict shape
    (:class:`countersign.consumer.EvidenceVerdict`) beside what it is for. Truthy only when there is
    at least one and every one was accepted."""

    outputs: tuple[tuple[T, EvidenceVerdict], ...]

    def __bool__(self) -> bool:
        return bool(self.outputs) and all(verdict for _, verdict in self.outputs)

    @property
    def rejected(self) -> tuple[tuple[T, EvidenceVerdict], ...]:
        return tuple((signed, verdict) for signed, verdict in self.outputs if not verdict)


Checks = Iterable[tuple[T, Receipt, bytes]]


def verify_outputs(checks: Checks[T], consumer: Consumer, *, audit: bool = False) -> list[tuple[T, EvidenceVerdict]]:
    """Check each ``(what, receipt, bytes)`` with ``consumer``, in order."""
    return [(what, consumer.path(receipt, data, audit=audit)) for what, receipt, data in checks]


async def averify_outputs(
    checks: Checks[T], consumer: Consumer, *, audit: bool = False
) -> list[tuple[T, EvidenceVerdict]]:
    """:func:`verify_outputs` for an event loop."""
    return [(what, await consumer.apath(receipt, data, audit=audit)) for what, receipt, data in checks]
