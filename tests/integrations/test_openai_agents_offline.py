"""The OpenAI Agents SDK binding in one process, with the real SDK, its own scripted model
(``agents.testing.ScriptedModel``) and the core's constructions standing in for the signers
(bench/workflow.py's InProcessSigning behind an asyncio face): the bytes it signs, where the evidence
travels, what a consumer sees of a changed or unsigned output, and the errors that name what is wrong."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Any

import pydantic
import pytest
from agents import Agent, ItemHelpers, RunConfig, Runner, RunResult, ToolOutputImage, ToolOutputText, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from hypothesis import given
from hypothesis import strategies as st

from bench.workflow import DEPLOYERS, InProcessSigning
from countersign.client import Consumer
from countersign.errors import ConfigError
from countersign.handoff import Delegation
from countersign.integrations import kit
from countersign.integrations.openai_agents import (
    EVIDENCE_KEY,
    RunEvidence,
    RunOutput,
    SignedItem,
    SigningHooks,
    averify_run,
    final_output_bytes,
    run_evidence_of,
    tool_output_bytes,
    verify_run,
)
from countersign.reasons import Reason
from countersign.records import Construction, Path
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

SAMPLE = SampleMesh.create(DEPLOYERS, seed=b"openai-agents-offline")
VECTORS = json.loads((FilePath(__file__).parents[1] / "vectors" / "openai-agents.json").read_text(encoding="utf-8"))
NO_TRACES = RunConfig(tracing_disabled=True)


@dataclass
class AsyncInProcess:
    """The in-process signing of the LangGraph tests, as the AsyncSigning the hooks take."""

    inner: InProcessSigning

    async def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        return self.inner.agent(deployer, instance, parent, handoff)

    async def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        return self.inner.receipt(deployer, agent, output)


def signing() -> AsyncInProcess:
    return AsyncInProcess(InProcessSigning(Construction.SIGNED_DAG, SAMPLE.signers))


def consumer() -> Consumer:
    return Consumer.offline(SAMPLE.registry)


@function_tool
def lookup(invoice: str) -> str:
    """The amount of an invoice."""
    return f"invoice {invoice}: 42 EUR"


@function_tool
def limits(currency: str) -> dict[str, Any]:
    """The refund limits in a currency."""
    return {"currency": currency, "limit": 100}


@function_tool
def policy() -> ToolOutputText:
    """The refund policy, as structured content."""
    return ToolOutputText(text="refunds within 30 days")


class Refund(pydantic.BaseModel):
    invoice: str
    amount: int


def support(structured: bool = False) -> tuple[Agent[Any], ScriptedModel]:
    """triage (hands off) -> billing (two tool calls in one turn, then its final output)."""
    final = '{"invoice": "A7", "amount": 42}' if structured else "refund 42 EUR on A7"
    billing_model = ScriptedModel([
        [
            function_call("lookup", {"invoice": "A7"}, call_id="call-1"),
            function_call("limits", {"currency": "EUR"}, call_id="call-2"),
            function_call("policy", {}, call_id="call-3"),
        ],
        [assistant_message(final)],
    ])  # fmt: skip
    billing = Agent(
        name="billing", model=billing_model, tools=[lookup, limits, policy], output_type=Refund if structured else None
    )
    triage = Agent(
        name="triage", model=ScriptedModel([[function_call("transfer_to_billing", {}, call_id="call-0")]]),
        handoffs=[billing],
    )  # fmt: skip
    return triage, billing_model


HOSTS = {"triage": "deployer-a", "billing": "deployer-b"}


def run(structured: bool = False, context: Any = None) -> RunResult:
    triage, _ = support(structured)
    context = {EVIDENCE_KEY: RunEvidence()} if context is None else context
    hooks = SigningHooks(signing(), HOSTS)
    return asyncio.run(Runner.run(triage, "invoice A7 is wrong", context=context, hooks=hooks, run_config=NO_TRACES))


def tool_items(result: RunResult) -> list[ToolCallOutputItem]:
    return [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def test_each_tool_result_and_the_final_output_is_a_receipt_under_the_agent_that_emitted_it() -> None:
    result = run()
    evidence = run_evidence_of(result.context_wrapper.context)
    assert [(s.agent, s.call_id) for s in evidence.receipts] == [
        ("billing", "call-1"), ("billing", "call-2"), ("billing", "call-3"), ("billing", None),
    ]  # fmt: skip
    assert [e.record.agent.instance for e in evidence.path.envelopes] == ["triage", "billing"]  # type: ignore[union-attr]
    assert [len(e.record.cosigs) for e in evidence.path.envelopes] == [0, 2]  # type: ignore[union-attr]
    # What is signed is what the model was given: the function_call_output's output, the dict as the SDK wrote it.
    outputs = [item.raw_item["output"] for item in tool_items(result)]  # type: ignore[index]
    structured = [{"type": "input_text", "text": "refunds within 30 days"}]
    assert outputs == ["invoice A7: 42 EUR", "{'currency': 'EUR', 'limit': 100}", structured]
    expected = [
        o.encode() if isinstance(o, str) else b'[{"text":"refunds within 30 days","type":"input_text"}]'
        for o in outputs
    ]
    for item, data in zip(tool_items(result), expected, strict=True):
        signed = evidence.receipt_of(item.call_id or "").leaf.record.output
        assert signed is not None and signed.sha256 == "sha256:" + hashlib.sha256(data).hexdigest()
    verdict = verify_run(result, consumer())
    assert verdict and [o for o, _ in verdict.outputs] == [
        RunOutput("billing", "call-1"), RunOutput("billing", "call-2"), RunOutput("billing", "call-3"),
        RunOutput("billing", None),
    ]  # fmt: skip
    assert asyncio.run(averify_run(result, consumer()))


def test_a_structured_final_output_is_signed_as_canonical_json() -> None:
    result = run(structured=True)
    assert isinstance(result.final_output, Refund)
    final = run_evidence_of(result.context_wrapper.context).final
    assert final is not None and final.receipt.leaf.record.output is not None
    expected = hashlib.sha256(b'{"amount":42,"invoice":"A7"}').hexdigest()
    assert final.receipt.leaf.record.output.sha256 == "sha256:" + expected
    assert verify_run(result, consumer())


def test_a_changed_tool_result_or_final_output_is_rejected_and_an_unsigned_one_is_malformed() -> None:
    result = run()
    tool_items(result)[0].raw_item["output"] = "invoice A7: 4200 EUR"  # type: ignore[index]
    result.final_output = "refund 4200 EUR on A7"
    verdict = verify_run(result, consumer())
    assert [(o.call_id, v.reason) for o, v in verdict.rejected] == [
        ("call-1", Reason.OUTPUT_MISMATCH), (None, Reason.OUTPUT_MISMATCH),
    ]  # fmt: skip
    # A receipt taken out of the evidence: the output it signed is now unsigned, MALFORMED, never accepted.
    evidence = run_evidence_of(result.context_wrapper.context)
    evidence.receipts[:] = [signed for signed in evidence.receipts if signed.call_id != "call-2"]
    assert [(o.call_id, v.reason) for o, v in verify_run(result, consumer()).outputs][1] == ("call-2", Reason.MALFORMED)
    # A receipt whose bytes are cut short: MALFORMED too.
    evidence.receipts[:] = [
        SignedItem(s.agent, s.call_id, s.receipt_json[:-2]) if s.call_id == "call-3" else s for s in evidence.receipts
    ]
    assert [(o.call_id, v.reason) for o, v in verify_run(result, consumer()).outputs][2] == ("call-3", Reason.MALFORMED)


def test_a_context_without_evidence_stops_the_run_before_any_model_call() -> None:
    for context in (None, {}, {"countersign": "not evidence"}):
        triage, billing_model = support()
        with pytest.raises(ConfigError, match="RunEvidence"):
            asyncio.run(
                Runner.run(triage, "x", context=context, hooks=SigningHooks(signing(), HOSTS), run_config=NO_TRACES)
            )
        assert billing_model.calls == ()
    with pytest.raises(ConfigError, match="RunEvidence"):
        run_evidence_of(object())


def test_an_agent_no_deployer_hosts_stops_the_run_before_its_model_is_called() -> None:
    triage, billing_model = support()
    hooks = SigningHooks(signing(), {"triage": "deployer-a"})
    with pytest.raises(ConfigError, match="no deployer hosts agent 'billing'"):
        asyncio.run(Runner.run(triage, "x", context={EVIDENCE_KEY: RunEvidence()}, hooks=hooks, run_config=NO_TRACES))
    assert billing_model.calls == ()


def test_an_object_context_carries_the_evidence_as_its_attribute() -> None:
    @dataclass
    class Support:
        customer: str
        countersign: RunEvidence

    result = run(context=Support("c-1", RunEvidence()))
    assert result.context_wrapper.context.countersign.final is not None
    assert verify_run(result, consumer())


def test_a_reused_context_carries_on_from_the_last_agent() -> None:
    context = {EVIDENCE_KEY: RunEvidence()}
    run(context=context)
    second = run(context=context)
    path = run_evidence_of(second.context_wrapper.context).path
    assert path is not None and [e.record.agent.instance for e in path.envelopes] == ["triage", "billing"] * 2
    assert verify_run(second, consumer())  # this run's outputs, found by call id and the latest final receipt


@given(st.text())
def test_a_text_tool_result_is_signed_as_utf8(text: str) -> None:
    assert tool_output_bytes(text) == text.encode("utf-8") == final_output_bytes(text)


def test_structured_tool_content_is_canonical_json_and_other_shapes_are_refused() -> None:
    content = [{"type": "input_text", "text": "é"}, {"type": "input_image", "image_url": "data:,"}]
    assert tool_output_bytes(content) == kit.output_bytes(content)
    assert tool_output_bytes(content).startswith(b'[{"text":"\xc3\xa9","type":"input_text"}')
    for bad in (7, {"a": 1}, None):
        with pytest.raises(TypeError):
            tool_output_bytes(bad)
    with pytest.raises(TypeError):
        final_output_bytes(object())
    with pytest.raises(TypeError):
        final_output_bytes(float("nan"))


def test_without_the_sdk_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)
    monkeypatch.delitem(sys.modules, "countersign.integrations.openai_agents")
    with pytest.raises(ImportError, match=r"pip install 'countersign-mesh\[openai-agents\]'"):
        import countersign.integrations.openai_agents  # noqa: F401


# What each tool of the vector returned in Python; the SDK turns it into the function_call_output's output.
RETURNED: dict[str, Any] = {
    "text": "invoice A7: 42.00 \u20ac",
    "stringified": {"currency": "EUR", "limit": 100},
    "structured": [
        ToolOutputText(text="refunds within 30 days"),
        ToolOutputImage(image_url="data:image/png;base64,iVBORw0KGgo=", detail="low"),
    ],
}


class Approval(pydantic.BaseModel):
    invoice: str
    amount: int
    approved: bool


@pytest.mark.parametrize("vector", VECTORS["tool_results"], ids=lambda v: v["name"])
def test_a_tool_result_signs_the_vectors_bytes(vector: dict[str, Any]) -> None:
    signed = tool_output_bytes(vector["output"])
    assert signed == vector["signed_bytes"].encode("utf-8")
    assert "sha256:" + hashlib.sha256(signed).hexdigest() == vector["sha256"]
    # The output is what the SDK itself makes of what the tool returned.
    item = ItemHelpers.tool_call_output_item(function_call("t", {}, call_id="c"), RETURNED[vector["name"]])
    assert tool_output_bytes(item["output"]) == signed


@pytest.mark.parametrize("vector", VECTORS["final_outputs"], ids=lambda v: v["name"])
def test_a_final_output_signs_the_vectors_bytes(vector: dict[str, Any]) -> None:
    value = vector["final_output"]
    signed = final_output_bytes(value)
    assert signed == vector["signed_bytes"].encode("utf-8")
    assert "sha256:" + hashlib.sha256(signed).hexdigest() == vector["sha256"]
    if isinstance(value, dict):  # the agent's output_type, as the SDK hands it over
        assert final_output_bytes(Approval.model_validate(value)) == signed


def test_a_streamed_run_is_signed_the_same_and_a_refusal_ends_its_stream() -> None:
    async def streamed(context: Any) -> Any:
        triage, _ = support()
        hooks = SigningHooks(signing(), HOSTS)
        result = Runner.run_streamed(triage, "x", context=context, hooks=hooks, run_config=NO_TRACES)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(streamed({EVIDENCE_KEY: RunEvidence()}))
    verdict = verify_run(result, consumer())
    assert verdict and [o.call_id for o, _ in verdict.outputs] == ["call-1", "call-2", "call-3", None]
    with pytest.raises(ConfigError, match="RunEvidence"):
        asyncio.run(streamed({}))
