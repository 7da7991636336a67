"""MCP: sign every tool result where the tool server emits it, and check it where a client reads it.

Server side. :class:`SigningMiddleware` is an ``mcp`` 2.x server middleware (``MCPServer(...,
middleware=[...])`` or ``server.middleware.append(...)``; the low-level ``Server`` too) over the
deployer's :class:`countersign.client.AsyncRuntime`::

    runtime = AsyncRuntime.from_env()                      # COUNTERSIGN_SIGNER, _DEPLOYER, _CLIENT_*
    server = MCPServer("weather", middleware=[SigningMiddleware(runtime, system="weather-tools")])
    # or: sign_server(server, runtime, system="weather-tools")  -> the middleware it appended
    # runtime None (the default): AsyncRuntime.from_env(), made inside the server's event loop on the
    # first tool call. Any transport: server.run("stdio"), server.streamable_http_app() / "streamable-http".

Every ``tools/call`` result (``isError`` ones included) is signed as a ``per_tool_call`` receipt
before it leaves the server: the signed bytes are :func:`result_bytes` of the result exactly as sent
(RFC 8785 JSON of ``{"content", "isError", "structuredContent"}``, null members of content blocks
omitted; docs/spec.md "MCP binding", ADR 0023). Each client session (one MCP connection: a stdio
process, a Streamable HTTP session) is one agent and one Countersign session: its first tool call
obtains the agent record (a root of ``system``, or, when the request's ``_meta`` carries a
``Delegation`` string under :data:`DELEGATION_KEY`, the co-signed child record accepting it), and its
tool results are receipts ``seq`` 0, 1, 2, ... chained in the order the signer signed them. The
evidence, the receipt path (agent path + receipt), goes in the result's ``_meta`` under
:data:`EVIDENCE_KEY` as ``{"v": 1, "path": <path JSON>}``.

A refusal fails closed: no unsigned result leaves. The client gets a JSON-RPC error with code
:data:`REFUSAL_CODE` and ``data`` ``{"countersign.dev/error": "<ErrorCode>", "retryable": bool}`` (a signer that refuses
or cannot be reached, a delegation for another deployer, expired, or refused by the parent's signer).

Client side, over results as ``ClientSession.call_tool`` returns them (``CallToolResult``) or as
raw JSON objects, checked with a :class:`countersign.client.Consumer` (online or offline):

    consumer = Consumer.from_env()                               # or Consumer.offline("registry.json")
    verdict = await averify_result(result, consumer)             # verify_result sync
    verdict.emitter.deployer, verdict.emitter.seq                # who emitted these bytes, where in the session
    verdict = check_session([r1, r2, r3], consumer)              # dropped / reordered / duplicated results
    meta = delegation_meta(handoff)                              # call_tool(..., meta=meta) on the first call
    refusal(mcp_error)                                           # the ServiceError a refusal carried, else None

:func:`evidence_of` extracts the path (raises :class:`EvidenceMissing`, a ServiceError with
``INVALID_ARGUMENT``, when there is none; MalformedError when it does not parse). A rejected result is a verdict, not an
error (``verdict.reason``: ``OUTPUT_MISMATCH`` for a tampered result).

Wrapping an existing server unchanged: ``countersign mcp-proxy -- COMMAND ARGS...`` runs
:func:`run_stdio_proxy`, a newline-delimited JSON-RPC relay between its own stdio and the child's that
signs every ``tools/call`` result the child sends back (one session per proxy process: one stdio
client) and passes everything else through byte for byte. Configured by the runtime SDK's environment
variables (:meth:`countersign.client.AsyncRuntime.from_env`) plus ``COUNTERSIGN_MCP_SYSTEM``.

Needs the ``mcp`` extra (``pip install 'countersign-mesh[mcp]'``); ``mcp`` is imported only when a
middleware is built or a refusal raised (:func:`require_mcp`); the client-side checks and the proxy
read JSON and duck-typed models and need only the client package.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import secrets
import types
import weakref
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from countersign.canonical import canonicalize
from countersign.client.consumer import Consumer
from countersign.consumer import EvidenceVerdict
from countersign.errors import ConfigError, ErrorCode, MalformedError, ServiceError
from countersign.handoff import Delegation
from countersign.integrations import kit
from countersign.records import BindingScope, Path
from countersign.sessions import SessionEvidence

if TYPE_CHECKING:
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.shared.exceptions import MCPError

EXTRA: Final = "mcp"
EVIDENCE_KEY: Final = "countersign.dev/evidence"
# Evidence a result already carried when it was signed again (a signing server behind the proxy):
# kept, innermost first, beside the evidence of the deployer that signed last (spec 20.2).
WRAPPED_EVIDENCE_KEY: Final = "countersign.dev/wrapped-evidence"
MAX_WRAPPED_EVIDENCE: Final = 8
DELEGATION_KEY: Final = "countersign.dev/delegation"
ERROR_KEY: Final = "countersign.dev/error"
EVIDENCE_VERSION: Final = 1
# JSON-RPC reserves -32000..-32099 for implementation-defined server errors: one code for every
# Countersign refusal, the ErrorCode itself in the error's data.
REFUSAL_CODE: Final = -32050
ENV_SYSTEM: Final = "COUNTERSIGN_MCP_SYSTEM"
DEFAULT_SYSTEM: Final = "mcp-tools"
# Per server: client sessions with a live agent record (a session past this is refused, not evicted,
# so that no session's numbering silently restarts).
MAX_SESSIONS: Final = 4096
# The proxy: the longest JSON-RPC line it relays, and the tool calls it holds open at once.
MAX_LINE_BYTES: Final = 16 << 20
MAX_PENDING_CALLS: Final = 1024

_log = logging.getLogger(__name__)


def require_mcp() -> Any:
    """The ``mcp_types`` module; ImportError naming the extra when the MCP SDK is not installed (the
    SDK itself, not only its types package)."""

    def load() -> types.ModuleType:
        importlib.import_module("mcp.shared.exceptions")  # the SDK itself, not only its types package
        return importlib.import_module("mcp_types")

    return kit.require("mcp", EXTRA, load)


# --- the signed bytes ---------------------------------------------------------------------------


def result_object(result: object) -> dict[str, Any]:
    """A tool result as its wire JSON object: a ``CallToolResult`` (any pydantic model) dumped the way
    the SDK sends it (by alias, nulls omitted), or a JSON object as received. Raises TypeError."""
    dump = getattr(result, "model_dump", None)
    if callable(dump):
        dumped = dump(by_alias=True, mode="json", exclude_none=True)
        if isinstance(dumped, dict):
            return dumped
    if isinstance(result, Mapping):
        return dict(result)
    raise TypeError(f"a tool result is a CallToolResult or a JSON object, not {type(result).__name__}")


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def result_bytes(result: object) -> bytes:
    """The bytes a tool result's receipt hashes (docs/spec.md "MCP binding"): RFC 8785 JSON of
    ``{"content": ..., "isError": ..., "structuredContent": ...}`` taken from the result, where
    ``content`` is the content array with every null object member omitted (absent and null mean the
    same in MCP's schema, and SDKs drop one or keep the other), ``isError`` is a boolean (absent is
    false) and ``structuredContent`` is present exactly when the result has a non-null one. ``_meta``
    (where the evidence travels) and protocol fields (``resultType``, cache hints) are not signed.

    Raises MalformedError when the result has no such form (content not an array, isError not a
    boolean, a number JCS cannot represent)."""
    wire = result_object(result)
    content = wire.get("content", [])
    if not isinstance(content, list):
        raise MalformedError("a tool result's content must be an array")
    is_error = wire.get("isError")
    if is_error is None:
        is_error = False
    if not isinstance(is_error, bool):
        raise MalformedError("a tool result's isError must be a boolean")
    signed: dict[str, Any] = {"content": _without_nulls(content), "isError": is_error}
    structured = wire.get("structuredContent")
    if structured is not None:
        signed["structuredContent"] = structured
    return canonicalize(signed)


def evidence_json(receipt: Path) -> dict[str, Any]:
    """The value under :data:`EVIDENCE_KEY` in a signed result's ``_meta``."""
    return {"v": EVIDENCE_VERSION, "path": receipt.to_json()}


def is_interim(wire: Mapping[str, Any]) -> bool:
    """An ``input_required`` answer (2026-07-28): the tool has not produced its result yet."""
    kind = wire.get("resultType")
    return kind is not None and kind != "complete"


# --- refusals -----------------------------------------------------------------------------------


def refusal_data(error: ServiceError) -> dict[str, Any]:
    """The JSON-RPC error ``data`` of a refusal."""
    return {ERROR_KEY: error.code.value, "retryable": error.retryable}


def refusal_message(error: ServiceError) -> str:
    return f"countersign refused the tool call: {error.code.value}: {error}"


def refusal_error(error: ServiceError) -> MCPError:
    """The ``MCPError`` a server raises for a refusal (code :data:`REFUSAL_CODE`)."""
    from mcp.shared.exceptions import MCPError

    return MCPError(REFUSAL_CODE, refusal_message(error), refusal_data(error))


def refusal(error: BaseException) -> kit.IntegrationRefusal | None:
    """The refusal a Countersign tool server sent (an ``MCPError`` a client received, or any
    exception with the same ``code`` and ``data``), as a ServiceError with its code; None for any
    other error."""
    code, message, data = getattr(error, "code", None), str(error), getattr(error, "data", None)
    if code != REFUSAL_CODE or not isinstance(data, Mapping) or not isinstance(data.get(ERROR_KEY), str):
        return None
    return kit.IntegrationRefusal(ErrorCode.of(data[ERROR_KEY]), message, retryable=data.get("retryable") is True)


class EvidenceMissing(kit.IntegrationRefusal):
    """A tool result carries no Countersign evidence (``INVALID_ARGUMENT``): it was not signed, or its
    ``_meta`` was stripped on the way."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENT, message)


# --- server side: one client session's signing --------------------------------------------------


RuntimeSource = kit.RuntimeSource
# The runtime, made on first use (an AsyncRuntime belongs to the event loop that made it, and a server's
# loop starts after the middleware is built): the kit's LazyRuntime, under the name the proxy uses.
_RuntimeHolder = kit.LazyRuntime


def _delegation_in(meta: object) -> str | None:
    if not isinstance(meta, Mapping):
        return None
    value = meta.get(DELEGATION_KEY)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ServiceError(ErrorCode.INVALID_ARGUMENT, f"_meta {DELEGATION_KEY} must be a delegation string")
    return value


@dataclass
class SessionSigner:
    """One MCP client session's signing: its agent record, obtained on its first tool call (a root, or
    the acceptance of the delegation that call's ``_meta`` carries), and one receipt per tool result.
    The signer numbers the receipts (session = the agent instance) in the order they are signed."""

    runtime: _RuntimeHolder
    system: str
    instance: str
    agent: Path | None = None
    _accepted: str | None = None  # the delegation string the agent record accepted, if any
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def agent_for(self, request_meta: object) -> Path:
        """The session's agent record, obtained on the first call. A delegation on a later call is
        refused (``INVALID_ARGUMENT``): a session's receipts hang under one agent. Raises ServiceError."""
        handoff = _delegation_in(request_meta)
        async with self._lock:
            if self.agent is None:
                try:
                    runtime = self.runtime.get()
                except ConfigError as exc:  # no code of its own: the server is misconfigured, not the client
                    raise ServiceError(
                        ErrorCode.INTERNAL, f"the tool server's signing is not configured: {exc}"
                    ) from None
                if handoff is not None:
                    self.agent = await runtime.accept(handoff, self.instance)
                else:
                    self.agent = await runtime.root(self.instance, self.system)
            elif handoff is not None and handoff != self._accepted:
                raise ServiceError(
                    ErrorCode.INVALID_ARGUMENT,
                    "this session already has its agent record: a delegation opens a session",
                )
            if handoff is not None:
                self._accepted = handoff
            return self.agent

    async def sign(self, wire: dict[str, Any]) -> dict[str, Any]:
        """``wire`` (a tool result's JSON object) with its evidence in ``_meta``. Raises ServiceError:
        the caller must not send the result unsigned."""
        if self.agent is None:
            raise ServiceError(ErrorCode.INTERNAL, "a tool result before the session's agent record")
        try:
            output = result_bytes(wire)
        except MalformedError as exc:
            raise ServiceError(ErrorCode.INTERNAL, f"the tool result cannot be signed: {exc}") from None
        meta = wire.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            raise ServiceError(ErrorCode.INTERNAL, "the tool result's _meta is not an object")
        kept = _wrapped_evidence(meta or {})
        receipt = await self.runtime.get().receipt(self.agent, output, binding_scope=BindingScope.PER_TOOL_CALL.value)
        signed = dict(wire)
        signed["_meta"] = {**(meta or {}), EVIDENCE_KEY: evidence_json(receipt)}
        if kept:
            signed["_meta"][WRAPPED_EVIDENCE_KEY] = kept
        return signed


def _wrapped_evidence(meta: Mapping[str, Any]) -> list[Any]:
    """The evidence ``meta`` already carries, to keep beside this signer's (spec 20.2): what was
    wrapped before, then what was outermost. Raises ServiceError (the result is not sent unsigned,
    nor with evidence dropped) when there is more than :data:`MAX_WRAPPED_EVIDENCE` of it or the
    earlier list is not a list."""
    earlier = meta.get(WRAPPED_EVIDENCE_KEY, [])
    if not isinstance(earlier, list):
        raise ServiceError(ErrorCode.INTERNAL, f"the tool result's _meta {WRAPPED_EVIDENCE_KEY} is not a list")
    kept = [*earlier, meta[EVIDENCE_KEY]] if EVIDENCE_KEY in meta else list(earlier)
    if len(kept) > MAX_WRAPPED_EVIDENCE:
        raise ServiceError(ErrorCode.INTERNAL, f"the tool result carries more than {MAX_WRAPPED_EVIDENCE} evidences")
    return kept


def instance_id(name: str) -> str:
    return f"{name}-{secrets.token_hex(6)}"


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> object:
    """The client connection a request came on: the SDK's per-connection ``Connection``, which its
    per-request ``ServerSession`` holds (mcp 2.3 exposes it to tools, not to middleware; a test of
    two sessions over one server catches a change). A stateless HTTP request is a connection of its
    own, so each of its tool results is a session of one receipt."""
    return getattr(ctx.session, "_connection", ctx.session)


class SigningMiddleware:
    """An ``mcp`` server middleware signing every ``tools/call`` result (see the module docstring).

    ``runtime``: the deployer's :class:`AsyncRuntime`, a function making one (called inside the
    server's event loop), or None for :meth:`AsyncRuntime.from_env`. ``system``: the agent system of
    the sessions' root records; ``name``: the agent instance prefix (each client session is agent
    ``<name>-<random>``). At most ``max_sessions`` client sessions are open at once; more are refused
    (``RESOURCE_EXHAUSTED``)."""

    def __init__(
        self,
        runtime: RuntimeSource = None,
        *,
        system: str = DEFAULT_SYSTEM,
        name: str = "mcp-tool",
        max_sessions: int = MAX_SESSIONS,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        require_mcp()
        self._runtime = _RuntimeHolder(runtime, environ)
        self.system = system
        self.name = name
        self.max_sessions = max_sessions
        # Keyed by the SDK's connection object, weakly: a session's signing ends with its connection.
        self._sessions: MutableMapping[object, SessionSigner] = weakref.WeakKeyDictionary()

    def session_of(self, connection: object) -> SessionSigner:
        """The signing of the client session ``connection`` (the request context's ``session``)."""
        found = self._sessions.get(connection)
        if found is None:
            if len(self._sessions) >= self.max_sessions:
                raise ServiceError(
                    ErrorCode.RESOURCE_EXHAUSTED, f"this tool server signs for {self.max_sessions} sessions at most"
                )
            found = self._sessions[connection] = SessionSigner(self._runtime, self.system, instance_id(self.name))
        return found

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        params = ctx.params or {}
        try:
            session = self.session_of(_connection_of(ctx))
            await session.agent_for(params.get("_meta"))  # before the tool runs: a refusal runs nothing
        except ServiceError as exc:
            _log.info("tool call refused: %s", exc.code.value)
            raise refusal_error(exc) from None
        result = await call_next(ctx)
        wire = result_object(result) if result is not None else {}
        if is_interim(wire):
            return result
        try:
            return await session.sign(wire)
        except ServiceError as exc:
            _log.info("tool result not signed: %s", exc.code.value)
            raise refusal_error(exc) from None

    async def aclose(self) -> None:
        """Close the runtime this middleware made (not one it was given)."""
        await self._runtime.close()


def sign_server(server: Any, runtime: RuntimeSource = None, **options: Any) -> SigningMiddleware:
    """Append a :class:`SigningMiddleware` to ``server``'s middleware (an ``MCPServer`` or a low-level
    ``Server``) and return it. ``options``: those of :class:`SigningMiddleware`."""
    middleware = SigningMiddleware(runtime, **options)
    server.middleware.append(middleware)
    return middleware


# --- client side --------------------------------------------------------------------------------


def evidence_of(result: object) -> Path:
    """The receipt path in a tool result's ``_meta``. Raises :class:`EvidenceMissing` when there is
    none, MalformedError when it is not a version-1 evidence object with a valid path."""
    wire = result_object(result)
    meta = wire.get("_meta")
    evidence = meta.get(EVIDENCE_KEY) if isinstance(meta, Mapping) else None
    if evidence is None:
        raise EvidenceMissing(f"the tool result has no {EVIDENCE_KEY} in its _meta")
    if not isinstance(evidence, Mapping) or set(evidence) != {"v", "path"}:
        raise MalformedError(f"{EVIDENCE_KEY} must be an object with exactly v and path")
    if evidence["v"] != EVIDENCE_VERSION or isinstance(evidence["v"], bool):
        raise MalformedError(f"{EVIDENCE_KEY} version {evidence['v']!r} is not supported")
    return Path.from_json(evidence["path"])


def wrapped_evidence_of(result: object) -> list[Path]:
    """The receipt paths a tool result carried before it was signed last (``_meta`` under
    :data:`WRAPPED_EVIDENCE_KEY`), innermost first: e.g. a signing server's own, behind
    ``countersign mcp-proxy``. Each signs the same bytes (:func:`result_bytes`) and is verified as
    :func:`verify_result` verifies the outermost. Raises MalformedError when one is not a version-1
    evidence object with a valid path; [] when there is none."""
    meta = result_object(result).get("_meta")
    kept = meta.get(WRAPPED_EVIDENCE_KEY, []) if isinstance(meta, Mapping) else []
    if not isinstance(kept, list):
        raise MalformedError(f"{WRAPPED_EVIDENCE_KEY} must be a list")
    return [evidence_of({"content": [], "_meta": {EVIDENCE_KEY: evidence}}) for evidence in kept]


def verify_result(result: object, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """Check a tool result's evidence with ``consumer`` against :func:`result_bytes` of the result
    itself. A result whose bytes differ from what was signed is ``OUTPUT_MISMATCH``; malformed
    evidence is ``MALFORMED`` (registry sequence 0). Accept mode consumes the receipt; ``audit``
    nothing. Raises :class:`EvidenceMissing` when the result carries no evidence at all."""
    return kit.verify_output(lambda: (evidence_of(result), result_bytes(result)), consumer, audit=audit)


async def averify_result(result: object, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """:func:`verify_result` for an event loop."""
    return await kit.averify_output(lambda: (evidence_of(result), result_bytes(result)), consumer, audit=audit)


def session_evidence(results: Sequence[object]) -> tuple[SessionEvidence, list[bytes | None]]:
    """The session evidence of one client session's tool results, in the order given, and the bytes
    of each. Raises EvidenceMissing, MalformedError (also when ``results`` is empty)."""
    if not results:
        raise MalformedError("a session has at least one tool result")
    paths = [evidence_of(result) for result in results]
    first = paths[0]
    if len(first.envelopes) < 2:  # an agent record and its receipt at least
        raise MalformedError("the evidence path has no agent record above its receipt")
    agent = Path(first.envelopes[:-1])
    outputs: list[bytes | None] = [result_bytes(result) for result in results]
    return SessionEvidence(agent, tuple(path.leaf for path in paths)), outputs


def check_session(
    results: Sequence[object], consumer: Consumer, *, audit: bool = False, require_closed: bool = False
) -> EvidenceVerdict:
    """Check one client session's tool results as a whole with ``consumer`` (docs/spec.md section
    17): every result's receipt and bytes, one agent, ``seq`` 0, 1, 2, ... in the order given, each
    chained to the one before. A dropped result is ``SESSION_GAP``, two swapped ``SESSION_REORDERED``,
    one shown twice ``SESSION_DUPLICATE``, a changed one ``SESSION_OUTPUT_MISMATCH``. Results of
    concurrent calls are given in the order their receipts were signed (their ``seq``). Accept mode
    consumes every receipt, all or nothing (a receipt already accepted alone makes it
    ``NONCE_REPLAYED``: check those with ``audit=True``). Malformed evidence is a ``MALFORMED`` verdict;
    a result without evidence raises :class:`EvidenceMissing`."""
    return kit.verify_session_output(
        lambda: session_evidence(results), consumer, audit=audit, require_closed=require_closed
    )


async def acheck_session(
    results: Sequence[object], consumer: Consumer, *, audit: bool = False, require_closed: bool = False
) -> EvidenceVerdict:
    """:func:`check_session` for an event loop."""
    return await kit.averify_session_output(
        lambda: session_evidence(results), consumer, audit=audit, require_closed=require_closed
    )


def delegation_meta(handoff: Delegation | str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A request ``_meta`` (``meta`` plus the handoff) for a session's first ``call_tool``: the tool
    server's signer accepts the delegation, so the session's agent is the delegating agent's child."""
    return {**(meta or {}), DELEGATION_KEY: str(handoff)}
