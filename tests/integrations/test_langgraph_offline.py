"""The LangGraph wrapper in one process, with the real library and the core's constructions standing in
for the signers (bench/workflow.py's InProcessSigning): the evidence it puts in the state, the bytes it
signs, Command updates, the reducer, and the errors that name what is wrong."""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from bench.workflow import DEPLOYERS, InProcessSigning, Research, build, planner
from countersign.client import Consumer
from countersign.errors import MalformedError
from countersign.integrations import langgraph as integration
from countersign.integrations.langgraph import (
    CHECKPOINT_TYPES,
    Evidence,
    EvidenceState,
    MeshSigning,
    SignedOutput,
    averify_state,
    merge_evidence,
    signed_node,
    state_output_bytes,
    verify_state,
)
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.records import Construction
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

SAMPLE = SampleMesh.create(DEPLOYERS, seed=b"langgraph-offline")


def sample_consumer() -> Consumer:
    """A consumer of its own (its own nonce state) checking against the sample mesh's registry."""
    return Consumer.offline(SAMPLE.registry)


def in_process(construction: Construction = Construction.SIGNED_DAG) -> InProcessSigning:
    return InProcessSigning(construction, SAMPLE.signers)


@pytest.mark.parametrize("construction", [Construction.LINKED_LIST, Construction.SIGNED_DAG])
def test_the_research_graph_verifies_against_the_registry(construction: Construction) -> None:
    final = build(in_process(construction)).invoke({"topic": "locks"})
    verdict = verify_state(final, sample_consumer())
    assert verdict and [s.node for s, _ in verdict.outputs] == ["planner", "researcher", "writer"]
    cosigned = [len(e.record.cosigs) for e in final["countersign"].path.envelopes]
    assert cosigned == ([0, 2, 2] if construction is Construction.SIGNED_DAG else [0, 0, 0])


def test_a_consumer_policy_is_applied_to_every_receipt_of_the_state() -> None:
    final = build(in_process()).invoke({"topic": "locks"})
    two = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-a", "deployer-b"]}}')
    verdict = verify_state(final, Consumer.offline(SAMPLE.registry, consumer_policy=two))
    refused = [(s.node, v.reason, v.result.index) for s, v in verdict.rejected]
    assert not verdict and refused == [("writer", Reason.CONSUMER_POLICY_VIOLATION, 2)]

    async def asynchronously() -> bool:
        return bool(await averify_state(final, Consumer.offline(SAMPLE.registry, consumer_policy=two)))

    assert asyncio.run(asynchronously()) is False


def test_an_output_changed_in_the_final_state_is_rejected() -> None:
    final = build(in_process()).invoke({"topic": "locks"})
    verdict = verify_state({**final, "draft": final["draft"].upper()}, sample_consumer())
    assert not verdict and [(s.node, v.reason) for s, v in verdict.rejected] == [("writer", Reason.OUTPUT_MISMATCH)]


def test_an_empty_state_is_not_a_verified_one() -> None:
    assert not verify_state({"countersign": Evidence()}, sample_consumer())
    assert not verify_state({}, sample_consumer())


def test_a_command_update_is_signed_and_its_routing_kept() -> None:
    class State(EvidenceState):
        topic: str
        plan: str

    def route(state: State) -> Command[Any]:
        return Command(update={"plan": "routed"}, goto="done")

    def done(state: State) -> dict[str, str]:
        return {}

    graph = StateGraph(State)
    graph.add_node("route", signed_node(route, "deployer-a", in_process()), destinations=("done",))
    graph.add_node("done", signed_node(done, "deployer-b", in_process()))
    graph.add_edge(START, "route")
    graph.add_edge("done", END)
    final = graph.compile().invoke({"topic": "t"})
    assert final["plan"] == "routed"
    assert [(s.node, s.keys) for s in final["countersign"].receipts] == [("route", ("plan",)), ("done", ())]
    assert verify_state(final, sample_consumer())


def test_the_wrapper_keeps_the_nodes_name_and_arguments() -> None:
    seen: dict[str, Any] = {}

    def configured(state: Research, config: RunnableConfig) -> dict[str, str]:
        seen["config"] = config
        return {"plan": "p"}

    wrapped = signed_node(configured, "deployer-a", in_process())
    assert wrapped.__name__ == "configured"
    graph = StateGraph(Research)
    graph.add_node(wrapped)
    graph.add_edge(START, "configured")
    graph.compile().invoke({"topic": "t"}, {"configurable": {"thread": "1"}})
    assert seen["config"]["configurable"]["thread"] == "1"  # LangGraph passed it through the wrapper


def test_output_keys_pick_the_signed_output() -> None:
    def both(state: Research) -> dict[str, str]:
        return {"plan": "p", "notes": "n"}

    graph = StateGraph(Research)
    graph.add_node("both", signed_node(both, "deployer-a", in_process(), output_keys=["notes"]))
    graph.add_edge(START, "both")
    final = graph.compile().invoke({"topic": "t"})
    assert final["countersign"].receipts[0].keys == ("notes",)
    assert verify_state({**final, "plan": "changed, not signed"}, sample_consumer())


def test_misuse_is_named() -> None:
    async def anode(state: Research) -> dict[str, str]:
        return {}

    with pytest.raises(TypeError, match="AsyncMeshSigning"):
        signed_node(anode, "deployer-a", in_process())
    with pytest.raises(TypeError, match="MeshSigning"):
        signed_node(planner, "deployer-a", integration.AsyncMeshSigning({}))

    def writes_evidence(state: Research) -> dict[str, Any]:
        return {"countersign": Evidence()}

    with pytest.raises(ValueError, match="evidence"):
        signed_node(writes_evidence, "deployer-a", in_process())({"topic": "t"})

    def returns_text(state: Research) -> str:
        return "text"

    with pytest.raises(TypeError, match="must return a dict"):
        signed_node(returns_text, "deployer-a", in_process())({"topic": "t"})
    with pytest.raises(KeyError, match="output keys"):
        signed_node(planner, "deployer-a", in_process(), output_keys=["draft"])({"topic": "t"})
    with pytest.raises(TypeError, match="must be an Evidence"):
        signed_node(planner, "deployer-a", in_process())({"topic": "t", "countersign": "not evidence"})


def test_a_deployer_without_a_runtime_is_a_config_error() -> None:
    from countersign.errors import ConfigError

    with pytest.raises(ConfigError, match="no runtime for deployer-a"):
        MeshSigning({}).agent("deployer-a", "planner", None, None)


def test_the_reducer_accumulates_receipts_and_spends_a_handoff() -> None:
    first = build(in_process()).invoke({"topic": "a"})["countersign"]
    second = build(in_process()).invoke({"topic": "b"})["countersign"]
    merged = merge_evidence(first, second)
    assert merged.receipts == first.receipts + second.receipts and merged.path == second.path
    assert merge_evidence(None, None) == Evidence() and merge_evidence(first, None) is first
    pending = Evidence(handoff_text="cs1.pending")  # the reducer does not parse it
    assert merge_evidence(Evidence(), pending).handoff_text == "cs1.pending"
    assert merge_evidence(pending, Evidence.of(first.path)).handoff_text is None
    assert merge_evidence(pending, Evidence(receipts=first.receipts)).handoff_text == "cs1.pending"


def test_the_state_survives_a_strict_checkpointer() -> None:
    serde = JsonPlusSerializer(allowed_msgpack_modules=CHECKPOINT_TYPES)
    graph = build(in_process(), checkpointer=InMemorySaver(serde=serde))
    thread = {"configurable": {"thread_id": "research-1"}}
    graph.invoke({"topic": "locks"}, thread)
    stored = graph.get_state(thread).values  # read back from the checkpoint
    assert isinstance(stored["countersign"], Evidence) and "path" not in stored["countersign"].__dict__
    assert verify_state(stored, sample_consumer())
    # The next turn on the same thread continues under the last agent, and every receipt still verifies.
    again = graph.invoke({"topic": "locks"}, thread)
    assert len(again["countersign"].receipts) == 6 and len(again["countersign"].path) == 6
    assert verify_state(again, sample_consumer())


def test_evidence_read_back_is_parsed_strictly() -> None:
    final = build(in_process()).invoke({"topic": "locks"})
    signed = final["countersign"].receipts[0]
    broken = SignedOutput(signed.node, list(signed.keys), signed.receipt_json[:-2])  # type: ignore[arg-type]
    assert broken.keys == signed.keys
    with pytest.raises(MalformedError):
        _ = broken.receipt
    verdict = verify_state({**final, "countersign": Evidence(receipts=(broken,))}, sample_consumer())
    assert [v.reason for _, v in verdict.outputs] == [Reason.MALFORMED]


def test_without_langgraph_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langgraph.types", None)
    with pytest.raises(ImportError, match=r"pip install 'countersign-mesh\[langgraph\]'"):
        signed_node(planner, "deployer-a", in_process())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(st.text(min_size=1, max_size=8), json_values, min_size=2, max_size=4))
def test_several_keys_are_signed_as_canonical_json(update: dict[str, Any]) -> None:
    data = state_output_bytes(update)
    assert json.loads(data) == update
    assert state_output_bytes(dict(reversed(list(update.items())))) == data  # key order does not matter


@given(st.text())
def test_a_single_text_output_is_its_utf8_bytes(text: str) -> None:
    try:
        expected = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates are not text a model emits
    assert state_output_bytes({"draft": text}) == expected
    assert state_output_bytes({"draft": expected}) == expected


def test_values_json_cannot_hold_are_refused() -> None:
    with pytest.raises(TypeError, match="output_keys"):
        state_output_bytes({"a": object(), "b": 1})


def test_an_async_graph_with_in_process_signing() -> None:
    class AsyncInProcess:
        def __init__(self) -> None:
            self.inner = in_process()

        async def agent(self, *args: Any) -> Any:
            return self.inner.agent(*args)

        async def receipt(self, *args: Any) -> Any:
            return self.inner.receipt(*args)

    async def anode(state: Research) -> dict[str, str]:
        return {"plan": "async plan"}

    graph = StateGraph(Research)
    graph.add_node("anode", signed_node(anode, "deployer-a", AsyncInProcess()))
    graph.add_edge(START, "anode")
    final = asyncio.run(graph.compile().ainvoke({"topic": "t"}))
    assert verify_state(final, sample_consumer())


def test_the_module_imports_langgraph_only_when_a_node_is_wrapped() -> None:
    tree = ast.parse(Path(integration.__file__).read_text())
    top_level = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
    names = [alias.name for node in top_level if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in top_level if isinstance(node, ast.ImportFrom)]
    assert names and not [name for name in names if name.split(".")[0] == "langgraph"]
