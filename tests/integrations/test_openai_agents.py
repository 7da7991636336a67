"""OpenAI Agents SDK runs with the real package and its own scripted model (``agents.testing.ScriptedModel``:
the machine reaches no model provider), signing through real signer daemons (loopback, mTLS): a hand-off
between deployers is a co-signed delegation edge, each tool result and the final output a receipt,
checked online and offline; refusals (a parent that does not delegate there, a handoff for another
deployer, a forged one, a signer refusing a receipt) stop the run before the refused agent's model is
called or before the model sees the unsigned result; tampered outputs and receipts are rejected."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agents import Agent, RunConfig, RunContextWrapper, Runner, RunResult, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call

from countersign.client import AsyncRuntime, Consumer, ErrorCode, HandoffError, ServiceError
from countersign.integrations.kit import AsyncMeshSigning, session_of
from countersign.integrations.openai_agents import (
    EVIDENCE_KEY,
    AgentsRefusal,
    RunEvidence,
    SignedItem,
    SigningHooks,
    averify_run,
    run_evidence_of,
    verify_run,
)
from countersign.reasons import Reason
from countersign.records import Envelope, Path
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import async_runtime, mesh_registry, runtime_env

pytestmark = pytest.mark.daemons

NO_TRACES = RunConfig(tracing_disabled=True)
DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
RAN: list[str] = []


@function_tool
def lookup(invoice: str) -> str:
    """The amount of an invoice."""
    RAN.append("lookup")
    return f"invoice {invoice}: 42 EUR"


@function_tool
def limits(currency: str) -> dict[str, Any]:
    """The refund limits in a currency."""
    RAN.append("limits")
    return {"currency": currency, "limit": 100}


@dataclasses.dataclass
class Closing:
    """A run context of the application's own: the evidence, and the runtime its tool closes a session with."""

    countersign: RunEvidence
    runtime: AsyncRuntime


@function_tool
async def lookup_and_close(ctx: RunContextWrapper[Closing], invoice: str) -> str:
    """Looks the invoice up, then closes its own agent's session: its result's receipt is refused."""
    path = ctx.context.countersign.path
    assert path is not None
    await ctx.context.runtime.close_session(path, session=session_of(path))
    RAN.append("lookup_and_close")
    return f"invoice {invoice}: 42 EUR"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RAN.clear()


def support(billing_tools: list[Any] | None = None) -> tuple[Agent[Any], ScriptedModel, ScriptedModel]:
    """triage hands off to billing; billing calls two tools in one turn, then answers."""
    billing_model = ScriptedModel([
        [
            function_call("lookup", {"invoice": "A7"}, call_id="call-1"),
            function_call("limits", {"currency": "EUR"}, call_id="call-2"),
        ],
        [assistant_message("refund 42 EUR on A7")],
    ])  # fmt: skip
    if billing_tools is not None:
        billing_model = ScriptedModel([
            [function_call("lookup_and_close", {"invoice": "A7"}, call_id="call-1")], [assistant_message("never")],
        ])  # fmt: skip
    billing = Agent(name="billing", model=billing_model, tools=billing_tools or [lookup, limits])
    triage_model = ScriptedModel([[function_call("transfer_to_billing", {}, call_id="call-0")]])
    return Agent(name="triage", model=triage_model, handoffs=[billing]), triage_model, billing_model


Scenario = Callable[[dict[str, AsyncRuntime]], Awaitable[Any]]


def with_runtimes(mesh: LocalMesh, scenario: Scenario, deployers: tuple[str, ...] = DEPLOYERS) -> Any:
    """Run ``scenario`` in one event loop with an AsyncRuntime of each deployer, closed after."""

    async def run() -> Any:
        runtimes = {d: async_runtime(mesh, d) for d in deployers}
        try:
            return await scenario(runtimes)
        finally:
            for runtime in runtimes.values():
                await runtime.close()

    return asyncio.run(run())


async def signed_run(
    agent: Agent[Any],
    runtimes: dict[str, AsyncRuntime],
    hosts: dict[str, str],
    evidence: RunEvidence | None = None,
    context: object = None,
) -> RunResult:
    hooks = SigningHooks(AsyncMeshSigning(runtimes, system="support"), hosts)
    context = context or {EVIDENCE_KEY: evidence or RunEvidence()}
    return await Runner.run(agent, "invoice A7 is wrong", context=context, hooks=hooks, run_config=NO_TRACES)


def tool_items(result: RunResult) -> list[ToolCallOutputItem]:
    return [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]


def test_a_hand_off_between_deployers_is_co_signed_and_every_output_is_a_receipt(runtime_mesh: LocalMesh) -> None:
    triage, _, _ = support()

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> RunResult:
        result = await signed_run(triage, runtimes, {"triage": "deployer-a", "billing": "deployer-b"})
        async with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
            verdict = await averify_run(result, consumer)
        assert verdict, verdict.rejected
        assert [(o.agent, o.call_id) for o, _ in verdict.outputs] == [
            ("billing", "call-1"), ("billing", "call-2"), ("billing", None),
        ]  # fmt: skip
        for _, accepted in verdict.outputs:
            assert accepted.emitter is not None and accepted.emitter.deployer == "deployer-b"
            assert accepted.emitter.lineage == ("deployer-a", "deployer-b", "deployer-b")
        return result

    result = with_runtimes(runtime_mesh, scenario)
    evidence = run_evidence_of(result.context_wrapper.context)
    assert evidence.path is not None and evidence.handoff is None
    assert [e.record.deployer for e in evidence.path.envelopes] == ["deployer-a", "deployer-b"]
    assert [e.record.agent.instance for e in evidence.path.envelopes] == ["triage", "billing"]
    assert evidence.path.envelopes[0].record.agent.system == "support"
    assert len(evidence.path.leaf.record.cosigs) == 2  # the hand-off: both deployers signed the edge
    # The receipts of one agent are one session, numbered in the order signed, and sign what the model saw.
    receipts = [signed.receipt.leaf.record.output for signed in evidence.receipts]
    assert sorted(r.seq for r in receipts if r is not None) == [0, 1, 2]
    for item in tool_items(result):
        signed = evidence.receipt_of(item.call_id or "").leaf.record.output
        assert signed is not None
        assert signed.sha256 == "sha256:" + hashlib.sha256(item.raw_item["output"].encode()).hexdigest()  # type: ignore[index]
    assert RAN == ["lookup", "limits"]
    assert verify_run(result, Consumer.offline(mesh_registry(runtime_mesh)))  # offline, the same answer


def test_a_same_deployer_hand_off_is_a_local_child(runtime_mesh: LocalMesh) -> None:
    triage, _, _ = support()

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> RunResult:
        return await signed_run(triage, runtimes, {"triage": "deployer-b", "billing": "deployer-b"})

    path = run_evidence_of(with_runtimes(runtime_mesh, scenario).context_wrapper.context).path
    assert path is not None and [len(e.record.cosigs) for e in path.envelopes] == [0, 0]


def test_a_parent_that_does_not_delegate_there_stops_the_run_before_the_child_model_is_called(
    runtime_mesh: LocalMesh,
) -> None:
    triage, triage_model, billing_model = support()  # deployer-a delegates to deployer-b only

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> None:
        with pytest.raises(ServiceError) as caught:
            await signed_run(triage, runtimes, {"triage": "deployer-a", "billing": "deployer-c"})
        assert caught.value.code is ErrorCode.POLICY_REFUSED

    with_runtimes(runtime_mesh, scenario)
    assert len(triage_model.calls) == 1 and billing_model.calls == () and RAN == []


def test_a_run_started_by_another_deployers_handoff(runtime_mesh: LocalMesh) -> None:
    billing_model = ScriptedModel(
        [[function_call("lookup", {"invoice": "A7"}, call_id="call-1")], [assistant_message("ok")]]
    )
    billing = Agent(name="billing", model=billing_model, tools=[lookup])

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> RunResult:
        parent = runtimes["deployer-a"]
        handoff = await parent.delegate(await parent.root("coordinator", "support"), "deployer-b")
        # deployer-a is elsewhere: only deployer-b's runtime signs this run.
        return await signed_run(
            billing, {"deployer-b": runtimes["deployer-b"]}, {"billing": "deployer-b"},
            RunEvidence.from_handoff(str(handoff)),
        )  # fmt: skip

    result = with_runtimes(runtime_mesh, scenario)
    evidence = run_evidence_of(result.context_wrapper.context)
    assert evidence.handoff is None and evidence.path is not None  # spent by the first agent
    assert [e.record.agent.instance for e in evidence.path.envelopes] == ["coordinator", "billing"]
    verdict = verify_run(result, Consumer.offline(mesh_registry(runtime_mesh)))
    assert verdict and len(verdict.outputs) == 2


def test_a_handoff_for_another_deployer_stops_the_run_before_any_model_call(runtime_mesh: LocalMesh) -> None:
    billing_model = ScriptedModel([[assistant_message("never")]])
    billing = Agent(name="billing", model=billing_model)

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> None:
        parent = runtimes["deployer-a"]
        handoff = await parent.delegate(await parent.root("coordinator", "support"), "deployer-b")
        with pytest.raises(ServiceError) as caught:  # the run's first agent is hosted by deployer-c
            await signed_run(billing, runtimes, {"billing": "deployer-c"}, RunEvidence.from_handoff(handoff))
        assert isinstance(caught.value, AgentsRefusal) and isinstance(caught.value.__cause__, HandoffError)
        assert caught.value.code is ErrorCode.GRANT_WRONG_CHILD
        # A handoff rewritten to name deployer-c: deployer-a's signer, asked to co-sign, refuses it.
        forged = dataclasses.replace(handoff, grant=dataclasses.replace(handoff.grant, child_deployer="deployer-c"))
        with pytest.raises(ServiceError) as refused:
            await signed_run(billing, runtimes, {"billing": "deployer-c"}, RunEvidence.from_handoff(forged))
        assert refused.value.code is ErrorCode.PARENT_REFUSED

    with_runtimes(runtime_mesh, scenario)
    assert billing_model.calls == ()


def test_a_receipt_the_signer_refuses_stops_the_run_before_the_model_sees_the_result(runtime_mesh: LocalMesh) -> None:
    triage, _, billing_model = support(billing_tools=[lookup_and_close])

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> None:
        with pytest.raises(ServiceError) as caught:
            await signed_run(
                triage, runtimes, {"triage": "deployer-a", "billing": "deployer-b"},
                context=Closing(RunEvidence(), runtimes["deployer-b"]),
            )  # fmt: skip
        # Typed, not the SDK's UserError that wraps other errors of a tool's phase.
        assert isinstance(caught.value, AgentsRefusal) and caught.value.code is ErrorCode.SESSION_CLOSED

    with_runtimes(runtime_mesh, scenario)
    assert RAN == ["lookup_and_close"]  # the tool ran; its result was never given to the model
    assert len(billing_model.calls) == 1 and billing_model.remaining_steps == 1


def _rewritten(signed: SignedItem) -> SignedItem:
    """``signed`` with its receipt's output hash rewritten to claim other bytes."""
    leaf = signed.receipt.leaf
    record_json = leaf.to_json()["record"]
    record_json["output"]["sha256"] = "sha256:" + "0" * 64  # type: ignore[index, call-overload]
    tampered = Envelope.from_json({"record": record_json, "key_id": leaf.key_id, "sig": leaf.sig})
    return SignedItem.of(signed.agent, signed.call_id, Path((*signed.receipt.envelopes[:-1], tampered)))


def test_tampered_outputs_and_receipts_are_rejected(runtime_mesh: LocalMesh) -> None:
    triage, _, _ = support()

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> RunResult:
        return await signed_run(triage, runtimes, {"triage": "deployer-a", "billing": "deployer-b"})

    result = with_runtimes(runtime_mesh, scenario)
    registry = mesh_registry(runtime_mesh)  # a fresh offline consumer for each check below
    evidence = run_evidence_of(result.context_wrapper.context)
    honest = list(evidence.receipts)
    second = next(i for i, signed in enumerate(honest) if signed.call_id == "call-2")  # parallel calls: either order
    evidence.receipts[second] = _rewritten(honest[second])
    assert [(o.call_id, v.reason) for o, v in verify_run(result, Consumer.offline(registry)).rejected] == [
        ("call-2", Reason.BAD_SIGNATURE)
    ]
    evidence.receipts[:] = honest
    tool_items(result)[0].raw_item["output"] = "invoice A7: 4200 EUR"  # type: ignore[index]
    result.final_output = "refund 4200 EUR on A7"
    with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
        online = verify_run(result, consumer, audit=True)
    assert [(o.call_id, v.reason) for o, v in online.rejected] == [
        ("call-1", Reason.OUTPUT_MISMATCH), (None, Reason.OUTPUT_MISMATCH),
    ]  # fmt: skip


def test_accept_mode_consumes_each_receipt(runtime_mesh: LocalMesh) -> None:
    triage, _, _ = support()

    async def scenario(runtimes: dict[str, AsyncRuntime]) -> RunResult:
        return await signed_run(triage, runtimes, {"triage": "deployer-a", "billing": "deployer-b"})

    result = with_runtimes(runtime_mesh, scenario)
    with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
        assert verify_run(result, consumer)
        again = verify_run(result, consumer)
    assert [v.reason for _, v in again.outputs] == [Reason.NONCE_REPLAYED] * 3
