"""OpenAI Agents SDK: each agent of a run gets its record, each hand-off between deployers is a co-signed
delegation edge, and each tool result and final output is a receipt.

Name the deployer that hosts each agent, and run with :class:`SigningHooks` and a context carrying a
:class:`RunEvidence`::

    signing = AsyncMeshSigning({"deployer-a": triage_runtime, "deployer-b": billing_runtime}, system="support")
    hooks = SigningHooks(signing, hosts={"triage": "deployer-a", "billing": "deployer-b"})
    result = await Runner.run(triage, "my invoice is wrong", context={"countersign": RunEvidence()}, hooks=hooks)
    verdict = await averify_run(result, consumer)       # consumer: countersign.client.Consumer

When an agent starts (the run's first, or one handed off to), it obtains its agent record before its
model is called: a root for the run's first agent, a same-deployer child when the agent before it ran
on the same deployer, and otherwise a co-signed delegation (the previous agent's deployer opens a grant,
this agent's deployer obtains the parent's co-signature). A run started by another deployer's handoff
(:meth:`RunEvidence.from_handoff`) has its first agent accept that delegation. After each function
tool returns, its result, exactly as the model is given it (the ``output`` of the
``function_call_output`` item: :func:`tool_output_bytes`), is signed as a receipt under the agent that
called it; the final output is signed when the agent produces it (:func:`final_output_bytes`). A
refusal fails closed: the error (an :class:`AgentsRefusal`, a ServiceError with its ``code``) leaves
``Runner.run`` before the refused agent's model is called, or before the model sees the unsigned tool
result, or before the caller sees the unsigned final output.

The evidence travels in the run's context (the SDK's place for what the application's own code
shares, never sent to the model): a mapping context holds a :class:`RunEvidence` under
:data:`EVIDENCE_KEY`, any other context as its ``countersign`` attribute. A consumer checks a finished
run with :func:`verify_run` / :func:`averify_run` (docs/spec.md section 22).

Needs the ``openai-agents`` extra (``pip install 'countersign-mesh[openai-agents]'``); importing this
module imports the SDK (its hooks are a subclass of the SDK's ``RunHooks``) and raises an ImportError
naming the extra without it. Built on :mod:`countersign.integrations.kit`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from countersign.client.consumer import Consumer
from countersign.consumer import EvidenceVerdict
from countersign.errors import ConfigError, MalformedError, ServiceError
from countersign.handoff import Delegation
from countersign.integrations import kit
from countersign.records import Path

EXTRA: Final = "openai-agents"
EVIDENCE_KEY: Final = "countersign"


def require_agents() -> Any:
    """The ``agents`` module (the OpenAI Agents SDK); ImportError naming the extra without it."""
    return kit.require("openai_agents", EXTRA, lambda: importlib.import_module("agents"))


require_agents()

from agents import Agent, AgentsException, ItemHelpers, RunContextWrapper, RunHooks, Tool  # noqa: E402  # after the named error
from agents.items import ToolCallOutputItem  # noqa: E402
from agents.result import RunResultBase  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

# --- the signed bytes ---------------------------------------------------------------------------


def tool_output_bytes(output: object) -> bytes:
    """The bytes a tool result's receipt signs: the ``output`` member of its ``function_call_output``
    item (what the model is given), as UTF-8 when it is a string (the SDK's form of any plain value),
    or as RFC 8785 canonical JSON when it is a list of structured content items. Raises TypeError."""
    if not isinstance(output, str | list):
        raise TypeError(f"a function_call_output's output is a string or a list, not {type(output).__name__}")
    return kit.output_bytes(output)


def final_output_bytes(output: object) -> bytes:
    """The bytes a final output's receipt signs: a ``str`` as UTF-8; a structured output (the agent's
    ``output_type``: a pydantic model, a dataclass, a list, ...) as RFC 8785 canonical JSON of its JSON
    form (pydantic's ``mode="json"`` dump). Raises TypeError for a value with no JSON form."""
    if isinstance(output, str | bytes):
        return kit.output_bytes(output)
    import pydantic  # the SDK's own dependency
    import pydantic_core

    try:
        dumped = pydantic.TypeAdapter(type(output)).dump_python(output, mode="json")
    except (pydantic.PydanticSchemaGenerationError, pydantic_core.PydanticSerializationError) as exc:
        raise TypeError(f"a final output must have a JSON form to be signed ({exc})") from None
    return kit.output_bytes(dumped)


# --- the evidence in the run's context ----------------------------------------------------------


@dataclass(frozen=True)
class SignedItem:
    """One receipt of a run: the agent that emitted it, the tool call whose result it signs (None for
    the final output), and the receipt path as canonical path JSON (:attr:`receipt` parses it,
    strictly, once)."""

    agent: str
    call_id: str | None
    receipt_json: bytes

    @classmethod
    def of(cls, agent: str, call_id: str | None, receipt: Path) -> SignedItem:
        signed = cls(agent, call_id, receipt.to_bytes())
        signed.__dict__["receipt"] = receipt
        return signed

    @functools.cached_property
    def receipt(self) -> Path:
        """The receipt path. Raises MalformedError when the stored bytes are not one."""
        return Path.from_bytes(self.receipt_json)


@dataclass
class RunEvidence:
    """What a run's context carries: :attr:`path`, the record of the agent running now (the parent of
    the next agent's); ``receipts``, every :class:`SignedItem` in the order signed; :attr:`handoff`,
    another deployer's delegation for the run's first agent to accept, spent once it is. A context
    reused for the next run carries on from the last agent's record."""

    path: Path | None = None
    receipts: list[SignedItem] = field(default_factory=list)
    handoff: Delegation | None = None

    @classmethod
    def from_handoff(cls, handoff: Delegation | str) -> RunEvidence:
        """Start a run under another deployer's delegation (parsed strictly if a string; raises
        :class:`countersign.client.HandoffError`)."""
        return cls(handoff=Delegation.from_string(handoff) if isinstance(handoff, str) else handoff)

    def receipt_of(self, call_id: str) -> Path:
        """The receipt of tool call ``call_id``. Raises KeyError if none was signed."""
        for signed in reversed(self.receipts):
            if signed.call_id == call_id:
                return signed.receipt
        raise KeyError(call_id)

    @property
    def final(self) -> SignedItem | None:
        """The receipt of the latest final output (None before one is signed)."""
        return next((signed for signed in reversed(self.receipts) if signed.call_id is None), None)


def run_evidence_of(context: object) -> RunEvidence:
    """The :class:`RunEvidence` a run context carries (a mapping's :data:`EVIDENCE_KEY`, or the
    ``countersign`` attribute). Raises ConfigError when it carries none: a run is signed only with one."""
    found = context.get(EVIDENCE_KEY) if isinstance(context, Mapping) else getattr(context, EVIDENCE_KEY, None)
    if not isinstance(found, RunEvidence):
        raise ConfigError(
            f"the run's context must carry a RunEvidence under {EVIDENCE_KEY!r} "
            f"(Runner.run(..., context={{{EVIDENCE_KEY!r}: RunEvidence()}})), not {type(found).__name__}"
        )
    return found


# --- the hooks: who signs what, when -----------------------------------------------------------


class AgentsRefusal(kit.IntegrationRefusal, AgentsException):
    """A refusal met while signing a run (a signer refusing an agent record, a delegation or a
    receipt; a handoff that cannot be accepted): a ServiceError with the refusal's code (the original
    error is its ``__cause__``), and an ``AgentsException``, so that the SDK lets it leave
    ``Runner.run`` as it is (it wraps other errors of a tool's phase in its ``UserError``)."""


async def _refusing(call: Awaitable[Path]) -> Path:
    try:
        return await call
    except ServiceError as exc:
        raise AgentsRefusal(exc.code, str(exc), retryable=exc.retryable) from exc


class SigningHooks(RunHooks[Any]):
    """The run hooks that sign (see the module docstring): ``signing`` is the mesh (an
    :class:`~countersign.integrations.kit.AsyncMeshSigning`, or anything implementing
    :class:`~countersign.integrations.kit.AsyncSigning`), ``hosts`` maps each agent's name to the
    deployer that hosts it. The agent's name is its instance in its record. To add hooks of your own,
    subclass this and call ``super()``. Every method raises :class:`AgentsRefusal` (a ServiceError: a
    refusal, with its code) or ConfigError (an agent no deployer hosts, a context without evidence):
    the run stops there."""

    def __init__(self, signing: kit.AsyncSigning, hosts: Mapping[str, str]) -> None:
        self.signing = signing
        self.hosts = dict(hosts)

    def deployer_of(self, agent: Agent[Any]) -> str:
        deployer = self.hosts.get(agent.name)
        if deployer is None:
            raise ConfigError(f"no deployer hosts agent {agent.name!r}; hosts name {sorted(self.hosts)}")
        return deployer

    def _running(self, context: RunContextWrapper[Any], agent: Agent[Any]) -> tuple[RunEvidence, Path]:
        evidence = run_evidence_of(context.context)
        if evidence.path is None or evidence.path.leaf.record.agent.instance != agent.name:
            raise ConfigError(f"agent {agent.name!r} emitted an output before it obtained its record")
        return evidence, evidence.path

    async def on_agent_start(self, context: RunContextWrapper[Any], agent: Agent[Any]) -> None:
        evidence = run_evidence_of(context.context)
        deployer = self.deployer_of(agent)
        record = await _refusing(self.signing.agent(deployer, agent.name, evidence.path, evidence.handoff))
        evidence.path, evidence.handoff = record, None

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: object) -> None:
        if not isinstance(context, ToolContext) or context.tool_call is None:
            raise ConfigError(f"tool {tool.name!r} is not a function tool: its result cannot be signed")
        evidence, path = self._running(context, agent)
        item = ItemHelpers.tool_call_output_item(
            context.tool_call, result, output_json_schema=getattr(tool, "output_json_schema", None)
        )
        output = tool_output_bytes(item["output"])
        receipt = await _refusing(self.signing.receipt(self.deployer_of(agent), path, output))
        evidence.receipts.append(SignedItem.of(agent.name, context.tool_call_id, receipt))

    async def on_agent_end(self, context: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> None:
        evidence, path = self._running(context, agent)
        receipt = await _refusing(self.signing.receipt(self.deployer_of(agent), path, final_output_bytes(output)))
        evidence.receipts.append(SignedItem.of(agent.name, None, receipt))


# --- the consumer's check of a finished run -----------------------------------------------------


@dataclass(frozen=True)
class RunOutput:
    """An output of a run: the agent that emitted it and the tool call it answers (None: the final
    output)."""

    agent: str
    call_id: str | None


@dataclass(frozen=True)
class RunVerdict(kit.OutputVerdicts[RunOutput]):
    """The verdicts on every output of a run, each tool result in the order of the run's items and
    then the final output, each the one verdict shape beside the output it is for. Truthy only when
    there is at least one and every one was accepted."""

    outputs: tuple[tuple[RunOutput, EvidenceVerdict], ...]


def _tool_read(evidence: RunEvidence, item: ToolCallOutputItem) -> kit.ReadOutput:
    def read() -> tuple[bytes, bytes]:
        raw = item.raw_item
        if not isinstance(raw, Mapping) or raw.get("type") != "function_call_output":
            raise MalformedError("only a function tool's result is signed under this binding")
        call_id = raw.get("call_id")
        signed = next((s for s in reversed(evidence.receipts) if s.call_id == call_id), None)
        if signed is None:
            raise MalformedError(f"tool call {call_id!r} has no receipt in the run's evidence")
        try:
            return signed.receipt_json, tool_output_bytes(raw.get("output"))
        except TypeError as exc:
            raise MalformedError(str(exc)) from None

    return read


def _final_read(evidence: RunEvidence, output: object) -> kit.ReadOutput:
    def read() -> tuple[bytes, bytes]:
        signed = evidence.final
        if signed is None:
            raise MalformedError("the final output has no receipt in the run's evidence")
        try:
            return signed.receipt_json, final_output_bytes(output)
        except TypeError as exc:
            raise MalformedError(str(exc)) from None

    return read


def _reads(result: RunResultBase) -> list[tuple[RunOutput, kit.ReadOutput]]:
    """Every output the consumer holds (each tool result item, then the final output), each with the
    read of its receipt and bytes. An output without a receipt reads as MALFORMED."""
    evidence = run_evidence_of(result.context_wrapper.context)
    reads: list[tuple[RunOutput, kit.ReadOutput]] = []
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            reads.append((RunOutput(item.agent.name, item.call_id), _tool_read(evidence, item)))
    if result.final_output is not None:
        reads.append((RunOutput(result.last_agent.name, None), _final_read(evidence, result.final_output)))
    return reads


def verify_run(result: RunResultBase, consumer: Consumer, *, audit: bool = False) -> RunVerdict:
    """Check every tool result and the final output of a finished run with ``consumer`` (online or
    offline, its policy applied as there), each against the bytes the result holds now, so an output
    changed after it was signed is ``OUTPUT_MISMATCH`` and one without a receipt ``MALFORMED``. Accept
    mode consumes each receipt; ``audit`` nothing. Raises ConfigError when the run's context carries
    no evidence, ServiceError when a verifier refuses."""
    return RunVerdict(tuple((out, kit.verify_output(read, consumer, audit=audit)) for out, read in _reads(result)))


async def averify_run(result: RunResultBase, consumer: Consumer, *, audit: bool = False) -> RunVerdict:
    """:func:`verify_run` for an event loop."""
    outputs = [(out, await kit.averify_output(read, consumer, audit=audit)) for out, read in _reads(result)]
    return RunVerdict(tuple(outputs))
