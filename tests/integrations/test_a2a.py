"""A2A with the real a2a-sdk over real HTTP, signing through real signer daemons (loopback, mTLS): an A2A
client sends a delegated task to a child's JSON-RPC server, the artifact comes back signed and is
verified online and offline; a tampered artifact is rejected; refusals end the task FAILED with a
typed code, and the child's own executor never runs for them."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, Message, Part, Role, Task, TaskState

from countersign.client import Consumer, Delegation, ErrorCode, Runtime, ServiceError
from countersign.client.runtime import AsyncRuntime
from countersign.integrations.a2a import (
    RECEIPT_KEY,
    A2ARefusal,
    SignedExecutor,
    a2a_app,
    agent_extension,
    artifact_receipt,
    card_deployer,
    delegated_message,
    raise_for_refusal,
    send_task,
    task_refusal,
    verify_artifact,
)
from countersign.policy import ConsumerPolicy, parse_policy
from countersign.reasons import Reason
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.ports import free_port
from tests.runtime.conftest import runtime_env

pytestmark = pytest.mark.daemons

CHILD = "deployer-b"


class Echo(AgentExecutor):
    """The child's own executor: one artifact per task (``parts`` of them, to test shapes)."""

    def __init__(self, parts: int = 1) -> None:
        self.parts = parts
        self.runs: list[str] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        text = get_message_text(context.message)
        self.runs.append(text)
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        await updater.add_artifact([new_text_part(f"answer {n}: {text}") for n in range(self.parts)], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


@dataclass
class Child:
    url: str
    executor: Echo


def card(url: str) -> AgentCard:
    return AgentCard(
        name="echo",
        description="echoes the task, signed",
        version="1.0.0",
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)],
        capabilities=AgentCapabilities(streaming=False, extensions=[agent_extension(CHILD)]),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )


def serve(mesh: LocalMesh, executor: Echo, *, overlap_accept: bool = False, compact: bool = False) -> Iterator[Child]:
    """The child's A2A JSON-RPC server (deployer-b) on a loopback port, uvicorn in a thread."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = runtime_env(mesh, CHILD)
    signed = SignedExecutor(
        executor,
        lambda: AsyncRuntime.from_env(env),
        instance="echo",
        overlap_accept=overlap_accept,
        compact_receipts=compact,
    )
    server = uvicorn.Server(uvicorn.Config(a2a_app(signed, card(url)), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the child's A2A server did not start"
        time.sleep(0.02)
    try:
        yield Child(url, executor)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def child(runtime_mesh: LocalMesh) -> Iterator[Child]:
    yield from serve(runtime_mesh, Echo())


@pytest.fixture(scope="module")
def overlapping_child(runtime_mesh: LocalMesh) -> Iterator[Child]:
    yield from serve(runtime_mesh, Echo(), overlap_accept=True)


@pytest.fixture(scope="module")
def compact_child(runtime_mesh: LocalMesh) -> Iterator[Child]:
    yield from serve(runtime_mesh, Echo(), compact=True)


@pytest.fixture(scope="module")
def two_part_child(runtime_mesh: LocalMesh) -> Iterator[Child]:
    yield from serve(runtime_mesh, Echo(parts=2))


async def _send(url: str, message: Message) -> tuple[Task, AgentCard]:
    async with httpx.AsyncClient(timeout=30) as http:
        agent_card = await A2ACardResolver(http, url).get_agent_card()
        client = await create_client(agent_card, ClientConfig(streaming=False, httpx_client=http))
        try:
            return await send_task(client, message), agent_card
        finally:
            await client.close()


def send(url: str, message: Message) -> Task:
    return asyncio.run(_send(url, message))[0]


def delegation(runtime: Runtime, child: str = CHILD, ttl_ms: int = 60_000) -> Delegation:
    parent = runtime.root("planner", "a2a-tests")
    return runtime.delegate(parent, child, ttl_ms=ttl_ms)


def online(mesh: LocalMesh, consumer_policy: ConsumerPolicy | None = None) -> Consumer:
    """A consumer checking through the mesh's verifier, with the consumer's mTLS material."""
    return Consumer.from_env(runtime_env(mesh), consumer_policy=consumer_policy)


def test_a_delegated_task_comes_back_signed_and_verifies(
    child: Child, runtime: Callable[[str], Runtime], registry_file: str, runtime_mesh: LocalMesh
) -> None:
    parent = runtime("deployer-a")
    task, agent_card = asyncio.run(_send(child.url, delegated_message("the span is 486 m", delegation(parent))))
    assert card_deployer(agent_card) == CHILD
    raise_for_refusal(task)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (artifact,) = task.artifacts
    assert artifact.parts[0].text == "answer 0: the span is 486 m"
    assert RECEIPT_KEY in artifact.metadata.fields
    offline = verify_artifact(artifact, Consumer.offline(registry_file))
    assert offline and offline.emitter is not None
    assert offline.emitter.deployer == CHILD and offline.emitter.agent == "echo"
    assert offline.emitter.lineage == ("deployer-a", CHILD, CHILD)
    # A consumer's own policy refuses the same way online and offline, and consumes nothing (spec 16.4).
    parent_only = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-a"]}}')
    for gated in (
        Consumer.offline(registry_file, consumer_policy=parent_only),
        online(runtime_mesh, consumer_policy=parent_only),
    ):
        with gated:
            refused = verify_artifact(artifact, gated)
        assert (refused.reason, refused.result.index) == (Reason.CONSUMER_POLICY_VIOLATION, 1)
    with online(runtime_mesh) as consumer:
        accepted = verify_artifact(artifact, consumer)
        assert accepted, accepted.result
        assert accepted.emitter == offline.emitter
        # Accept mode: the verifier consumed the receipt's nonce, so the same artifact shown again is a replay.
        assert verify_artifact(artifact, consumer).reason is Reason.NONCE_REPLAYED


def test_a_tampered_artifact_is_rejected(child: Child, runtime: Callable[[str], Runtime], registry_file: str) -> None:
    task = send(child.url, delegated_message("the span is 486 m", delegation(runtime("deployer-a"))))
    (artifact,) = task.artifacts
    assert verify_artifact(artifact, Consumer.offline(registry_file))
    artifact.parts[0].text = artifact.parts[0].text.replace("486", "487")
    assert verify_artifact(artifact, Consumer.offline(registry_file)).reason is Reason.OUTPUT_MISMATCH
    del artifact.metadata[RECEIPT_KEY]
    assert verify_artifact(artifact, Consumer.offline(registry_file)).reason is Reason.MALFORMED


def test_a_receipt_moved_to_another_artifact_is_rejected(
    child: Child, runtime: Callable[[str], Runtime], registry_file: str
) -> None:
    parent = runtime("deployer-a")
    first = send(child.url, delegated_message("one", delegation(parent))).artifacts[0]
    second = send(child.url, delegated_message("two", delegation(parent))).artifacts[0]
    second.metadata[RECEIPT_KEY] = first.metadata[RECEIPT_KEY]
    assert verify_artifact(second, Consumer.offline(registry_file)).reason is Reason.OUTPUT_MISMATCH


def refused(task: Task) -> A2ARefusal:
    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert not task.artifacts
    refusal = task_refusal(task)
    assert refusal is not None
    with pytest.raises(ServiceError) as caught:
        raise_for_refusal(task)
    assert caught.value.code is refusal.code
    return refusal


def test_a_delegation_for_another_child_is_refused_typed(child: Child, runtime: Callable[[str], Runtime]) -> None:
    other = runtime("deployer-c")  # deployer-c may delegate to anyone: here to deployer-a, not the child
    runs = len(child.executor.runs)
    task = send(child.url, delegated_message("not for you", delegation(other, "deployer-a")))
    assert refused(task).code is ErrorCode.GRANT_WRONG_CHILD
    assert len(child.executor.runs) == runs, "the child's executor ran under a refused delegation"


def test_an_expired_handoff_is_refused_typed(child: Child, runtime: Callable[[str], Runtime]) -> None:
    handoff = delegation(runtime("deployer-a"), ttl_ms=1)
    time.sleep(0.01)
    runs = len(child.executor.runs)
    assert refused(send(child.url, delegated_message("too late", handoff))).code is ErrorCode.GRANT_EXPIRED
    assert len(child.executor.runs) == runs


def test_a_task_without_a_delegation_or_with_a_malformed_one_is_refused(
    child: Child, runtime: Callable[[str], Runtime]
) -> None:
    runs = len(child.executor.runs)
    bare = Message(role=Role.ROLE_USER, message_id="bare-1", parts=[Part(text="no delegation")])
    assert refused(send(child.url, bare)).code is ErrorCode.INVALID_ARGUMENT
    assert refused(send(child.url, delegated_message("bad", "cs1.AAAA"))).code is ErrorCode.INVALID_ARGUMENT
    not_a_string = delegated_message("bad", "cs1.x")
    not_a_string.metadata.update({next(iter(not_a_string.metadata.fields)): 7})
    assert refused(send(child.url, not_a_string)).code is ErrorCode.INVALID_ARGUMENT
    assert len(child.executor.runs) == runs


def receipt_of(task: Task) -> Path:
    return Path.from_bytes(artifact_receipt(task.artifacts[0]))


def test_a_replayed_handoff_spends_no_second_edge_and_a_forged_grant_is_refused(
    child: Child, runtime: Callable[[str], Runtime]
) -> None:
    handoff = delegation(runtime("deployer-a"))
    once = send(child.url, delegated_message("once", handoff))
    twice = send(child.url, delegated_message("twice", handoff))
    # The grant allows one edge: shown again, the child's signer gets the same co-signed record back
    # (an idempotent retry), so both answers hang under one child agent, never two.
    assert once.status.state == twice.status.state == TaskState.TASK_STATE_COMPLETED
    first, second = receipt_of(once), receipt_of(twice)
    assert first.envelopes[1].digest() == second.envelopes[1].digest()
    assert first.leaf.digest() != second.leaf.digest()
    fresh = delegation(runtime("deployer-a"))
    forged = dataclasses.replace(fresh, grant=dataclasses.replace(fresh.grant, grant_id=fresh.grant.grant_id[::-1]))
    assert refused(send(child.url, delegated_message("forged", forged))).code in (
        ErrorCode.GRANT_NOT_FOUND,
        ErrorCode.PARENT_REFUSED,
    )


def test_an_artifact_that_cannot_be_signed_fails_the_task_closed(
    two_part_child: Child, runtime: Callable[[str], Runtime]
) -> None:
    task = send(two_part_child.url, delegated_message("two parts", delegation(runtime("deployer-a"))))
    assert refused(task).code is ErrorCode.INVALID_ARGUMENT
    assert two_part_child.executor.runs == ["two parts"]


def test_accepting_while_the_executor_works_signs_the_same_and_leaks_nothing_on_a_refusal(
    overlapping_child: Child, runtime: Callable[[str], Runtime], registry_file: str
) -> None:
    task = send(overlapping_child.url, delegated_message("overlapped", delegation(runtime("deployer-a"))))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    (artifact,) = task.artifacts
    verdict = verify_artifact(artifact, Consumer.offline(registry_file))
    assert verdict and verdict.emitter is not None and verdict.emitter.lineage == ("deployer-a", CHILD, CHILD)
    # The executor may start before the refusal is known, but none of its events leave the child.
    for handoff, code in (
        (delegation(runtime("deployer-c"), "deployer-a"), ErrorCode.GRANT_WRONG_CHILD),
        (delegation(runtime("deployer-a"), ttl_ms=1), ErrorCode.GRANT_EXPIRED),
    ):
        time.sleep(0.01)
        assert refused(send(overlapping_child.url, delegated_message("refused", handoff))).code is code


def test_a_compact_receipt_verifies_the_same_and_a_damaged_one_is_malformed(
    compact_child: Child, runtime: Callable[[str], Runtime], registry_file: str
) -> None:
    task = send(compact_child.url, delegated_message("compact", delegation(runtime("deployer-a"))))
    (artifact,) = task.artifacts
    carried = artifact.metadata.fields[RECEIPT_KEY].string_value
    assert carried.startswith("cs1z.")
    path = Path.from_bytes(artifact_receipt(artifact))
    assert len(carried) < len(path.to_bytes())
    verdict = verify_artifact(artifact, Consumer.offline(registry_file))
    assert verdict and verdict.emitter is not None and verdict.emitter.deployer == CHILD
    artifact.metadata[RECEIPT_KEY] = carried[:-6]
    assert verify_artifact(artifact, Consumer.offline(registry_file)).reason is Reason.MALFORMED
