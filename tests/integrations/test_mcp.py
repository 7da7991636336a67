"""MCP with the real SDK, signing through real signer daemons (loopback, mTLS): a client calling an
unchanged server through ``countersign mcp-proxy`` (stdio), a server with the middleware in process
(stdio and Streamable HTTP), refusals as typed MCP errors, and the client-side checks rejecting a
tampered, dropped or reordered tool result."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path as FilePath
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from countersign.client import Consumer, Runtime
from countersign.errors import ErrorCode
from countersign.integrations.mcp import (
    DELEGATION_KEY,
    EVIDENCE_KEY,
    REFUSAL_CODE,
    EvidenceMissing,
    averify_result,
    check_session,
    delegation_meta,
    evidence_of,
    refusal,
    result_bytes,
    verify_result,
)
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.records import BindingScope
from countersign_cli.localmesh import LocalMesh
from tests.ports import free_port
from tests.runtime.conftest import mesh_registry, runtime_env

pytestmark = pytest.mark.daemons

ROOT = FilePath(__file__).parents[2]
TOOL_SERVER = str(FilePath(__file__).with_name("mcp_tool_server.py"))


def server_env(mesh: LocalMesh, deployer: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **runtime_env(mesh, deployer), **extra}


def proxied(env: Mapping[str, str]) -> StdioServerParameters:
    """The unchanged tool server behind ``countersign mcp-proxy``."""
    command = [sys.executable, "-m", "countersign_cli", "mcp-proxy", "--", sys.executable, TOOL_SERVER]
    return StdioServerParameters(command=command[0], args=command[1:], env=dict(env), cwd=str(ROOT))


def in_process(env: Mapping[str, str]) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[TOOL_SERVER, "--signed"], env=dict(env), cwd=str(ROOT))


@asynccontextmanager
async def over_stdio(params: StdioServerParameters) -> AsyncIterator[ClientSession]:
    with open(os.environ.get("MCP_TEST_ERRLOG", os.devnull), "a") as quiet:  # the child's own logs
        async with stdio_client(params, errlog=quiet) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def three_calls(session: ClientSession) -> list[CallToolResult]:
    return [
        await session.call_tool("echo", {"text": "hello"}),
        await session.call_tool("add", {"a": 2, "b": 3}),
        await session.call_tool("fail", {"why": "no such city"}),
    ]


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def assert_one_signed_session(results: list[CallToolResult], mesh: LocalMesh, deployer: str) -> None:
    registry = mesh_registry(mesh)
    agents = set()
    for seq, result in enumerate(results):
        verdict = verify_result(result, Consumer.offline(registry))
        assert verdict, verdict.result
        assert verdict.emitter is not None
        assert (verdict.emitter.deployer, verdict.emitter.seq) == (deployer, seq)
        receipt = evidence_of(result).leaf.record
        assert receipt.output is not None and receipt.output.binding_scope == BindingScope.PER_TOOL_CALL
        agents.add(verdict.emitter.agent)
    assert len(agents) == 1
    assert results[2].is_error is True  # a tool's own error is a result, signed like the others
    assert check_session(results, Consumer.offline(registry)).result


@pytest.mark.parametrize("wrap", [proxied, in_process], ids=["mcp-proxy", "middleware"])
def test_every_tool_result_of_a_stdio_session_is_signed_in_order(runtime_mesh: LocalMesh, wrap: Any) -> None:
    async def calls() -> list[CallToolResult]:
        async with over_stdio(wrap(server_env(runtime_mesh, "deployer-b"))) as session:
            tools = await session.list_tools()  # everything else passes through untouched
            assert {tool.name for tool in tools.tools} == {"echo", "add", "fail", "ran", "hang"}
            return await three_calls(session)

    results = run(calls())
    assert [block.text for block in results[0].content] == ["hello"]  # type: ignore[union-attr]
    assert results[1].structured_content == {"sum": 5}
    assert_one_signed_session(results, runtime_mesh, "deployer-b")


def test_each_client_session_is_its_own_agent_and_session(runtime_mesh: LocalMesh) -> None:
    async def two_sessions() -> list[list[CallToolResult]]:
        env = server_env(runtime_mesh, "deployer-c")
        return [await once(env), await once(env)]

    async def once(env: Mapping[str, str]) -> list[CallToolResult]:
        async with over_stdio(proxied(env)) as session:
            return await three_calls(session)

    first, second = run(two_sessions())
    registry = mesh_registry(runtime_mesh)
    assert evidence_of(first[0]).leaf.record.agent != evidence_of(second[0]).leaf.record.agent
    assert [evidence_of(r).leaf.record.output.seq for r in second] == [0, 1, 2]  # type: ignore[union-attr]
    assert check_session(first, Consumer.offline(registry)).result
    mixed = check_session([first[0], second[1]], Consumer.offline(registry)).result
    assert mixed.reason == Reason.SESSION_AGENT_MISMATCH


def test_a_tampered_result_is_rejected_online_and_offline(runtime_mesh: LocalMesh, registry_file: str) -> None:
    async def calls() -> list[CallToolResult]:
        async with over_stdio(proxied(server_env(runtime_mesh, "deployer-b"))) as session:
            return await three_calls(session)

    results = run(calls())
    echo = results[0]
    tampered = echo.model_copy(update={"content": [echo.content[0].model_copy(update={"text": "goodbye"})]})
    assert result_bytes(tampered) != result_bytes(echo)
    assert verify_result(tampered, Consumer.offline(registry_file)).reason == Reason.OUTPUT_MISMATCH
    flipped = results[2].model_copy(update={"is_error": False})  # an error passed off as a success
    assert verify_result(flipped, Consumer.offline(registry_file)).reason == Reason.OUTPUT_MISMATCH
    consumer = Consumer.online(runtime_mesh.daemons["verifier-0"].address, runtime_mesh.tls_for("client"))

    async def online() -> tuple[Any, Any]:
        async with consumer:
            return await averify_result(tampered, consumer), await averify_result(echo, consumer)

    mismatch, verdict = run(online())
    assert mismatch.reason == Reason.OUTPUT_MISMATCH
    assert verdict, verdict.result
    assert verdict.emitter is not None and verdict.emitter.deployer == "deployer-b"
    stripped = echo.model_copy(update={"meta": None})
    with pytest.raises(EvidenceMissing) as missing:
        verify_result(stripped, Consumer.offline(registry_file))
    assert missing.value.code == ErrorCode.INVALID_ARGUMENT


def test_dropped_reordered_and_repeated_results_are_detected(runtime_mesh: LocalMesh) -> None:
    async def calls() -> list[CallToolResult]:
        async with over_stdio(proxied(server_env(runtime_mesh, "deployer-b"))) as session:
            return await three_calls(session) + [await session.call_tool("echo", {"text": "last"})]

    r = run(calls())
    registry = mesh_registry(runtime_mesh)
    assert check_session(r, Consumer.offline(registry)).result
    cases = {
        Reason.SESSION_GAP: [r[0], r[2], r[3]],
        Reason.SESSION_REORDERED: [r[0], r[2], r[1], r[3]],
        Reason.SESSION_DUPLICATE: [r[0], r[1], r[1], r[2]],
    }
    for reason, shown in cases.items():
        assert check_session(shown, Consumer.offline(registry)).result.reason == reason
    changed = r[1].model_copy(update={"structured_content": {"sum": 6}})
    assert check_session([r[0], changed], Consumer.offline(registry)).result.reason == Reason.SESSION_OUTPUT_MISMATCH
    # each result alone still verifies: only the session shows what is missing
    assert all(verify_result(each, Consumer.offline(registry)) for each in (r[0], r[2], r[3]))
    # A consumer's own policy: an open session is not proven closed; a result alone never is.
    closed_only = parse_policy(b'{"v": 1, "policy": {"require_closed_session": true}}')
    refused = check_session(r, Consumer.offline(registry, consumer_policy=closed_only)).result
    assert (refused.reason, refused.index) == (Reason.CONSUMER_POLICY_VIOLATION, 0)
    assert (
        verify_result(r[0], Consumer.offline(registry, consumer_policy=closed_only)).reason
        is Reason.CONSUMER_POLICY_VIOLATION
    )


# --- refusals -----------------------------------------------------------------------------------


def refused(params: StdioServerParameters, meta: dict[str, Any] | None = None) -> MCPError:
    async def call() -> MCPError:
        async with over_stdio(params) as session:
            with pytest.raises(MCPError) as raised:
                await session.call_tool("echo", {"text": "hello"}, meta=meta)
            if meta is not None:  # the session is still usable, and the refused call never ran the tool
                ran = await session.call_tool("ran", {})
                assert ran.structured_content == {"result": []}
            return raised.value

    error: MCPError = run(call())
    assert error.code == REFUSAL_CODE
    return error


@pytest.mark.parametrize("wrap", [proxied, in_process], ids=["mcp-proxy", "middleware"])
def test_an_unreachable_signer_refuses_the_call_typed(runtime_mesh: LocalMesh, nowhere: str, wrap: Any) -> None:
    error = refused(wrap(server_env(runtime_mesh, "deployer-b", COUNTERSIGN_SIGNER=nowhere)))
    typed = refusal(error)
    assert typed is not None
    assert typed.code in (ErrorCode.UNAVAILABLE, ErrorCode.DEADLINE_EXCEEDED)


@pytest.mark.parametrize("wrap", [proxied, in_process], ids=["mcp-proxy", "middleware"])
def test_a_delegation_opens_the_session_under_the_delegating_agent(runtime_mesh: LocalMesh, wrap: Any) -> None:
    with Runtime.from_env(runtime_env(runtime_mesh, "deployer-a")) as parent:
        agent = parent.root("planner", "research")
        handoff = parent.delegate(agent, "deployer-b")

    async def calls() -> list[CallToolResult]:
        async with over_stdio(wrap(server_env(runtime_mesh, "deployer-b"))) as session:
            first = await session.call_tool("echo", {"text": "hello"}, meta=delegation_meta(handoff))
            return [first, await session.call_tool("add", {"a": 1, "b": 1})]

    results = run(calls())
    verdicts = [verify_result(result, Consumer.offline(mesh_registry(runtime_mesh))) for result in results]
    assert all(verdicts), [v.result for v in verdicts]
    assert verdicts[1].emitter is not None
    assert verdicts[1].emitter.lineage == ("deployer-a", "deployer-b", "deployer-b")
    assert check_session(results, Consumer.offline(mesh_registry(runtime_mesh))).result


@pytest.mark.parametrize("wrap", [proxied, in_process], ids=["mcp-proxy", "middleware"])
def test_a_delegation_for_another_deployer_or_expired_is_refused(runtime_mesh: LocalMesh, wrap: Any) -> None:
    with Runtime.from_env(runtime_env(runtime_mesh, "deployer-a")) as parent:
        agent = parent.root("planner", "research")
        for_b = parent.delegate(agent, "deployer-b")
        short = parent.delegate(agent, "deployer-b", ttl_ms=1)
    time.sleep(0.01)
    wrong = refusal(refused(wrap(server_env(runtime_mesh, "deployer-c")), delegation_meta(for_b)))
    assert wrong is not None and wrong.code == ErrorCode.GRANT_WRONG_CHILD
    expired = refusal(refused(wrap(server_env(runtime_mesh, "deployer-b")), delegation_meta(short)))
    assert expired is not None and expired.code == ErrorCode.GRANT_EXPIRED
    garbled = refusal(refused(wrap(server_env(runtime_mesh, "deployer-b")), {DELEGATION_KEY: "cs1.nonsense"}))
    assert garbled is not None and garbled.code == ErrorCode.INVALID_ARGUMENT


def test_the_proxy_without_signer_configuration_exits_2_before_starting_the_server() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "mcp-proxy", "--", sys.executable, TOOL_SERVER],
        env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "COUNTERSIGN_SIGNER is not set" in done.stderr
    assert "Traceback" not in done.stderr


# --- Streamable HTTP ----------------------------------------------------------------------------


@pytest.fixture
def http_tool_server(runtime_mesh: LocalMesh) -> Iterator[str]:
    """The tiny server with the middleware in process, on Streamable HTTP: its /mcp URL."""
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, TOOL_SERVER, "--signed", "--http", str(port)],
        env=server_env(runtime_mesh, "deployer-c"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # importing the SDK and uvicorn is slow on a loaded machine
        while True:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx2.TransportError:
                assert child.poll() is None, "the HTTP tool server exited"
                assert time.monotonic() < deadline, "the HTTP tool server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        child.terminate()
        child.wait(10)


def test_streamable_http_tool_results_are_signed_per_session(runtime_mesh: LocalMesh, http_tool_server: str) -> None:
    async def session_calls() -> list[CallToolResult]:
        async with streamable_http_client(http_tool_server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await three_calls(session)

    async def two() -> tuple[list[CallToolResult], list[CallToolResult]]:
        return await session_calls(), await session_calls()

    first, second = run(two())
    assert_one_signed_session(first, runtime_mesh, "deployer-c")
    assert_one_signed_session(second, runtime_mesh, "deployer-c")
    assert evidence_of(first[0]).leaf.record.agent != evidence_of(second[0]).leaf.record.agent
    assert EVIDENCE_KEY in (first[0].meta or {})


# --- the proxy's own bounds, settings and evidence (issue 29, issue 30) ----------------------------


def test_calls_the_client_cancelled_free_their_slots(runtime_mesh: LocalMesh) -> None:
    """Issue 29: after 1,024 tool calls that the client cancelled (``notifications/cancelled``, which
    the SDK sends when a caller stops waiting) and the server never answered, every new call was
    refused RESOURCE_EXHAUSTED. 1,100 cancelled calls, then one that is answered and signed."""

    async def calls() -> CallToolResult:
        async with over_stdio(proxied(server_env(runtime_mesh, "deployer-b"))) as session:
            await session.call_tool("echo", {"text": "first"})  # the session's agent record, once
            for _ in range(1_100):
                waiting = asyncio.ensure_future(session.call_tool("hang", {}))
                await asyncio.sleep(0.002)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            return await session.call_tool("echo", {"text": "still served"})

    result = asyncio.run(asyncio.wait_for(calls(), 180))
    assert [block.text for block in result.content] == ["still served"]  # type: ignore[union-attr]
    verdict = verify_result(result, Consumer.offline(mesh_registry(runtime_mesh)))
    assert verdict, verdict.result
    assert verdict.emitter is not None and verdict.emitter.seq == 1  # cancelled calls made no receipt


def proxy_config(mesh: LocalMesh, deployer: str, directory: FilePath) -> FilePath:
    """The proxy's settings as a file (what an MCP client's configuration points it at)."""
    tls = mesh.tls_for(f"{deployer}-runtime")
    config = directory / f"{deployer}-proxy.toml"
    config.write_text(
        f'signer = "{mesh.daemons[deployer].address}"\ndeployer = "{deployer}"\nca = "{tls.ca}"\n'
        f'cert = "{tls.cert}"\nkey = "{tls.key}"\nsystem = "proxied-tools"\n'
    )
    return config


def test_an_mcp_client_that_passes_no_environment_runs_the_proxy_from_its_settings_file(
    runtime_mesh: LocalMesh, tmp_path: FilePath
) -> None:
    """Issue 30: the ``mcp`` SDK's ``stdio_client`` gives the server it starts a bare default
    environment, so the proxy said ``COUNTERSIGN_SIGNER is not set``. With ``--config`` it signs."""
    config = proxy_config(runtime_mesh, "deployer-c", tmp_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "countersign_cli", "mcp-proxy", "--config", str(config), "--", sys.executable, TOOL_SERVER],
        cwd=str(ROOT),
    )  # no env: what stdio_client passes by default

    async def calls() -> list[CallToolResult]:
        async with over_stdio(params) as session:
            return await three_calls(session)

    results = run(calls())
    assert_one_signed_session(results, runtime_mesh, "deployer-c")
    assert evidence_of(results[0]).envelopes[0].record.agent.system == "proxied-tools"


def test_a_signing_server_behind_the_proxy_keeps_its_evidence_beside_the_proxys(
    runtime_mesh: LocalMesh, tmp_path: FilePath
) -> None:
    """Issue 29: the proxy replaced the evidence a signing server had put in ``_meta``. Now the
    server's (deployer-b, in process) is kept under ``countersign.dev/wrapped-evidence`` and the
    proxy's (deployer-a) is the evidence; both sign the same bytes and both verify."""
    from countersign.integrations.mcp import WRAPPED_EVIDENCE_KEY, wrapped_evidence_of

    config = proxy_config(runtime_mesh, "deployer-a", tmp_path)
    command = [
        "-m", "countersign_cli", "mcp-proxy", "--config", str(config), "--", sys.executable, TOOL_SERVER, "--signed",
    ]  # fmt: skip
    # The child server inherits this environment: it signs as deployer-b; the proxy, from its file, as a.
    params = StdioServerParameters(
        command=sys.executable, args=command, env=server_env(runtime_mesh, "deployer-b"), cwd=str(ROOT)
    )

    async def calls() -> list[CallToolResult]:
        async with over_stdio(params) as session:
            return await three_calls(session)

    results = run(calls())
    registry = mesh_registry(runtime_mesh)
    assert_one_signed_session(results, runtime_mesh, "deployer-a")
    inner: list[Any] = []
    for seq, result in enumerate(results):
        assert result.meta is not None and len(result.meta[WRAPPED_EVIDENCE_KEY]) == 1
        (path,) = wrapped_evidence_of(result)
        assert path.leaf.record.deployer == "deployer-b" and path.leaf.record.output.seq == seq  # type: ignore[union-attr]
        verdict = Consumer.offline(registry).path(path, result_bytes(result))
        assert verdict, verdict.result
        inner.append(path)
    assert len({p.leaf.record.agent for p in inner}) == 1  # the server's own session, in order
