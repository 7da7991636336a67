"""An asyncio LangGraph graph hosted by two deployers, started by a third deployer's delegation.

deployer-a's runtime delegates a task: it starts its own agent, and hands ``deployer-b`` a
``Delegation`` as a string (what would travel in an A2A message's metadata or an HTTP header). The
graph, ``async def`` nodes on deployer-b (Researcher) and deployer-c (Writer), runs with ``ainvoke``:
its first node accepts the handoff (a co-signed edge under deployer-a's record), the second is
delegated to in turn. The consumer checks every output on the event loop.

    python examples/langgraph_async.py   # on the mesh COUNTERSIGN_MESH names, else a private local one

Needs ``pip install 'countersign-mesh[langgraph]'``.
"""

from __future__ import annotations

import asyncio
import sys

from example_mesh import MeshSettings, the_mesh
from langgraph.graph import END, START, StateGraph

from countersign.client import AsyncRuntime, Consumer
from countersign.integrations.langgraph import AsyncMeshSigning, Evidence, EvidenceState, averify_state, signed_node


class Task(EvidenceState):
    topic: str
    notes: str
    draft: str


async def researcher(state: Task) -> dict[str, str]:
    await asyncio.sleep(0)  # where a model or a tool would be awaited
    return {"notes": f"two sources on {state['topic']}"}


async def writer(state: Task) -> dict[str, str]:
    return {"draft": f"On {state['topic']}: {state['notes']}."}


async def main(handoff: str, runtimes: dict[str, AsyncRuntime], consumer: Consumer) -> int:
    signing = AsyncMeshSigning(runtimes)
    graph = StateGraph(Task)
    graph.add_node("researcher", signed_node(researcher, "deployer-b", signing))
    graph.add_node("writer", signed_node(writer, "deployer-c", signing))
    graph.add_edge(START, "researcher")
    graph.add_edge("researcher", "writer")
    graph.add_edge("writer", END)
    final = await graph.compile().ainvoke({"topic": "tides", "countersign": Evidence.from_handoff(handoff)})
    evidence = final["countersign"]
    print("lineage:", " -> ".join(e.record.deployer for e in evidence.path.envelopes))
    verdict = await averify_state(final, consumer)
    for signed, each in verdict.outputs:
        print(f"verified {signed.node}: {each.result.verdict} emitted by", each.emitter and each.emitter.deployer)
    return 0 if verdict else 1


async def on_mesh(mesh: MeshSettings) -> int:
    # deployer-a, in its own process in real life: start an agent and delegate to deployer-b.
    with mesh.runtime("deployer-a") as parent:
        handoff = str(parent.delegate(parent.root("coordinator", "tides"), "deployer-b"))
    runtimes = {d: mesh.async_runtime(d) for d in ("deployer-b", "deployer-c")}
    async with mesh.consumer() as consumer:
        code = await main(handoff, runtimes, consumer)
    for runtime in runtimes.values():
        await runtime.close()
    return code


if __name__ == "__main__":
    with the_mesh() as mesh:
        code = asyncio.run(on_mesh(mesh))
    sys.exit(code)
