"""An OpenAI Agents SDK run across two deployers: a triage agent hands off to a billing agent.

The triage agent runs on deployer-a, the billing agent on deployer-b. The hand-off between them is a
co-signed delegation edge (deployer-a's signer opens a grant, deployer-b's signer accepts it); each
tool result the billing agent is given, and its final answer, is a receipt. The consumer checks every
output of the finished run, then shows that a tool result changed afterwards is rejected.

The models are the SDK's own scripted model (``agents.testing.ScriptedModel``), so the example runs
without a model provider; put ``model="gpt-5"`` (or any model of yours) in their place and nothing else
changes.

    python examples/openai_agents_support.py   # on the mesh COUNTERSIGN_MESH names, else a private local one

Needs ``pip install 'countersign-mesh[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from example_mesh import MeshSettings, the_mesh

from countersign.client import AsyncRuntime, Consumer
from countersign.integrations.kit import AsyncMeshSigning
from countersign.integrations.openai_agents import RunEvidence, SigningHooks, averify_run


@function_tool
def invoice_amount(invoice: str) -> str:
    """The amount of an invoice."""
    return f"invoice {invoice}: 42.00 EUR"


@function_tool
def refund_limit(currency: str) -> str:
    """The largest refund billing may grant without review."""
    return f"100.00 {currency}"


def support_agents() -> Agent[Any]:
    """triage -> billing; billing asks both tools in one turn, then answers."""
    billing = Agent(
        name="billing",
        instructions="Settle billing questions with the tools.",
        tools=[invoice_amount, refund_limit],
        model=ScriptedModel([
            [function_call("invoice_amount", {"invoice": "A7"}, call_id="call-1"),
             function_call("refund_limit", {"currency": "EUR"}, call_id="call-2")],
            [assistant_message("Refund of 42.00 EUR on invoice A7 approved.")],
        ]),
    )  # fmt: skip
    return Agent(
        name="triage",
        instructions="Hand billing questions to billing.",
        handoffs=[billing],
        model=ScriptedModel([[function_call("transfer_to_billing", {}, call_id="call-0")]]),
    )


async def main(runtimes: dict[str, AsyncRuntime], consumer: Consumer) -> int:
    signing = AsyncMeshSigning(runtimes, system="support")
    hooks = SigningHooks(signing, hosts={"triage": "deployer-a", "billing": "deployer-b"})
    context = {"countersign": RunEvidence()}
    result = await Runner.run(
        support_agents(), "Invoice A7 charged me twice.", context=context, hooks=hooks,
        run_config=RunConfig(tracing_disabled=True),
    )  # fmt: skip
    print("final output:", result.final_output)
    path = context["countersign"].path
    assert path is not None
    print("lineage:", " -> ".join(f"{e.record.agent.instance}@{e.record.deployer}" for e in path.envelopes))
    verdict = await averify_run(result, consumer, audit=True)
    for output, each in verdict.outputs:
        what = f"tool result {output.call_id}" if output.call_id else "final output"
        print(f"verified {what}: {each.result.verdict} emitted by", each.emitter and each.emitter.deployer)
    # A tool result changed after it was signed no longer matches its receipt.
    first = next(item for item in result.new_items if isinstance(item, ToolCallOutputItem))
    first.raw_item["output"] = "invoice A7: 4200.00 EUR"  # type: ignore[index]
    tampered = await averify_run(result, consumer, audit=True)
    print("tampered tool result:", [each.reason.value for _, each in tampered.rejected if each.reason])
    return 0 if verdict and not tampered else 1


async def on_mesh(mesh: MeshSettings) -> int:
    runtimes = {d: mesh.async_runtime(d) for d in ("deployer-a", "deployer-b")}
    async with mesh.consumer() as consumer:
        code = await main(runtimes, consumer)
    for runtime in runtimes.values():
        await runtime.close()
    return code


if __name__ == "__main__":
    with the_mesh() as mesh:
        code = asyncio.run(on_mesh(mesh))
    sys.exit(code)
