"""LangGraph graphs with the real library, signing through real signer daemons (loopback, mTLS):
sync and async graphs end to end, refusals a LangGraph user catches as typed errors, and a tampered
final state rejected by the consumer-side check."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.graph import END, START, StateGraph

from countersign.client import AsyncRuntime, Consumer, ErrorCode, HandoffError, Runtime, ServiceError
from countersign.integrations.langgraph import (
    AsyncMeshSigning,
    Evidence,
    EvidenceState,
    MeshSigning,
    SignedOutput,
    averify_state,
    signed_node,
    verify_state,
)
from countersign.reasons import Reason
from countersign.records import Envelope, Path
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import async_runtime, mesh_registry, runtime_env

pytestmark = pytest.mark.daemons

Make = Callable[[str], Runtime]
RAN: list[str] = []


class Research(EvidenceState):
    topic: str
    plan: str
    notes: str
    draft: str


def planner(state: Research) -> dict[str, str]:
    RAN.append("planner")
    return {"plan": f"plan for {state['topic']}"}


def researcher(state: Research) -> dict[str, str]:
    RAN.append("researcher")
    return {"notes": f"notes on {state['plan']}"}


def writer(state: Research) -> dict[str, str]:
    RAN.append("writer")
    return {"draft": f"draft from {state['notes']}"}


async def aresearcher(state: Research) -> dict[str, str]:
    await asyncio.sleep(0)
    return {"notes": f"notes on {state['topic']}"}


async def awriter(state: Research) -> dict[str, str]:
    return {"draft": f"draft from {state['notes']}"}


def chain(nodes: list[tuple[str, Any]]) -> Any:
    graph = StateGraph(Research)
    for name, node in nodes:
        graph.add_node(name, node)
    names = [START, *(name for name, _ in nodes), END]
    for first, second in itertools.pairwise(names):
        graph.add_edge(first, second)
    return graph.compile()


def research_graph(signing: MeshSigning, writer_on: str = "deployer-c") -> Any:
    return chain([
        ("planner", signed_node(planner, "deployer-a", signing)),
        ("researcher", signed_node(researcher, "deployer-b", signing)),
        ("writer", signed_node(writer, writer_on, signing)),
    ])  # fmt: skip


@pytest.fixture
def signing(runtime: Make) -> MeshSigning:
    return MeshSigning({d: runtime(d) for d in ("deployer-a", "deployer-b", "deployer-c")}, system="research")


def test_a_sync_graph_signs_every_node_and_co_signs_each_hand_off(
    signing: MeshSigning, runtime_mesh: LocalMesh
) -> None:
    final = research_graph(signing).invoke({"topic": "bridges"})
    evidence = final["countersign"]
    assert isinstance(evidence, Evidence) and evidence.handoff is None
    assert [e.record.deployer for e in evidence.path.envelopes] == ["deployer-a", "deployer-b", "deployer-c"]
    assert [e.record.agent.instance for e in evidence.path.envelopes] == ["planner", "researcher", "writer"]
    assert all(len(e.record.cosigs) == 2 for e in evidence.path.envelopes[1:])  # both hand-offs co-signed
    assert [(s.node, s.keys) for s in evidence.receipts] == [
        ("planner", ("plan",)), ("researcher", ("notes",)), ("writer", ("draft",)),
    ]  # fmt: skip
    writer_receipt = evidence.receipt_of("writer")
    assert writer_receipt.envelopes[:-1] == evidence.path.envelopes
    signed_hash = writer_receipt.leaf.record.output.sha256
    assert signed_hash == "sha256:" + hashlib.sha256(final["draft"].encode()).hexdigest()
    with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
        verdict = verify_state(final, consumer)
    assert verdict and not verdict.rejected
    assert [v.emitter.deployer for _, v in verdict.outputs if v.emitter] == ["deployer-a", "deployer-b", "deployer-c"]
    assert verify_state(final, Consumer.offline(mesh_registry(runtime_mesh)))  # offline, the same answer


def test_a_same_deployer_hand_off_is_a_local_child(signing: MeshSigning) -> None:
    final = research_graph(signing, writer_on="deployer-b").invoke({"topic": "tunnels"})
    writer_record = final["countersign"].path.leaf.record
    assert writer_record.deployer == "deployer-b" and writer_record.cosigs == ()


def test_an_async_graph_signs_through_the_asyncio_runtimes(runtime_mesh: LocalMesh) -> None:
    async def scenario() -> None:
        runtimes: dict[str, AsyncRuntime] = {d: async_runtime(runtime_mesh, d) for d in ("deployer-b", "deployer-c")}
        signing = AsyncMeshSigning(runtimes, system="async-research")
        graph = chain([
            ("researcher", signed_node(aresearcher, "deployer-b", signing)),
            ("writer", signed_node(awriter, "deployer-c", signing)),
        ])  # fmt: skip
        final = await graph.ainvoke({"topic": "tides"})
        async with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
            verdict = await averify_state(final, consumer)
        for runtime in runtimes.values():
            await runtime.close()
        assert verdict and len(verdict.outputs) == 2
        assert final["countersign"].path.envelopes[0].record.agent.system == "async-research"

    asyncio.run(scenario())


def test_a_sync_graph_runs_under_ainvoke_too(signing: MeshSigning, runtime_mesh: LocalMesh) -> None:
    final = asyncio.run(research_graph(signing).ainvoke({"topic": "canals"}))
    assert verify_state(final, Consumer.offline(mesh_registry(runtime_mesh)))


def test_a_graph_started_by_another_deployers_handoff(runtime: Make, runtime_mesh: LocalMesh) -> None:
    parent = runtime("deployer-a")
    handoff = str(parent.delegate(parent.root("coordinator", "research"), "deployer-b"))
    signing = MeshSigning({d: runtime(d) for d in ("deployer-b", "deployer-c")})  # deployer-a is elsewhere
    graph = chain([
        ("researcher", signed_node(researcher, "deployer-b", signing)),
        ("writer", signed_node(writer, "deployer-c", signing)),
    ])  # fmt: skip
    final = graph.invoke({"topic": "ports", "plan": "given", "countersign": Evidence.from_handoff(handoff)})
    evidence = final["countersign"]
    assert evidence.handoff is None  # spent by the first node
    assert [e.record.agent.instance for e in evidence.path.envelopes] == ["coordinator", "researcher", "writer"]
    assert verify_state(final, Consumer.offline(mesh_registry(runtime_mesh)))


def test_a_handoff_for_another_child_stops_the_graph_with_a_typed_error(runtime: Make) -> None:
    parent = runtime("deployer-a")
    handoff = parent.delegate(parent.root("coordinator", "research"), "deployer-b")
    signing = MeshSigning({"deployer-c": runtime("deployer-c")})
    graph = chain([("writer", signed_node(writer, "deployer-c", signing))])
    RAN.clear()
    with pytest.raises(ServiceError) as caught:
        graph.invoke({"topic": "x", "notes": "n", "countersign": Evidence.from_handoff(handoff)})
    assert isinstance(caught.value, HandoffError) and caught.value.code is ErrorCode.GRANT_WRONG_CHILD
    assert RAN == []  # the node did not run


def test_a_handoff_rewritten_for_another_child_is_refused_by_the_parent(runtime: Make) -> None:
    parent = runtime("deployer-b")
    handoff = parent.delegate(parent.root("coordinator", "research"), "deployer-c")
    forged = dataclasses.replace(handoff, grant=dataclasses.replace(handoff.grant, child_deployer="deployer-a"))
    graph = chain([("planner", signed_node(planner, "deployer-a", MeshSigning({"deployer-a": runtime("deployer-a")})))])
    with pytest.raises(ServiceError) as caught:
        graph.invoke({"topic": "x", "countersign": Evidence.from_handoff(str(forged))})
    assert caught.value.code is ErrorCode.PARENT_REFUSED


def test_an_expired_handoff_stops_the_graph_before_any_call(runtime: Make, nowhere: str) -> None:
    parent = runtime("deployer-a")
    handoff = parent.delegate(parent.root("coordinator", "research"), "deployer-b", ttl_ms=1)
    unreachable = Runtime(nowhere, parent.tls, "deployer-b")  # a call would be UNAVAILABLE
    graph = chain([("researcher", signed_node(researcher, "deployer-b", MeshSigning({"deployer-b": unreachable})))])
    RAN.clear()
    with pytest.raises(ServiceError) as caught:
        graph.invoke({"topic": "x", "plan": "p", "countersign": Evidence.from_handoff(handoff)})
    unreachable.close()
    assert caught.value.code is ErrorCode.GRANT_EXPIRED and RAN == []


def test_a_parent_that_refuses_stops_the_graph_before_the_child_runs(signing: MeshSigning) -> None:
    graph = chain([
        ("planner", signed_node(planner, "deployer-a", signing)),
        ("writer", signed_node(writer, "deployer-c", signing)),  # deployer-a delegates only to deployer-b
    ])  # fmt: skip
    RAN.clear()
    with pytest.raises(ServiceError) as caught:
        graph.invoke({"topic": "x", "notes": "n"})
    assert caught.value.code is ErrorCode.POLICY_REFUSED
    assert RAN == ["planner"]


def test_a_tampered_receipt_or_output_in_the_final_state_is_rejected(
    signing: MeshSigning, runtime_mesh: LocalMesh
) -> None:
    final = research_graph(signing).invoke({"topic": "bridges"})
    registry = mesh_registry(runtime_mesh)  # a fresh offline consumer for each check below
    evidence: Evidence = final["countersign"]
    # A receipt whose signed output hash was rewritten (to claim other bytes) no longer verifies.
    writer_signed = evidence.receipts[-1]
    leaf = writer_signed.receipt.leaf
    record_json = leaf.to_json()["record"]
    record_json["output"]["sha256"] = "sha256:" + "0" * 64  # type: ignore[index, call-overload]
    tampered_leaf = Envelope.from_json({"record": record_json, "key_id": leaf.key_id, "sig": leaf.sig})
    tampered_path = Path((*writer_signed.receipt.envelopes[:-1], tampered_leaf))
    tampered = {
        **final,
        "countersign": dataclasses.replace(
            evidence,
            receipts=(*evidence.receipts[:-1], SignedOutput.of(writer_signed.node, writer_signed.keys, tampered_path)),
        ),
    }
    verdict = verify_state(tampered, Consumer.offline(registry))
    assert not verdict
    assert [(s.node, v.reason) for s, v in verdict.rejected] == [("writer", Reason.BAD_SIGNATURE)]
    # The output itself changed after signing: the receipt no longer matches the state's bytes.
    changed = verify_state({**final, "notes": final["notes"] + "!"}, Consumer.offline(registry))
    assert [(s.node, v.reason) for s, v in changed.rejected] == [("researcher", Reason.OUTPUT_MISMATCH)]
    with Consumer.from_env(runtime_env(runtime_mesh, None)) as consumer:
        online = verify_state({**final, "plan": "another plan"}, consumer, audit=True)
    assert [(s.node, v.reason) for s, v in online.rejected] == [("planner", Reason.OUTPUT_MISMATCH)]
