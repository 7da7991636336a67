"""An A2A parent delegates a task to a child agent on another deployer; the child's artifact comes back
signed, and any consumer checks it.

deployer-a (the parent) opens a grant and sends the handoff in its task message's metadata; the child
(an A2A JSON-RPC server on deployer-b, its executor wrapped with ``SignedExecutor``) accepts it through
its own signer and returns its answer as an artifact carrying the receipt; the parent verifies the
artifact's exact bytes with a verifier. A tampered artifact is rejected, and a delegation addressed to
another deployer fails the task with a typed code.

    python examples/a2a_delegation.py   # on the mesh COUNTERSIGN_MESH names, else a private local one

Needs ``pip install 'countersign-mesh[a2a]'`` (a2a-sdk with its HTTP server, and uvicorn).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.helpers.proto_helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Task, TaskState
from example_mesh import MeshSettings, the_mesh

from countersign.client import Consumer, Delegation, Runtime
from countersign.integrations.a2a import (
    SignedExecutor,
    a2a_app,
    agent_extension,
    card_deployer,
    delegated_message,
    send_task,
    task_refusal,
    verify_artifact,
)


class Summariser(AgentExecutor):
    """The child's own agent: it knows nothing of Countersign."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None  # a task message always has one
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        text = get_message_text(context.message)
        await updater.add_artifact(
            [new_text_part(f"Summary: {text.strip().rstrip('.')}, in one line.")], name="summary"
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def card(url: str, deployer: str) -> AgentCard:
    return AgentCard(
        name="summariser",
        description="summarises a text; every artifact signed by its deployer",
        version="1.0.0",
        supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)],
        capabilities=AgentCapabilities(streaming=False, extensions=[agent_extension(deployer)]),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="summarise", name="summarise", description="one-line summary", tags=["text"])],
    )


@contextmanager
def child_server(mesh: MeshSettings, deployer: str) -> Iterator[str]:
    """The child's A2A server on a loopback port, in a thread with its own event loop: its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/"
    # The runtime is made inside the server's event loop, on the first task.
    executor = SignedExecutor(Summariser(), lambda: mesh.async_runtime(deployer), instance="summariser")
    server = uvicorn.Server(uvicorn.Config(a2a_app(executor, card(url, deployer)), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the child's A2A server did not start")
        threading.Event().wait(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


async def ask(url: str, text: str, delegation: Delegation) -> tuple[Task, str | None]:
    async with httpx.AsyncClient(timeout=30) as http:
        agent_card = await A2ACardResolver(http, url).get_agent_card()
        client = await create_client(agent_card, ClientConfig(streaming=False, httpx_client=http))
        task = await send_task(client, delegated_message(text, delegation))
        await client.close()
    return task, card_deployer(agent_card)


def main(parent: Runtime, mesh: MeshSettings, consumer: Consumer) -> int:
    root = parent.root("planner", "a2a-example")
    with child_server(mesh, "deployer-b") as url:
        task, deployer = asyncio.run(ask(url, "The bridge opened in 1883.", parent.delegate(root, "deployer-b")))
        print("card deployer:", deployer)
        print("task:", TaskState.Name(task.status.state))
        (artifact,) = task.artifacts
        print("artifact:", artifact.parts[0].text)
        verdict = verify_artifact(artifact, consumer)
        emitter = verdict.emitter
        print(f"verified: {verdict.result.verdict} emitted by", emitter and emitter.deployer)
        print("lineage:", emitter and " -> ".join(emitter.lineage))
        artifact.parts[0].text = artifact.parts[0].text.replace("1883", "1884")
        print("tampered artifact:", verify_artifact(artifact, consumer, audit=True).reason)
        refused, _ = asyncio.run(ask(url, "Again.", parent.delegate(root, "deployer-c")))
        refusal = task_refusal(refused)
        print("delegation for deployer-c:", TaskState.Name(refused.status.state), refusal and refusal.code)
    return 0 if verdict else 1


if __name__ == "__main__":
    with the_mesh() as mesh, mesh.runtime("deployer-a") as parent, mesh.consumer() as consumer:
        code = main(parent, mesh, consumer)
    sys.exit(code)
