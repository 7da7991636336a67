"""The paper's LangGraph experiment, reproduced: ``python -m bench.workflow [--quick] [--json FILE]``
(``make workflow``).

A real ``StateGraph`` Planner -> Researcher -> Writer, the Researcher and the Writer on other deployers
(deployer-a, deployer-b, deployer-c), every node wrapped with
:func:`countersign.integrations.langgraph.signed_node`, outputs deterministic (the same topic, the same
bytes, every run). 100 warm-up runs, then 1,000 measured ones, under three conditions:

* **LINKED-LIST in one process**, the paper's setting: the core's constructions sign with in-memory
  keys (``countersign.constructions.issue``; keys and registry from ``countersign.samples``);
* **SIGNED-DAG in one process**: the same, every cross-deployer edge co-signed by the parent's key in
  process (what the co-signing itself costs, without a network);
* **SIGNED-DAG over mTLS**: real signer daemons on loopback (``LocalMesh``), each hand-off a grant on
  the parent's signer and a co-signed delegation through the child's signer, each receipt from the
  node's own signer; verification by the verifier service over mTLS.

Signing per node: the node's agent record (root, or delegated child) plus its output receipt, timed
inside the wrapper's calls (the node's own work and LangGraph's scheduling are not counted); per task:
the three nodes' signing added up. Verification: the Writer's receipt and its whole chain (Planner,
Researcher, Writer, receipt), from the parsed path with the exact output bytes, accept mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from langgraph.graph import END, START, StateGraph

from countersign.canonical import sha256_digest
from countersign.client import Delegation, Runtime
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.integrations.langgraph import EvidenceState, MeshSigning, Signing, signed_node
from countersign.keys import Ed25519Signer
from countersign.records import AgentRef, BindingScope, Construction, LifecycleEvent, OutputReceipt, Path
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import Mode, verify_path

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
NODES = ("planner", "researcher", "writer")
WARMUP, RUNS = 100, 1_000
TOPIC = "the history of suspension bridges"
RECORD_SIZED = b"x" * 700  # a node record's signing input is about this long
# The paper's figures (M1 Pro, Python 3.11, LINKED-LIST in one process), in ms.
FLOOR_LABEL = "floor: two raw signatures and the output's hash, in each node's slot"
PAPER = {"node_mean": 0.171, "node_p95": 0.214, "task_mean": 0.512, "verify_mean": 0.832, "verify_p95": 1.013}


class Research(EvidenceState):
    topic: str
    plan: str
    notes: str
    draft: str


def planner(state: Research) -> dict[str, str]:
    return {"plan": f"Plan: find three sources on {state['topic']}, compare their dates, summarise."}


def researcher(state: Research) -> dict[str, str]:
    return {"notes": f"Notes: the three sources on {state['topic']} agree on the dates; two cite the third."}


def writer(state: Research) -> dict[str, str]:
    return {"draft": f"Report. {state['notes'].removeprefix('Notes: ').capitalize()} (after: {state['plan'][:20]}…)"}


def build(signing: Signing, checkpointer: Any = None) -> Any:
    graph = StateGraph(Research)
    for name, fn, deployer in zip(NODES, (planner, researcher, writer), DEPLOYERS, strict=True):
        graph.add_node(name, signed_node(fn, deployer, signing))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "researcher")
    graph.add_edge("researcher", "writer")
    graph.add_edge("writer", END)
    return graph.compile(checkpointer=checkpointer)


# --- signing in one process with the core's constructions ---------------------------------------


@dataclass
class InProcessSigning:
    """:class:`Signing` by the core alone: ``construction`` records signed with in-memory keys, a
    SIGNED-DAG edge co-signed by the parent's key in process. No grants, no network, no state."""

    construction: Construction
    keys: dict[str, Ed25519Signer]
    system: str = "workflow"
    ttl_ms: int = 3_600_000

    def _fields(self, deployer: str, instance: str, parent: Path | None, output: bytes | None) -> RecordFields:
        now = time.time_ns() // 1_000_000
        expires = now + self.ttl_ms if parent is None else parent.leaf.record.expires_ms
        receipt = None
        if output is not None:
            receipt = OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, instance, 0, None)
        return RecordFields(
            deployer=deployer,
            agent=AgentRef(instance, self.system if parent is None else parent.leaf.record.agent.system),
            created_ms=now,
            expires_ms=expires,
            max_children=0 if output is not None else 8,
            event=LifecycleEvent.NEW if parent is None or output is not None else LifecycleEvent.BRANCH,
            output=receipt,
        )

    def _issue(self, deployer: str, fields: RecordFields, parent: Path | None) -> Path:
        prefix = () if parent is None else parent.envelopes
        parent_key = None if parent is None else self.keys[parent.leaf.record.deployer]
        envelope = issue(
            self.construction,
            fields,
            self.keys[deployer],
            prefix,
            parent_key_id=None if parent_key is None else parent_key.key_id,
            parent_cosigner=None if parent_key is None else local_parent_cosigner(parent_key),
        )
        return Path((*prefix, envelope))

    def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        assert handoff is None, "in-process signing takes no handoffs"
        return self._issue(deployer, self._fields(deployer, instance, parent, None), parent)

    def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        instance = agent.leaf.record.agent.instance
        return self._issue(deployer, self._fields(deployer, instance, agent, output), agent)


# --- timing what the wrapper asks of its signing ------------------------------------------------


@dataclass
class TimedSigning:
    """Wraps a :class:`Signing` and keeps the seconds each node spent in it (agent record + receipt)."""

    inner: Signing
    node_seconds: list[tuple[str, float]] = field(default_factory=list)
    _pending: float = 0.0

    def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        started = time.perf_counter()
        path = self.inner.agent(deployer, instance, parent, handoff)
        self._pending = time.perf_counter() - started
        return path

    def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        started = time.perf_counter()
        path = self.inner.receipt(deployer, agent, output)
        self.node_seconds.append((agent.leaf.record.agent.instance, self._pending + time.perf_counter() - started))
        return path


def summary(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "n": len(ordered),
    }


class Condition:
    """One way of running the graph, measured a run at a time (so conditions can be interleaved)."""

    def __init__(self, signing: Signing, verify: Callable[[Path, bytes], bool]) -> None:
        self.timed = TimedSigning(signing)
        self.graph = build(self.timed)
        self.verify = verify
        self.per_task: list[float] = []
        self.per_node: dict[str, list[float]] = {name: [] for name in NODES}
        self.verification: list[float] = []
        self.runs_ms: list[float] = []

    def step(self, keep: bool) -> None:
        """One graph run and the check of its Writer's receipt; ``keep``: record the figures."""
        self.timed.node_seconds.clear()
        started = time.perf_counter()
        final = self.graph.invoke({"topic": TOPIC})
        run_ms = (time.perf_counter() - started) * 1e3
        receipt, draft = final["countersign"].receipt_of("writer"), final["draft"].encode()
        started = time.perf_counter()
        accepted = self.verify(receipt, draft)
        elapsed = time.perf_counter() - started
        if not accepted:
            raise RuntimeError("the writer's receipt was not accepted")
        if not keep:
            return
        self.verification.append(elapsed * 1e3)
        self.runs_ms.append(run_ms)
        self.per_task.append(sum(seconds for _, seconds in self.timed.node_seconds) * 1e3)
        for name, seconds in self.timed.node_seconds:
            self.per_node[name].append(seconds * 1e3)

    def figures(self) -> dict[str, Any]:
        every_node = [ms for samples in self.per_node.values() for ms in samples]
        return {
            "node": summary(every_node),
            "by_node": {name: summary(samples) for name, samples in self.per_node.items()},
            "task": summary(self.per_task),
            "verify": summary(self.verification),
            "graph_run": summary(self.runs_ms),
        }


def interleave(steps: Sequence[Callable[[bool], None]], warmup: int, runs: int) -> None:
    """Each step once per round, ``warmup`` rounds unrecorded then ``runs`` recorded: a machine whose
    speed drifts (a shared 2-vCPU VM) moves every condition alike."""
    for index in range(warmup + runs):
        for step in steps:
            step(index >= warmup)


def measure(signing: Signing, verify: Callable[[Path, bytes], bool], warmup: int, runs: int) -> dict[str, Any]:
    """Run the graph ``warmup + runs`` times; the figures of the last ``runs``."""
    condition = Condition(signing, verify)
    interleave([condition.step], warmup, runs)
    return condition.figures()


class Bare:
    """The same graph without evidence: what a run costs LangGraph itself."""

    def __init__(self) -> None:
        graph = StateGraph(Research)
        for name, fn in zip(NODES, (planner, researcher, writer), strict=True):
            graph.add_node(name, fn)
        graph.add_edge(START, "planner")
        graph.add_edge("planner", "researcher")
        graph.add_edge("researcher", "writer")
        graph.add_edge("writer", END)
        self.graph: Any = graph.compile()
        self.samples: list[float] = []

    def step(self, keep: bool) -> None:
        started = time.perf_counter()
        self.graph.invoke({"topic": TOPIC})
        if keep:
            self.samples.append((time.perf_counter() - started) * 1e3)


class RawSignature:
    """One Ed25519 signature over a record-sized message, as the constructions make them."""

    def __init__(self) -> None:
        self.key = Ed25519Signer.generate()
        self.samples: list[float] = []

    def step(self, keep: bool) -> None:
        started = time.perf_counter()
        for _ in range(6):  # as many as one graph run makes
            self.key.sign(RECORD_SIZED)
        if keep:
            self.samples.append((time.perf_counter() - started) * 1e3 / 6)


class FloorSigning:
    """The floor of a node's signing in its own slot of the graph: what any signing must do there (one
    Ed25519 signature over a record-sized message for the agent record, the output's SHA-256 and one
    for the receipt) and nothing else. It hands back paths a real LINKED-LIST signing made up front,
    so the graph runs as it does signed. Timed like the others, in the same rounds, it shows what the
    machine's cache and scheduling leave of a node's tail (the Planner signs first in each run, after
    LangGraph's own work) apart from the records themselves."""

    def __init__(self, keys: dict[str, Ed25519Signer]) -> None:
        self.keys = keys
        final = build(InProcessSigning(Construction.LINKED_LIST, keys)).invoke({"topic": TOPIC})
        receipts: dict[str, Path] = {name: final["countersign"].receipt_of(name) for name in NODES}
        self._receipts = {path.leaf.record.agent.instance: path for path in receipts.values()}
        self._agents = {instance: Path(path.envelopes[:-1]) for instance, path in self._receipts.items()}

    def agent(self, deployer: str, instance: str, parent: Path | None, handoff: Delegation | None) -> Path:
        self.keys[deployer].sign(RECORD_SIZED)
        return self._agents[instance]

    def receipt(self, deployer: str, agent: Path, output: bytes) -> Path:
        sha256_digest(output)
        self.keys[deployer].sign(RECORD_SIZED)
        return self._receipts[agent.leaf.record.agent.instance]


def floor_condition() -> Condition:
    sample = SampleMesh.create(DEPLOYERS, seed=b"countersign-workflow")
    return Condition(FloorSigning(sample.signers), lambda receipt, output: True)  # nothing of its own to verify


def in_process_condition(construction: Construction) -> Condition:
    sample = SampleMesh.create(DEPLOYERS, seed=b"countersign-workflow")
    state = InMemoryState()

    def verify(receipt: Path, output: bytes) -> bool:
        now = time.time_ns() // 1_000_000
        return bool(verify_path(receipt, output, registry=sample.registry, state=state, mode=Mode.ACCEPT, now_ms=now))

    return Condition(InProcessSigning(construction, sample.signers), verify)


def in_process_interleaved(warmup: int, runs: int) -> dict[str, Any]:
    """Both in-process constructions, the signing floor in the graph, the graph without evidence and one
    raw signature, interleaved."""
    linked, dag = in_process_condition(Construction.LINKED_LIST), in_process_condition(Construction.SIGNED_DAG)
    floor, bare, raw = floor_condition(), Bare(), RawSignature()
    interleave([linked.step, dag.step, floor.step, bare.step, raw.step], warmup, runs)
    floor_figures = floor.figures()
    del floor_figures["verify"]  # it verifies nothing
    return {
        "linked_list_in_process": linked.figures(),
        "signed_dag_in_process": dag.figures(),
        "signing_floor_in_process": floor_figures,
        "unsigned_graph_run": summary(bare.samples),
        "raw_ed25519_sign_ms": statistics.fmean(raw.samples),
    }


@contextmanager
def mesh_runtimes() -> Iterator[tuple[dict[str, Runtime], Any]]:
    from countersign_cli.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix="countersign-workflow-") as workdir, LocalMesh(FilePath(workdir)) as mesh:
        mesh.setup().start_all().enrol_all()
        runtimes = {d: Runtime(mesh.daemons[d].address, mesh.tls_for(f"{d}-runtime"), d) for d in DEPLOYERS}
        verifier = mesh.verifier_client()
        try:
            yield runtimes, verifier
        finally:
            verifier.close()
            for runtime in runtimes.values():
                runtime.close()


def over_mtls(warmup: int, runs: int) -> dict[str, Any]:
    with mesh_runtimes() as (runtimes, verifier):
        return measure(
            MeshSigning(runtimes, system="workflow"), lambda path, output: bool(verifier.verify(path, output)), warmup,
            runs,
        )  # fmt: skip


def run(quick: bool = False) -> dict[str, Any]:
    warmup, runs = (10, 50) if quick else (WARMUP, RUNS)
    return {
        "warmup": warmup,
        "runs": runs,
        **in_process_interleaved(warmup, runs),
        "signed_dag_mtls": over_mtls(warmup, runs),
    }


def _ms(value: float) -> str:
    return f"{value:.3f}"


def report(results: dict[str, Any]) -> str:
    rows: list[tuple[str, float | None, float | None, float | None, float | None, float | None, float | None]] = [
        ("paper: LINKED-LIST, one process (M1 Pro)", PAPER["node_mean"], PAPER["node_p95"], PAPER["task_mean"], None,
         PAPER["verify_mean"], PAPER["verify_p95"]),
    ]  # fmt: skip
    names = {
        "linked_list_in_process": "LINKED-LIST, one process",
        "signed_dag_in_process": "SIGNED-DAG, co-signed in one process",
        "signed_dag_mtls": "SIGNED-DAG, co-signed by signer daemons over mTLS",
    }
    for key, label in names.items():
        figures = results[key]
        rows.append((label, figures["node"]["mean"], figures["node"]["p95"], figures["task"]["mean"],
                     figures["task"]["p95"], figures["verify"]["mean"], figures["verify"]["p95"]))  # fmt: skip
    floor = results["signing_floor_in_process"]
    rows.append((FLOOR_LABEL, floor["node"]["mean"], floor["node"]["p95"], floor["task"]["mean"], floor["task"]["p95"],
                 None, None))  # fmt: skip
    lines = [
        f"LangGraph workflow: Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c), "
        f"{results['warmup']} warm-ups, {results['runs']} runs; ms",
        "",
        "| condition | signing per node, mean | p95 | per task, mean | p95 | receipt-and-chain verification, mean"
        " | p95 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, *figures in rows:
        lines.append(f"| {label} | " + " | ".join("–" if f is None else _ms(f) for f in figures) + " |")
    lines += ["", "| condition | planner, mean (p95) | researcher | writer |", "|---|---:|---:|---:|"]
    for key, label in [*names.items(), ("signing_floor_in_process", FLOOR_LABEL)]:
        by_node = results[key]["by_node"]
        cells = [f"{_ms(by_node[n]['mean'])} ({_ms(by_node[n]['p95'])})" for n in NODES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| whole graph run (invoke) | mean | p95 |", "|---|---:|---:|"]
    bare = results["unsigned_graph_run"]
    lines.append(f"| without evidence | {_ms(bare['mean'])} | {_ms(bare['p95'])} |")
    for key, label in names.items():
        run = results[key]["graph_run"]
        lines.append(f"| {label} | {_ms(run['mean'])} | {_ms(run['p95'])} |")
    raw = results["raw_ed25519_sign_ms"]
    linked = results["linked_list_in_process"]["node"]
    lines += [
        "",
        f"One raw Ed25519 signature on this machine in the same run: {_ms(raw)} ms. A node signs two records "
        f"(its agent record and its receipt): in one process under LINKED-LIST a node costs "
        f"{linked['mean'] / (2 * raw):.2f}× its two raw signatures. In the graph, the floor (those two signatures "
        f"and the output's hash, in each node's own slot) takes {_ms(floor['node']['mean'])} ms on average and "
        f"{_ms(floor['node']['p95'])} ms at p95: LINKED-LIST adds {_ms(linked['mean'] - floor['node']['mean'])} ms "
        f"to the mean and {_ms(linked['p95'] - floor['node']['p95'])} ms to the p95 for its records. "
        "Over mTLS the verification is one VerifyPath call to the verifier service.",
    ]
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workflow", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10 warm-ups and 50 runs (a smoke run, not for figures)")
    parser.add_argument("--json", type=FilePath, help="also write the raw figures as JSON")
    args = parser.parse_args(argv)
    results = run(quick=args.quick)
    print(report(results), flush=True)
    if args.json:
        args.json.write_text(as_json(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
