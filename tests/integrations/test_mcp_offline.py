"""The MCP binding without a mesh: the signed bytes of a tool result (vectors, and the same bytes from
the SDK's model as from the wire JSON for every result), the evidence's shape, and refusals read back
as typed errors."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path as FilePath
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult

from countersign.client import Consumer, ServiceError
from countersign.errors import ErrorCode, MalformedError
from countersign.integrations import mcp as binding
from countersign.integrations.mcp import (
    ERROR_KEY,
    EVIDENCE_KEY,
    REFUSAL_CODE,
    EvidenceMissing,
    evidence_of,
    refusal,
    refusal_error,
    result_bytes,
)
from countersign.registry import Registry

pytestmark = pytest.mark.offline

VECTORS = json.loads((FilePath(__file__).parents[1] / "vectors" / "mcp.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=lambda v: v["name"])
def test_the_signed_bytes_match_the_vectors(vector: dict[str, Any]) -> None:
    signed = result_bytes(vector["result"])
    assert signed == vector["signed_bytes"].encode("utf-8")
    assert "sha256:" + hashlib.sha256(signed).hexdigest() == vector["sha256"]
    # what a client reads through the SDK's model hashes the same
    assert result_bytes(CallToolResult.model_validate({"resultType": "complete", **vector["result"]})) == signed


text = st.text(max_size=20)
json_leaf = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | text
json_value = st.recursive(
    json_leaf, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=8
)
annotations = st.none() | st.fixed_dictionaries(
    {}, optional={"priority": st.floats(0, 1), "audience": st.just(["user"])}
)
text_block = st.fixed_dictionaries(
    {"type": st.just("text"), "text": text}, optional={"annotations": annotations, "_meta": st.none()}
)
image_block = st.fixed_dictionaries(
    {"type": st.just("image"), "data": st.just("iVBORw0KGgo="), "mimeType": st.sampled_from(["image/png", "image/gif"])}
)
results = st.fixed_dictionaries(
    {"content": st.lists(text_block | image_block, max_size=4)},
    optional={
        "isError": st.booleans(),  # the schema has no null here (absent is false)
        "structuredContent": st.none() | st.dictionaries(text, json_value, max_size=3),
        "_meta": st.dictionaries(st.sampled_from(["a.dev/x", "b.dev/y"]), json_value, max_size=2),
    },
)


@settings(max_examples=200, deadline=None)
@given(results)
def test_the_model_and_the_wire_json_of_any_result_sign_the_same_bytes(result: dict[str, Any]) -> None:
    model = CallToolResult.model_validate({"resultType": "complete", **result})
    assert result_bytes(model) == result_bytes(result)
    assert result_bytes({**result, "_meta": {EVIDENCE_KEY: {"v": 1}}}) == result_bytes(result)  # _meta unsigned


@settings(max_examples=200, deadline=None)
@given(results, st.integers(0, 3), text)
def test_changing_any_text_or_the_error_flag_changes_the_bytes(result: dict[str, Any], which: int, new: str) -> None:
    signed = result_bytes(result)
    flipped = {**result, "isError": not result.get("isError")}
    assert result_bytes(flipped) != signed
    texts = [i for i, block in enumerate(result["content"]) if block["type"] == "text"]
    if texts:
        index = texts[which % len(texts)]
        block = result["content"][index]
        if block["text"] != new:
            content = [*result["content"]]
            content[index] = {**block, "text": new}
            assert result_bytes({**result, "content": content}) != signed
    dropped = {**result, "content": result["content"][1:]}
    if result["content"]:
        assert result_bytes(dropped) != signed


@pytest.mark.parametrize(
    "bad", [{"content": "text"}, {"content": [], "isError": "yes"}, {"content": [{"type": "text", "n": 2**60}]}]
)
def test_a_result_without_a_canonical_form_is_malformed(bad: dict[str, Any]) -> None:
    with pytest.raises(MalformedError):
        result_bytes(bad)


def test_evidence_must_be_there_and_well_formed() -> None:
    with pytest.raises(EvidenceMissing) as missing:
        evidence_of({"content": []})
    assert missing.value.code == ErrorCode.INVALID_ARGUMENT
    for bad in ({"v": 2, "path": {}}, {"v": 1}, {"v": 1, "path": {}, "more": 1}, "cs1.x", {"v": True, "path": {}}):
        with pytest.raises(MalformedError):
            evidence_of({"content": [], "_meta": {EVIDENCE_KEY: bad}})
    malformed = {"content": [], "_meta": {EVIDENCE_KEY: {"v": 1, "path": {"v": 1}}}}
    verdict = binding.verify_result(malformed, Consumer.offline(Registry({})))
    assert not verdict
    assert verdict.reason is not None and verdict.reason.value == "MALFORMED"


def test_a_refusal_round_trips_as_a_typed_error() -> None:
    sent = refusal_error(ServiceError(ErrorCode.GRANT_EXPIRED, "too late", retryable=False))
    assert sent.code == REFUSAL_CODE
    assert sent.data == {ERROR_KEY: "GRANT_EXPIRED", "retryable": False}
    back = refusal(MCPError.from_error_data(sent.error))
    assert back is not None
    assert back.code == ErrorCode.GRANT_EXPIRED
    assert "too late" in str(back)
    assert refusal(MCPError(REFUSAL_CODE, "x", {ERROR_KEY: "NO_SUCH_CODE"})).code == ErrorCode.UNKNOWN  # type: ignore[union-attr]
    assert refusal(MCPError(-32603, "internal", {ERROR_KEY: "GRANT_EXPIRED"})) is None
    assert refusal(MCPError(REFUSAL_CODE, "no data")) is None
    assert refusal(ValueError("other")) is None


def test_without_the_sdk_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp_types", None)
    with pytest.raises(ImportError, match=r"countersign-mesh\[mcp\]"):
        binding.require_mcp()
    with pytest.raises(ImportError, match=r"countersign-mesh\[mcp\]"):
        binding.SigningMiddleware(system="s")


def test_sessions_past_the_bound_are_refused_not_evicted() -> None:
    class Connection:  # stands for the SDK's per-connection object: only its identity matters here
        pass

    middleware = binding.SigningMiddleware(system="s", max_sessions=2)
    first, second, third = Connection(), Connection(), Connection()
    kept = middleware.session_of(first)
    middleware.session_of(second)
    with pytest.raises(ServiceError) as full:
        middleware.session_of(third)
    assert full.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert middleware.session_of(first) is kept  # a live session keeps its agent and numbering
    del second  # a closed connection frees its place
    assert middleware.session_of(third) is not kept


class Sink:
    """The child's stdin as the proxy sees it: lines written, in order."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []

    def write(self, line: bytes) -> None:
        self.lines.append(line)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


def _reader(*messages: dict[str, Any]) -> Any:
    import asyncio

    reader = asyncio.StreamReader()
    for message in messages:
        reader.feed_data(json.dumps(message).encode() + b"\n")
    reader.feed_eof()
    return reader


def test_a_cancelled_call_frees_its_slot_and_its_late_answer_is_dropped() -> None:
    """Issue 29: the proxy held a cancelled call's slot for good. A cancellation frees it; an answer
    the server sends anyway is not relayed (the client ignores it, and signing it would put a receipt
    in the session that the client never holds)."""
    import asyncio

    from countersign.records import Path

    vector = json.loads((FilePath(__file__).parents[1] / "vectors" / "valid" / "linked-list.json").read_text())
    agent = Path.from_json(vector["presentation"]["path"])
    from countersign.integrations.kit import LazyRuntime
    from countersign_cli.mcp_relay import StdioProxy

    session = binding.SessionSigner(LazyRuntime(None), "tools", "proxy-1", agent=agent)
    proxy = StdioProxy(session, max_pending=1)
    child, replies = Sink(), []

    async def reply(line: bytes) -> None:
        replies.append(json.loads(line))

    async def relay() -> None:
        call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "hang"}}
        await proxy.from_client(
            _reader(
                {**call, "id": 1},
                {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
                {**call, "id": 2},  # the one slot is free again: relayed, not refused
            ),
            child,  # type: ignore[arg-type]
            reply,
        )
        late = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "late"}]}}
        refused = {"jsonrpc": "2.0", "id": 2, "error": {"code": -32000, "message": "no"}}
        await proxy.from_child(_reader(late, refused), reply)

    asyncio.run(relay())
    assert [json.loads(line).get("id") for line in child.lines] == [1, None, 2]  # the cancel passes on
    assert replies == [{"jsonrpc": "2.0", "id": 2, "error": {"code": -32000, "message": "no"}}]
    assert proxy.pending == set() and proxy.cancelled == {}
