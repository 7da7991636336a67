"""A2A: the parent sends its delegation with the task message, the child signs each artifact it returns.

The parent agent's runtime delegates (``Runtime.delegate``) and puts the handoff string in its task
message's metadata (:func:`delegated_message`); the child's A2A server wraps its own executor with
:class:`SignedExecutor`, which accepts the delegation through the child deployer's own signer before the
executor runs (a refusal fails the task, typed, and the executor never runs) and signs every artifact the
executor emits as an output receipt under the accepted record, attaching the receipt path to the
artifact's metadata. Any consumer checks an artifact with :func:`verify_artifact`::

    # child deployer (an A2A JSON-RPC server)
    executor = SignedExecutor(MyExecutor(), lambda: AsyncRuntime.from_env(), instance="writer")
    app = a2a_app(executor, card)                  # the card carries agent_extension("deployer-b")

    # parent deployer
    delegation = parent_runtime.delegate(parent_path, "deployer-b")
    task = await send_task(client, delegated_message("write it", delegation))
    raise_for_refusal(task)                        # A2ARefusal (a ServiceError) with its ErrorCode
    for artifact in task.artifacts:
        assert verify_artifact(artifact, consumer)  # consumer = Consumer.from_env(), or .offline(registry)

The signed bytes of an artifact (docs/spec.md, "A2A binding"): it has exactly one part, and the bytes
are that part's text as UTF-8 or its raw bytes. The receipt travels as its path JSON text under
:data:`RECEIPT_KEY` (a string, because A2A metadata is a protobuf ``Struct`` whose numbers are doubles).
The Agent Card advertises the deployer id as an A2A extension (:data:`EXTENSION_URI`, params
``{"deployer": ...}``).

Needs the ``a2a`` extra (``pip install 'countersign-mesh[a2a]'``); ``a2a`` is imported only when an A2A
object is built.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import types
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

from countersign.client.consumer import Consumer
from countersign.client.runtime import AsyncRuntime
from countersign.compact import compact_path, is_compact, path_from_compact
from countersign.consumer import EvidenceVerdict
from countersign.errors import ErrorCode, MalformedError, ServiceError
from countersign.handoff import Delegation
from countersign.integrations import kit
from countersign.records import Path

if TYPE_CHECKING:  # the a2a-sdk types, for the checker only: the module imports a2a lazily
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.types import AgentCard, AgentExtension, Artifact, Message, Task

EXTRA: Final = "a2a"
EXTENSION_URI: Final = "https://countersign.dev/a2a/v1"
# Metadata keys, namespaced by the extension's URI as A2A asks of extension data.
DELEGATION_KEY: Final = EXTENSION_URI + "/delegation"  # a task message's: the cs1. handoff string
RECEIPT_KEY: Final = EXTENSION_URI + "/receipt"  # an artifact's: the receipt path JSON, as text
ERROR_KEY: Final = EXTENSION_URI + "/error"  # a failed task's status message: {"code", "message"}
# A receipt path is a few KiB; anything far larger is refused before it is parsed.
MAX_RECEIPT_CHARS: Final = 64 * 1024


def require_a2a() -> types.ModuleType:
    """The ``a2a.types`` module; ImportError naming the extra when a2a-sdk is not installed."""
    return kit.require("a2a", EXTRA, lambda: importlib.import_module("a2a.types"))


# --- the Agent Card --------------------------------------------------------------------------------


def agent_extension(deployer: str, *, required: bool = True) -> AgentExtension:
    """The Agent Card extension that names the deployer whose signer signs this agent's artifacts.
    ``required``: the agent only runs tasks that carry a delegation (what :class:`SignedExecutor` does
    unless told otherwise)."""
    require_a2a()
    from a2a.types import AgentExtension

    extension = AgentExtension(
        uri=EXTENSION_URI,
        description=f"artifacts are signed by Countersign deployer {deployer}; send a delegation as "
        f"message metadata {DELEGATION_KEY}",
        required=required,
    )
    extension.params.update({"deployer": deployer})
    return extension


def card_deployer(card: AgentCard) -> str | None:
    """The deployer id an Agent Card advertises (None when it has no Countersign extension)."""
    for extension in card.capabilities.extensions:
        if extension.uri == EXTENSION_URI:
            deployer = extension.params.fields.get("deployer")
            if deployer is not None and deployer.WhichOneof("kind") == "string_value":
                return str(deployer.string_value)
    return None


# --- the parent's side: the task message --------------------------------------------------------


def delegated_message(text: str, delegation: Delegation | str, *, message_id: str | None = None) -> Message:
    """A user task message with ``text`` and the delegation (its handoff string) in its metadata."""
    require_a2a()
    from a2a.types import Message, Part, Role

    message = Message(role=Role.ROLE_USER, message_id=message_id or uuid.uuid4().hex, parts=[Part(text=text)])
    message.metadata.update({DELEGATION_KEY: str(delegation)})
    return message


def message_delegation(message: Message | None) -> str | None:
    """The handoff string a task message carries (None when it carries none). Raises A2ARefusal
    (``INVALID_ARGUMENT``) when the key holds something other than a string."""
    if message is None or DELEGATION_KEY not in message.metadata.fields:
        return None
    value = message.metadata.fields[DELEGATION_KEY]
    if value.WhichOneof("kind") != "string_value":
        raise A2ARefusal(ErrorCode.INVALID_ARGUMENT, f"{DELEGATION_KEY} must be a string (a cs1. handoff)")
    return str(value.string_value)


# --- the exact bytes of an artifact ----------------------------------------------------------------


def artifact_bytes(artifact: Artifact) -> bytes:
    """The bytes an artifact's receipt signs: its single part's text as UTF-8, or its raw bytes.
    Raises MalformedError for any other shape (no part, several, a URL or data part)."""
    if len(artifact.parts) != 1:
        raise MalformedError(f"a signed artifact has exactly one part, not {len(artifact.parts)}")
    (part,) = artifact.parts
    kind = part.WhichOneof("content")
    if kind == "text":
        return str(part.text).encode("utf-8")
    if kind == "raw":
        return bytes(part.raw)
    raise MalformedError(f"a signed artifact's part is text or raw bytes, not {kind}")


def artifact_receipt(artifact: Artifact) -> bytes:
    """The receipt path JSON an artifact carries, as bytes (inflated first when it is in the compact
    encoding, ``cs1z.``). Raises MalformedError when it has none, or one that is not well formed."""
    value = artifact.metadata.fields.get(RECEIPT_KEY)
    if value is None or value.WhichOneof("kind") != "string_value":
        raise MalformedError(f"the artifact carries no receipt under {RECEIPT_KEY}")
    text = str(value.string_value)
    if len(text) > MAX_RECEIPT_CHARS:
        raise MalformedError(f"the artifact's receipt is over {MAX_RECEIPT_CHARS} characters")
    if is_compact(text):
        return path_from_compact(text).to_bytes()
    return text.encode("utf-8")


# --- the child's side: the executor wrapper ------------------------------------------------------


class A2ARefusal(kit.IntegrationRefusal):
    """A refusal seen through A2A: the child refused the delegation (or could not sign), and the task
    ended ``TASK_STATE_FAILED`` with the code in its status message's metadata. A ServiceError, so the
    same ``except ServiceError`` catches it and a signer's refusal, each with its ``code``."""


RuntimeSource = AsyncRuntime | Callable[[], AsyncRuntime]


def _queue_base() -> type:
    from a2a.server.events import EventQueue

    return EventQueue


class _Signer:
    """Signs the artifacts of one task under the accepted agent record, in the order emitted.
    ``accepted``: the acceptance of the delegation; no event passes before it is done."""

    def __init__(self, runtime: AsyncRuntime, accepted: asyncio.Future[Path], instance: str, compact: bool) -> None:
        self.runtime, self.accepted, self.instance, self.compact = runtime, accepted, instance, compact

    async def sign(self, artifact: Artifact) -> None:
        agent = await self.accepted
        receipt = await self.runtime.receipt(agent, artifact_bytes(artifact), session=kit.session_of(agent))
        text = compact_path(receipt) if self.compact else receipt.to_bytes().decode("utf-8")
        artifact.metadata.update({RECEIPT_KEY: text})

    async def sign_event(self, event: Any) -> None:
        from a2a.types import Task, TaskArtifactUpdateEvent

        await asyncio.shield(self.accepted)  # the executor's events wait for the record (overlap mode)
        if isinstance(event, TaskArtifactUpdateEvent):
            if event.append:
                raise MalformedError("a signed artifact is sent whole: an appended chunk cannot be signed")
            await self.sign(event.artifact)
        elif isinstance(event, Task):
            for artifact in event.artifacts:
                if RECEIPT_KEY not in artifact.metadata.fields:
                    await self.sign(artifact)


def _signing_queue(inner: EventQueue, signer: _Signer) -> EventQueue:
    base = _queue_base()

    class SigningQueue(base):  # type: ignore[misc, valid-type]  # a2a-sdk's ABC, imported lazily
        """The executor's queue: every artifact is signed before it reaches the framework's queue."""

        async def enqueue_event(self, event: Any) -> None:
            await signer.sign_event(event)
            await inner.enqueue_event(event)

    return SigningQueue()


async def _fail(context: RequestContext, queue: EventQueue, code: ErrorCode, message: str) -> None:
    """End the task FAILED with the code as data, A2A's way of saying the agent could not do it."""
    from a2a.server.tasks import TaskUpdater
    from a2a.types import Part, Task, TaskState, TaskStatus

    task_id, context_id = context.task_id or "", context.context_id or ""
    if context.current_task is None:
        submitted = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
        await queue.enqueue_event(Task(id=task_id, context_id=context_id, status=submitted))
    updater = TaskUpdater(queue, task_id, context_id)
    status = updater.new_agent_message([Part(text=f"{code.value}: {message}")])
    status.metadata.update({ERROR_KEY: {"code": code.value, "message": message}})
    await updater.failed(status)


class SignedExecutor:
    """An A2A ``AgentExecutor`` wrapping another, so that its task runs as a delegated child agent of
    the sender. (It has the two methods; a2a-sdk checks no base class, so this module imports no a2a.)

    Before ``inner.execute`` runs, the delegation in the task message's metadata is accepted through
    this deployer's signer as agent ``instance`` (``runtime``: an AsyncRuntime, or a callable that makes
    one inside the server's event loop on first use). Every artifact the executor emits is then signed
    as an output receipt under that record and carries it under :data:`RECEIPT_KEY`. A task without a
    delegation (when ``require_delegation``), a malformed, expired or misaddressed one, or a parent
    signer's refusal ends the task ``TASK_STATE_FAILED`` with the ``ErrorCode`` under
    :data:`ERROR_KEY`; the executor does not run. ``on_accept(agent_path)``, if given, sees the record.

    ``overlap_accept``: start the executor while the delegation is being accepted (a co-signed edge is
    two signer round trips), to take that time off the task's critical path. Every event it emits waits
    for the acceptance, so nothing leaves this agent before it, and on a refusal the executor is
    cancelled; but what it does before its first event (a tool call, say) happens under a delegation
    that may yet be refused. Only for executors whose early work is safe to discard.

    ``compact_receipts``: carry each receipt in the compact encoding (``cs1z.``, docs/spec.md 19.1),
    about half the characters of its path JSON; :func:`verify_artifact` reads either.
    """

    def __init__(
        self,
        inner: AgentExecutor,
        runtime: RuntimeSource,
        *,
        instance: str,
        require_delegation: bool = True,
        ttl_ms: int = 3_600_000,
        on_accept: Callable[[Path], Awaitable[None] | None] | None = None,
        overlap_accept: bool = False,
        compact_receipts: bool = False,
    ) -> None:
        self.inner = inner
        self._runtime = kit.LazyRuntime(runtime)
        self.instance = instance
        self.require_delegation = require_delegation
        self.ttl_ms = ttl_ms
        self.on_accept = on_accept
        self.overlap_accept = overlap_accept
        self.compact_receipts = compact_receipts

    @property
    def runtime(self) -> AsyncRuntime:
        return self._runtime.get()

    async def _accept(self, context: RequestContext) -> Path:
        handoff = message_delegation(context.message)
        if handoff is None:
            raise A2ARefusal(ErrorCode.INVALID_ARGUMENT, f"the task message carries no {DELEGATION_KEY}")
        agent = await self.runtime.accept(handoff, self.instance, ttl_ms=self.ttl_ms)
        if self.on_accept is not None:
            done = self.on_accept(agent)
            if inspect.isawaitable(done):
                await done
        return agent

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        try:
            delegated = message_delegation(context.message) is not None
        except ServiceError as refusal:
            await _fail(context, event_queue, refusal.code, str(refusal))
            return
        if not delegated and not self.require_delegation:
            await self.inner.execute(context, event_queue)
            return
        accepting = asyncio.ensure_future(self._accept(context))
        if not self.overlap_accept:
            await asyncio.wait([accepting])
        queue = _signing_queue(event_queue, _Signer(self.runtime, accepting, self.instance, self.compact_receipts))
        running = None
        if not accepting.done() or accepting.exception() is None:
            running = asyncio.ensure_future(self.inner.execute(context, queue))
        try:
            await accepting
        except ServiceError as refusal:  # nothing the executor emitted has left: it waits for this
            if running is not None:
                running.cancel()
                await asyncio.wait([running])
                if not running.cancelled():
                    running.exception()  # retrieved: it is this same refusal, or its consequence
            await _fail(context, event_queue, refusal.code, str(refusal))
            return
        assert running is not None
        try:
            await running
        except MalformedError as exc:  # an artifact that cannot be signed: fail closed, typed
            await _fail(context, event_queue, ErrorCode.INVALID_ARGUMENT, str(exc))
        except ServiceError as refusal:  # the signer refused a receipt
            await _fail(context, event_queue, refusal.code, str(refusal))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self.inner.cancel(context, event_queue)


def a2a_app(executor: Any, card: AgentCard, *, rpc_url: str = "/", lifespan: Any = None) -> Any:
    """A Starlette app serving ``card`` at ``/.well-known/agent-card.json`` and A2A JSON-RPC at
    ``rpc_url``, tasks kept in memory. Run it with any ASGI server (``uvicorn``). ``lifespan``: a
    Starlette lifespan, for what the agent holds open while it serves (an MCP session, say)."""
    require_a2a()
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore
    from starlette.applications import Starlette

    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url)]
    return Starlette(routes=routes, lifespan=lifespan)


# --- any consumer's side: the finished task and its artifacts -------------------------------------


async def send_task(client: Any, message: Message) -> Task:
    """Send ``message`` with an a2a ``Client`` (non-streaming) and return the task it ended in."""
    require_a2a()
    from a2a.types import SendMessageRequest

    task: Task | None = None
    async for response in client.send_message(SendMessageRequest(message=message)):
        if response.HasField("task"):
            task = response.task
        elif response.HasField("message"):
            raise A2ARefusal(ErrorCode.INVALID_ARGUMENT, "the agent answered with a message, not a task")
    if task is None:
        raise A2ARefusal(ErrorCode.UNKNOWN, "the agent sent no task")
    return task


def task_refusal(task: Task) -> A2ARefusal | None:
    """The typed refusal a failed task carries (None unless it failed with a Countersign code)."""
    require_a2a()
    from a2a.types import TaskState

    if task.status.state != TaskState.TASK_STATE_FAILED:
        return None
    error = task.status.message.metadata.fields.get(ERROR_KEY)
    if error is None or error.WhichOneof("kind") != "struct_value":
        return A2ARefusal(ErrorCode.UNKNOWN, "the task failed without a Countersign error")
    fields = error.struct_value.fields
    code, message = fields.get("code"), fields.get("message")
    error_code = ErrorCode.of(code.string_value if code is not None else "")
    return A2ARefusal(error_code, message.string_value if message is not None else "")


def raise_for_refusal(task: Task) -> None:
    """Raise the task's :class:`A2ARefusal` if it failed; otherwise return."""
    refusal = task_refusal(task)
    if refusal is not None:
        raise refusal


def _read(artifact: Artifact) -> kit.ReadOutput:
    return lambda: (artifact_receipt(artifact), artifact_bytes(artifact))


def verify_artifact(artifact: Artifact, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """Check an artifact's receipt with ``consumer`` (online or offline, its policy applied as there)
    against the artifact's own bytes (:func:`artifact_bytes`). Accept mode consumes the receipt;
    ``audit`` nothing. An artifact without a receipt, or of another shape, is a MALFORMED verdict."""
    return kit.verify_output(_read(artifact), consumer, audit=audit)


async def averify_artifact(artifact: Artifact, consumer: Consumer, *, audit: bool = False) -> EvidenceVerdict:
    """:func:`verify_artifact` for an event loop."""
    return await kit.averify_output(_read(artifact), consumer, audit=audit)
