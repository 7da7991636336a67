"""The paper's live workflow (its E12), reproduced: ``python -m bench.live_workflow [--quick] [--json FILE]``
(``make workflow``, after the LangGraph table).

Three trust domains in their own processes on loopback, each its own deployer with its own signer
daemon (mTLS on every signer and verifier call):

* the **parent** (deployer-a, this process): starts an agent record for each task, delegates it to the
  child and sends the task over A2A JSON-RPC, then verifies the answer;
* the **child** (deployer-b): an A2A JSON-RPC server (``a2a-sdk``, uvicorn) whose executor is wrapped
  with :class:`countersign.integrations.a2a.SignedExecutor`; before answering it calls
* the **tool** (deployer-c): an MCP Streamable-HTTP server (the ``mcp`` SDK's ``MCPServer``) whose tool
  signs each result as a ``per_tool_call`` receipt with the runtime SDK and returns it in ``_meta``.

The child's text comes from :func:`generate`, a deterministic local generator standing in for a model
(the same prompt and tool result give the same bytes). 10 warm-ups then 30 tasks per condition, the
conditions rotated every round (a drifting machine moves them alike):

* ``none``: the same calls, no evidence;
* ``linked_list``: the paper's construction, each process signing in process with its own key (the
  core's constructions; LINKED-LIST needs no signer service: an edge is a digest link);
* ``signed_dag``: every record from the deployer's own signer daemon over mTLS, the parent -> child edge
  co-signed by both signers (a grant on the parent's, AcceptDelegation on the child's).

Per task: end-to-end ms at the parent (from starting the parent's record to holding the answer), the
evidence bytes (the answer's receipt path as path JSON, as the artifact carries it), the child's
issuance ms (its agent record and its receipt, timed in the child) and the parent's full verification
ms (the answer's whole chain and the tool result's receipt, in process against the registry). It also
shows that a claim made with the child's key alone is accepted under LINKED-LIST and rejected under
SIGNED-DAG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from countersign.canonical import sha256_digest
from countersign.client import AsyncRuntime, TlsConfig
from countersign.compact import compact_path
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.keys import Ed25519Signer
from countersign.records import (
    MAX_CHILDREN_LIMIT,
    AgentRef,
    BindingScope,
    Construction,
    LifecycleEvent,
    OutputReceipt,
    Path,
)
from countersign.registry import Registry
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import Mode, verify_path

PARENT, CHILD, TOOL = DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
CONDITIONS = ("none", "linked_list", "signed_dag")
WARMUP, TASKS = 10, 30
SEED = b"countersign-live-workflow"  # the in-process (LINKED-LIST) keys: each process derives only its own
# The paper's figures for this workflow (evidence overhead per task, child issuance, full verification, in
# ms; evidence bytes under LINKED-LIST and SIGNED-DAG).
PAPER = {"overhead_ms": 42.3, "issuance_ms": 11.6, "verify_ms": 16.7, "bytes_linked": 1_868, "bytes_dag": 2_096}
TARGET_OVERHEAD_P50_MS = 5.0

BENCH = "https://countersign.dev/bench/live-workflow/"  # the benchmark's own metadata keys
CONDITION_KEY, KEEP_KEY, LINKED_PARENT_KEY, TOOL_RECEIPT_KEY = (
    BENCH + name for name in ("condition", "keep", "linked-parent", "tool-receipt")
)

FACTS = (
    "Suspension bridge decks hang from vertical suspenders attached to main cables.",
    "The main cables pass over towers and are anchored in the ground at each end.",
    "Cable stiffness and deck mass set how a suspension bridge sways in wind.",
)
_WORDS = "the cable tower deck load span anchor tension wind mass steel strand saddle hanger truss pier"
VOCABULARY = (*_WORDS.split(), "compression", "design", "engineer", "river", "gorge", "safety", "stiffness")


def generate(prompt: str, fact: str, words: int = 40) -> str:
    """A deterministic stand-in for a model: text drawn from the prompt and the tool's result."""
    seed = hashlib.sha256(f"{prompt}\n{fact}".encode()).digest()
    chosen = [VOCABULARY[(seed[i % len(seed)] + 7 * i) % len(VOCABULARY)] for i in range(words)]
    return f"{fact} In short: " + " ".join(chosen) + "."


def lookup_fact(query: str) -> str:
    return FACTS[int.from_bytes(hashlib.sha256(query.encode()).digest()[:2], "big") % len(FACTS)]


# --- LINKED-LIST in process: each deployer signs with its own key, nothing else --------------------


@dataclass
class CoreSigner:
    """One deployer signing records in process with the core's constructions and its own key."""

    construction: Construction
    key: Ed25519Signer
    deployer: str
    ttl_ms: int = 3_600_000

    def _issue(self, instance: str, system: str, parent: Path | None, output: OutputReceipt | None) -> Path:
        now = time.time_ns() // 1_000_000
        fields = RecordFields(
            deployer=self.deployer,
            agent=AgentRef(instance, system),
            created_ms=now,
            expires_ms=now + self.ttl_ms if parent is None else parent.leaf.record.expires_ms,
            max_children=0 if output is not None else 8,
            event=LifecycleEvent.NEW if parent is None or output is not None else LifecycleEvent.BRANCH,
            output=output,
        )
        prefix = () if parent is None else parent.envelopes
        return Path((*prefix, issue(self.construction, fields, self.key, prefix)))

    def root(self, instance: str, system: str) -> Path:
        return self._issue(instance, system, None, None)

    def child(self, parent: Path, instance: str) -> Path:
        """A child under another deployer's record: under LINKED-LIST, a digest link and the child's key."""
        return self._issue(instance, parent.leaf.record.agent.system, parent, None)

    def receipt(self, agent: Path, output: bytes, session: str, scope: BindingScope = BindingScope.PER_TURN) -> Path:
        record = agent.leaf.record
        receipt = OutputReceipt(sha256_digest(output), scope, session, 0, None)
        return self._issue(record.agent.instance, record.agent.system, agent, receipt)


def tls_config(files: dict[str, str]) -> TlsConfig:
    return TlsConfig(ca=files["ca"], cert=files["cert"], key=files["key"])


def core_signer(deployer: str) -> CoreSigner:
    return CoreSigner(Construction.LINKED_LIST, SampleMesh.create((deployer,), seed=SEED).signers[deployer], deployer)


# --- the child-key-only claim ------------------------------------------------------------------------


def child_key_only_claims() -> dict[str, str]:
    """Deployer-b, holding only its own key, claims to be deployer-a's delegated child and signs an
    output as that child. Under LINKED-LIST the claim verifies; under SIGNED-DAG it cannot carry the
    parent's co-signature (b signs the parent's share with its own key, the best it can do) and is
    rejected. The verdict of each, against a registry that admits both deployers."""
    sample = SampleMesh.create(DEPLOYERS, seed=SEED)
    verdicts = {}
    for construction in (Construction.LINKED_LIST, Construction.SIGNED_DAG):
        parent = CoreSigner(construction, sample.signers[PARENT], PARENT).root("planner", "live")
        child_key = sample.signers[CHILD]
        now = time.time_ns() // 1_000_000
        fields = RecordFields(
            CHILD, AgentRef("child", "live"), now, parent.leaf.record.expires_ms, 8, LifecycleEvent.BRANCH
        )
        forged = issue(
            construction, fields, child_key, parent.envelopes,
            parent_key_id=sample.signers[PARENT].key_id, parent_cosigner=local_parent_cosigner(child_key),
        )  # fmt: skip
        agent = Path((*parent.envelopes, forged))
        output = b"a claim the parent never delegated"
        claim = CoreSigner(construction, child_key, CHILD).receipt(agent, output, "child")
        result = verify_path(
            claim, output, registry=sample.registry, state=InMemoryState(), mode=Mode.ACCEPT, now_ms=now
        )
        verdicts[construction.name.lower()] = str(result.verdict) + ("" if result else f" ({result.reason})")
    return verdicts


# --- the child: an A2A JSON-RPC agent ----------------------------------------------------------------


@dataclass
class ChildConfig:
    port: int
    tool_url: str
    signer: str
    tls: dict[str, str]
    timings: str
    overlap: bool = True  # accept the delegation while the tool is asked (SignedExecutor's overlap_accept)


def serve_child(config: ChildConfig) -> None:
    """The child deployer's A2A server (deployer-b), until SIGTERM."""
    import uvicorn
    from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message, new_text_part
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.tasks import TaskUpdater
    from a2a.types import AgentCapabilities, AgentCard, AgentInterface
    from mcp import Client

    from countersign.integrations.a2a import RECEIPT_KEY, SignedExecutor, a2a_app, agent_extension

    tls = tls_config(config.tls)
    linked = core_signer(CHILD)
    spent: list[float] = [0.0]  # seconds of issuance in the current task (tasks run one at a time)
    tool: dict[str, Any] = {}

    class TimedRuntime(AsyncRuntime):
        async def accept(self, *args: Any, **kwargs: Any) -> Path:
            started = time.perf_counter()
            try:
                return await super().accept(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

        async def receipt(self, *args: Any, **kwargs: Any) -> Path:
            started = time.perf_counter()
            try:
                return await super().receipt(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started

    class Answerer(AgentExecutor):
        """The child's own agent: asks the tool, then generates its answer."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None
            metadata = context.message.metadata.fields
            condition = metadata[CONDITION_KEY].string_value
            prompt = get_message_text(context.message)
            if context.current_task is None:
                await event_queue.enqueue_event(new_task_from_user_message(context.message))
            task_id = context.task_id or ""
            result = await tool["client"].call_tool(
                "lookup", {"query": prompt, "condition": condition, "session": f"tool.{task_id}"}
            )
            fact = result.content[0].text
            answer = generate(prompt, fact)
            artifact_metadata: dict[str, Any] = {}
            if result.meta and RECEIPT_KEY in result.meta:
                artifact_metadata[TOOL_RECEIPT_KEY] = result.meta[RECEIPT_KEY]
            if condition == "linked_list":
                started = time.perf_counter()
                parent = Path.from_bytes(metadata[LINKED_PARENT_KEY].string_value.encode())
                agent = linked.child(parent, "child")
                receipt = linked.receipt(agent, answer.encode(), f"child.{task_id}")
                spent[0] += time.perf_counter() - started
                artifact_metadata[RECEIPT_KEY] = receipt.to_bytes().decode()
            updater = TaskUpdater(event_queue, task_id, context.context_id or "")
            await updater.add_artifact([new_text_part(answer)], name="answer", metadata=artifact_metadata)
            await updater.complete()

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    answerer = Answerer()
    signed = SignedExecutor(
        answerer, lambda: TimedRuntime(config.signer, tls, CHILD), instance="child", overlap_accept=config.overlap
    )

    class ByCondition(AgentExecutor):
        """Runs the task under the condition its message names, and logs the child's issuance time."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            assert context.message is not None
            fields = context.message.metadata.fields
            condition = fields[CONDITION_KEY].string_value
            spent[0] = 0.0
            await (signed if condition == "signed_dag" else answerer).execute(context, event_queue)
            if fields[KEEP_KEY].bool_value and condition != "none":
                with open(config.timings, "a") as log:
                    log.write(json.dumps({"condition": condition, "issuance_ms": spent[0] * 1e3}) + "\n")

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with Client(config.tool_url) as client:  # one MCP session for the child's lifetime
            tool["client"] = client
            yield

    url = f"http://127.0.0.1:{config.port}/"
    card = AgentCard(
        name="child",
        description="answers a question after asking a tool; artifacts signed by deployer-b",
        version="1.0.0",
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)],
        capabilities=AgentCapabilities(streaming=False, extensions=[agent_extension(CHILD, required=False)]),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )
    app = a2a_app(ByCondition(), card, lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=config.port, log_level="warning")


# --- the tool: an MCP Streamable-HTTP server ---------------------------------------------------------


@dataclass
class ToolConfig:
    port: int
    signer: str
    tls: dict[str, str]


def serve_tool(config: ToolConfig) -> None:
    """The tool deployer's MCP server (deployer-c), until SIGTERM. Each result is signed as a
    per_tool_call receipt under the tool's own agent record, one session per child task."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp_types import CallToolResult, TextContent

    from countersign.integrations.a2a import RECEIPT_KEY

    server = MCPServer("facts")
    linked = core_signer(TOOL)
    linked_root = linked.root("facts", "live-tool")
    mesh: dict[str, Any] = {}

    async def lookup(query: str, condition: str, session: str) -> CallToolResult:
        """A fact about the query."""
        fact = lookup_fact(query)
        meta: dict[str, Any] = {}
        if condition == "linked_list":
            receipt = linked.receipt(linked_root, fact.encode(), session, BindingScope.PER_TOOL_CALL)
            meta[RECEIPT_KEY] = receipt.to_bytes().decode()
        elif condition == "signed_dag":
            if not mesh:  # made in the server's event loop, on the first call
                mesh["runtime"] = AsyncRuntime(config.signer, tls_config(config.tls), TOOL)
                mesh["root"] = await mesh["runtime"].root("facts", "live-tool")
            receipt = await mesh["runtime"].receipt(
                mesh["root"], fact.encode(), session=session, binding_scope="per_tool_call"
            )
            meta[RECEIPT_KEY] = receipt.to_bytes().decode()
        return CallToolResult(content=[TextContent(type="text", text=fact)], _meta=meta)

    # MCPServer reads the tool's schema from its annotations: give it the objects, not this module's strings.
    lookup.__annotations__ = {"query": str, "condition": str, "session": str, "return": CallToolResult}
    server.tool()(lookup)

    uvicorn.run(server.streamable_http_app(json_response=True), host="127.0.0.1", port=config.port, log_level="warning")


# --- the parent, and the measurement -----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the {what} process exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"the {what} did not listen on {port} within {timeout_s} s")


@contextlib.contextmanager
def agent_process(role: str, config: object, port: int, workdir: FilePath) -> Iterator[None]:
    """``python -m bench.live_workflow serve-<role> CONFIG`` in its own process, stopped by SIGTERM."""
    path = workdir / f"{role}.json"
    path.write_text(json.dumps(vars(config)))
    log = open(workdir / f"{role}.log", "wb")  # noqa: SIM115  (closed below, after the process)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(FilePath(__file__).parents[1]), os.environ.get("PYTHONPATH")))),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.live_workflow", f"serve-{role}", str(path)], stdout=log, stderr=log, env=env
    )
    try:
        wait_for_port(port, process, role)
        yield
    except BaseException:
        log.flush()
        sys.stderr.write((workdir / f"{role}.log").read_text()[-4000:])
        raise
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@dataclass
class Samples:
    e2e_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    online_verify_ms: list[float] = field(default_factory=list)
    evidence_bytes: list[int] = field(default_factory=list)
    compact_bytes: list[int] = field(default_factory=list)  # the same path as cs1z. text (spec 19.1)
    tool_receipt_bytes: list[int] = field(default_factory=list)
    handoff_bytes: list[int] = field(default_factory=list)


def summary(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "n": 0}
    return {
        "mean": statistics.fmean(ordered),
        "p50": ordered[len(ordered) // 2],
        "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
        "n": len(ordered),
    }


class Parent:
    """The parent deployer's side of each task, under each condition."""

    def __init__(self, client: Any, runtime: AsyncRuntime, verifier: Any, registry: Registry) -> None:
        self.client, self.runtime, self.verifier, self.registry = client, runtime, verifier, registry
        self.linked = core_signer(PARENT)
        self.linked_registry = SampleMesh.create(DEPLOYERS, seed=SEED).registry
        self.samples = {condition: Samples() for condition in CONDITIONS}
        self.root: Path | None = None
        self.floor: dict[str, dict[str, float]] = {}
        self.linked_root: Path | None = None

    async def task(self, condition: str, index: int, keep: bool) -> None:
        from a2a.types import Message, Part, Role

        from countersign.integrations.a2a import (
            artifact_bytes,
            artifact_receipt,
            delegated_message,
            raise_for_refusal,
            send_task,
        )

        prompt = f"Task {index}: what holds a suspension bridge up?"
        started = time.perf_counter()
        handoff = ""
        if condition == "signed_dag":
            if self.root is None:  # the parent agent, started once; each task is one delegation under it
                self.root = await self.runtime.root("parent", "live-workflow", max_children=MAX_CHILDREN_LIMIT)
            handoff = str(await self.runtime.delegate(self.root, CHILD))
            message = delegated_message(prompt, handoff)
        else:
            message = Message(role=Role.ROLE_USER, message_id=f"{condition}-{index}", parts=[Part(text=prompt)])
            if condition == "linked_list":
                if self.linked_root is None:
                    self.linked_root = self.linked.root("parent", "live")
                message.metadata.update({LINKED_PARENT_KEY: self.linked_root.to_bytes().decode()})
        message.metadata.update({CONDITION_KEY: condition, KEEP_KEY: keep})
        task = await send_task(self.client, message)
        elapsed_ms = (time.perf_counter() - started) * 1e3
        raise_for_refusal(task)
        (artifact,) = task.artifacts
        answer = artifact_bytes(artifact)
        if answer != generate(prompt, lookup_fact(prompt)).encode():
            raise RuntimeError("the child's answer is not the generator's")
        samples = self.samples[condition]
        if condition != "none":
            receipt = artifact_receipt(artifact)
            tool_receipt = artifact.metadata.fields[TOOL_RECEIPT_KEY].string_value.encode()
            registry = self.registry if condition == "signed_dag" else self.linked_registry
            began = time.perf_counter()
            accepted = self._verify(receipt, answer, registry) and self._verify(
                tool_receipt, lookup_fact(prompt).encode(), registry
            )
            verify_ms = (time.perf_counter() - began) * 1e3
            if not accepted:
                raise RuntimeError(f"the {condition} evidence was not accepted")
            if keep:
                samples.verify_ms.append(verify_ms)
                samples.evidence_bytes.append(len(receipt))
                samples.compact_bytes.append(len(compact_path(Path.from_bytes(receipt))))
                samples.tool_receipt_bytes.append(len(tool_receipt))
                samples.handoff_bytes.append(len(handoff or message.metadata.fields[LINKED_PARENT_KEY].string_value))
            if condition == "signed_dag":
                began = time.perf_counter()
                online = await self.verifier.verify(receipt, answer)
                if keep:
                    samples.online_verify_ms.append((time.perf_counter() - began) * 1e3)
                if not online.result:
                    raise RuntimeError(f"the verifier rejected the answer: {online.result.reason}")
        if keep:
            samples.e2e_ms.append(elapsed_ms)

    @staticmethod
    def _verify(receipt: bytes, output: bytes, registry: Registry) -> bool:
        now = time.time_ns() // 1_000_000
        path = Path.from_bytes(receipt)
        return bool(verify_path(path, output, registry=registry, state=InMemoryState(), mode=Mode.ACCEPT, now_ms=now))


async def signer_calls(mesh: Any, parent: AsyncRuntime, runs: int) -> dict[str, dict[str, float]]:
    """The signer calls on a SIGNED-DAG task's critical path, each timed alone in the same run, from
    this process: what the evidence overhead cannot go below on this host right now."""
    child = AsyncRuntime(mesh.daemons[CHILD].address, mesh.tls_for(f"{CHILD}-runtime"), CHILD)
    times: dict[str, list[float]] = {"delegate": [], "accept": [], "receipt": []}
    try:
        root = await parent.root("floor", "live-workflow", max_children=MAX_CHILDREN_LIMIT)
        for index in range(runs + 3):
            started = time.perf_counter()
            handoff = await parent.delegate(root, CHILD)
            delegated = time.perf_counter()
            agent = await child.accept(handoff, "floor-child")
            accepted = time.perf_counter()
            await child.receipt(agent, b"floor", session=f"floor.{index}")
            done = time.perf_counter()
            if index >= 3:
                times["delegate"].append((delegated - started) * 1e3)
                times["accept"].append((accepted - delegated) * 1e3)
                times["receipt"].append((done - accepted) * 1e3)
    finally:
        await child.close()
    return {name: summary(samples) for name, samples in times.items()}


async def drive(child_url: str, mesh: Any, warmup: int, tasks: int) -> Parent:
    import httpx
    from a2a.client import A2ACardResolver, ClientConfig, create_client

    from countersign.client import AsyncVerifierClient
    from countersign.keys import PublicKey
    from countersign.registry import KeyEntry

    registry = Registry(
        {d: {key.key_id: KeyEntry(PublicKey(key.public_key), 0)} for d, key in mesh.deployer_keys.items()},
        sequence=len(mesh.deployer_keys),
    )
    async with httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, child_url).get_agent_card()
        client = await create_client(card, ClientConfig(streaming=False, httpx_client=http))
        runtime = AsyncRuntime(mesh.daemons[PARENT].address, mesh.tls_for(f"{PARENT}-runtime"), PARENT)
        verifier = AsyncVerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client"))
        parent = Parent(client, runtime, verifier, registry)
        try:
            for index in range(warmup + tasks):
                turn = index % len(CONDITIONS)
                for condition in CONDITIONS[turn:] + CONDITIONS[:turn]:
                    await parent.task(condition, index, index >= warmup)
            parent.floor = await signer_calls(mesh, runtime, max(tasks, 5))
        finally:
            await client.close()
            await runtime.close()
            await verifier.close()
    return parent


def run(warmup: int = WARMUP, tasks: int = TASKS) -> dict[str, Any]:
    from countersign_cli.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix="countersign-live-") as name, LocalMesh(FilePath(name)) as mesh:
        workdir = FilePath(name)
        mesh.setup().start_all().enrol_all()
        tool_port, child_port = free_port(), free_port()
        timings = workdir / "child-timings.jsonl"

        def tls(deployer: str) -> dict[str, str]:
            config = mesh.tls_for(f"{deployer}-runtime")
            return {"ca": config.ca, "cert": config.cert, "key": config.key}

        tool = ToolConfig(tool_port, mesh.daemons[TOOL].address, tls(TOOL))
        child = ChildConfig(
            child_port, f"http://127.0.0.1:{tool_port}/mcp", mesh.daemons[CHILD].address, tls(CHILD), str(timings)
        )
        with agent_process("tool", tool, tool_port, workdir), agent_process("child", child, child_port, workdir):
            parent = asyncio.run(drive(f"http://127.0.0.1:{child_port}/", mesh, warmup, tasks))
        issuance: dict[str, list[float]] = {c: [] for c in CONDITIONS}
        for line in timings.read_text().splitlines():
            entry = json.loads(line)
            issuance[entry["condition"]].append(entry["issuance_ms"])
    results: dict[str, Any] = {"warmup": warmup, "tasks": tasks, "conditions": {}}
    for condition, samples in parent.samples.items():
        results["conditions"][condition] = {
            "e2e": summary(samples.e2e_ms),
            "verify": summary(samples.verify_ms),
            "online_verify": summary(samples.online_verify_ms),
            "issuance": summary(issuance[condition]),
            "evidence_bytes": max(samples.evidence_bytes, default=0),
            "compact_bytes": max(samples.compact_bytes, default=0),
            "tool_receipt_bytes": max(samples.tool_receipt_bytes, default=0),
            "handoff_bytes": max(samples.handoff_bytes, default=0),
        }
    results["signer_calls"] = parent.floor
    results["child_key_only"] = child_key_only_claims()
    return results


def report(results: dict[str, Any]) -> str:
    conditions = results["conditions"]
    bare = conditions["none"]["e2e"]
    labels = {
        "none": "no evidence",
        "linked_list": "LINKED-LIST (in process)",
        "signed_dag": "SIGNED-DAG (signers, mTLS)",
    }
    lines = [
        f"Live workflow: parent (deployer-a) -A2A-> child (deployer-b) -MCP-> tool (deployer-c), three processes "
        f"plus a signer daemon each; {results['warmup']} warm-ups, {results['tasks']} tasks per condition, rotated; ms",
        "",
        "| condition | end-to-end mean | p50 | p95 | overhead mean | overhead p50 | child issuance mean (p95)"
        " | full verification mean (p95) | evidence bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for condition, label in labels.items():
        figures = conditions[condition]
        e2e = figures["e2e"]
        cells = [f"{e2e['mean']:.2f}", f"{e2e['p50']:.2f}", f"{e2e['p95']:.2f}"]
        if condition == "none":
            cells += ["–", "–", "–", "–", "–"]
        else:
            cells += [
                f"{e2e['mean'] - bare['mean']:.2f}",
                f"{e2e['p50'] - bare['p50']:.2f}",
                f"{figures['issuance']['mean']:.2f} ({figures['issuance']['p95']:.2f})",
                f"{figures['verify']['mean']:.2f} ({figures['verify']['p95']:.2f})",
                f"{figures['evidence_bytes']:,}",
            ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        f"| paper (E12) | – | – | – | {PAPER['overhead_ms']} | – | {PAPER['issuance_ms']} | {PAPER['verify_ms']} "
        f"| {PAPER['bytes_linked']:,} / {PAPER['bytes_dag']:,} |"
    )
    dag = conditions["signed_dag"]
    overhead_p50 = dag["e2e"]["p50"] - bare["p50"]
    claims = results["child_key_only"]
    calls = results["signer_calls"]
    # On the critical path: the parent's grant, the tool's receipt and the child's receipt (the child's
    # co-signed acceptance overlaps the tool call), one durable signer call each.
    floor = calls["delegate"]["p50"] + 2 * calls["receipt"]["p50"]
    lines += [
        "",
        f"SIGNED-DAG overhead p50 {overhead_p50:.2f} ms (target <= {TARGET_OVERHEAD_P50_MS} ms: "
        f"{'met' if overhead_p50 <= TARGET_OVERHEAD_P50_MS else 'NOT met'}); evidence {dag['evidence_bytes']:,} bytes "
        f"(target < {PAPER['bytes_dag']:,}: {'met' if dag['evidence_bytes'] < PAPER['bytes_dag'] else 'NOT met'}).",
        f"Also carried: the tool's receipt {dag['tool_receipt_bytes']:,} bytes, the handoff {dag['handoff_bytes']:,} "
        f"characters (LINKED-LIST: tool receipt {conditions['linked_list']['tool_receipt_bytes']:,}, parent path "
        f"{conditions['linked_list']['handoff_bytes']:,}). Online VerifyPath of the answer over mTLS: "
        f"{dag['online_verify']['mean']:.2f} ms mean ({dag['online_verify']['p95']:.2f} p95).",
        f"The same signer calls alone in this run, p50: open grant {calls['delegate']['p50']:.2f} ms, co-signed "
        f"acceptance {calls['accept']['p50']:.2f} ms, receipt {calls['receipt']['p50']:.2f} ms; the critical path's "
        f"floor (grant + two receipts; the acceptance overlaps the tool call) {floor:.2f} ms, so the overhead is "
        f"{overhead_p50 / floor:.2f}x its floor.",
        f"The same evidence in the optional compact encoding (cs1z., spec 19.1), as carried: SIGNED-DAG "
        f"{dag['compact_bytes']:,} bytes, LINKED-LIST {conditions['linked_list']['compact_bytes']:,} bytes "
        f"(target < {PAPER['bytes_dag']:,}: {'met' if 0 < dag['compact_bytes'] < PAPER['bytes_dag'] else 'NOT met'}).",
        f"A claim made with the child's key alone: LINKED-LIST {claims['linked_list']}; "
        f"SIGNED-DAG {claims['signed_dag']}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve-child"]:
        serve_child(ChildConfig(**json.loads(FilePath(args[1]).read_text())))
        return 0
    if args[:1] == ["serve-tool"]:
        serve_tool(ToolConfig(**json.loads(FilePath(args[1]).read_text())))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.live_workflow", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="2 warm-ups and 5 tasks (a smoke run, not for figures)")
    parser.add_argument("--json", type=FilePath, help="also write the raw figures as JSON")
    parsed = parser.parse_args(args)
    results = run(*((2, 5) if parsed.quick else (WARMUP, TASKS)))
    print(report(results), flush=True)
    if parsed.json:
        parsed.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
