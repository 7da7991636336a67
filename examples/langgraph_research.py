"""A LangGraph research chain across three deployers, every output signed, every hand-off co-signed.

Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c): each node is wrapped with
``signed_node``; the hand-offs a -> b and b -> c are co-signed delegations through the deployers' own
signers. A consumer then checks every output in the final state with a verifier, and a tampered
output is rejected.

    python examples/langgraph_research.py   # on the mesh COUNTERSIGN_MESH names, else a private local one

Needs ``pip install 'countersign-mesh[langgraph]'``.
"""

from __future__ import annotations

import sys

from example_mesh import the_mesh
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from countersign.client import Consumer, Runtime
from countersign.integrations.langgraph import EvidenceState, MeshSigning, signed_node, verify_state


class Research(EvidenceState):
    topic: str
    plan: str
    notes: str
    draft: str


def planner(state: Research) -> dict[str, str]:
    return {"plan": f"1. find sources on {state['topic']}; 2. summarise them"}


def researcher(state: Research) -> dict[str, str]:
    return {"notes": f"three sources on {state['topic']} agree (plan: {state['plan'][:24]}...)"}


def writer(state: Research) -> dict[str, str]:
    return {"draft": f"Report on {state['topic']}: {state['notes']}."}


def build(signing: MeshSigning) -> CompiledStateGraph:  # type: ignore[type-arg]
    """The compiled graph, each node on its own deployer."""
    graph = StateGraph(Research)
    graph.add_node("planner", signed_node(planner, "deployer-a", signing))
    graph.add_node("researcher", signed_node(researcher, "deployer-b", signing))
    graph.add_node("writer", signed_node(writer, "deployer-c", signing))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "researcher")
    graph.add_edge("researcher", "writer")
    graph.add_edge("writer", END)
    return graph.compile()


def main(runtimes: dict[str, Runtime], consumer: Consumer) -> int:
    graph = build(MeshSigning(runtimes, system="research"))
    final = graph.invoke({"topic": "bridges"})
    evidence = final["countersign"]
    print("lineage:", " -> ".join(e.record.deployer for e in evidence.path.envelopes))
    for signed in evidence.receipts:
        print(f"signed {signed.node}: {signed.keys} by {signed.receipt.leaf.record.deployer}")
    verdict = verify_state(final, consumer)
    for signed, each in verdict.outputs:
        print(f"verified {signed.node}: {each.result.verdict} emitted by", each.emitter and each.emitter.deployer)
    tampered = {**final, "draft": final["draft"].replace("agree", "disagree")}
    rejected = verify_state(tampered, consumer, audit=True)
    print("tampered draft:", [str(v.reason) for _, v in rejected.rejected])
    return 0 if verdict and not rejected else 1


if __name__ == "__main__":
    with the_mesh() as mesh:
        runtimes = {d: mesh.runtime(d) for d in ("deployer-a", "deployer-b", "deployer-c")}
        with mesh.consumer() as consumer:
            code = main(runtimes, consumer)
        for runtime in runtimes.values():
            runtime.close()
    sys.exit(code)
