"""Sessions through the runtime SDK against a real mesh (loopback, mTLS): close a session, stream an
output in chunks, sync and asyncio; the results typed, every refusal a ServiceError from the enum."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from countersign.client import ChunkReceipt, ClosedSession, ErrorCode, Runtime, ServiceError
from countersign.records import Path, StreamUnit
from countersign.sessions import SessionEvidence, check_session_evidence
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import async_runtime, mesh_registry

pytestmark = pytest.mark.daemons

Make = Callable[[str], Runtime]


def _check(mesh: LocalMesh, agent: Path, receipts: list[Path], outputs: list[bytes | None], closed: bool) -> object:
    session = SessionEvidence(agent, tuple(r.leaf for r in receipts))
    now = int(time.time() * 1000)
    return check_session_evidence(
        session, outputs, registry=mesh_registry(mesh), now_ms=now, require_closed=closed
    ).result


def test_a_closed_session_commits_to_its_count_and_refuses_more(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    agent = producer.root("writer-s1", "sessions")
    turns = [b"turn one\n", b"turn two\n", b"turn three\n"]
    receipts = [producer.receipt(agent, turn, session="chat-s1") for turn in turns]
    closed = producer.close_session(agent, session="chat-s1")
    assert isinstance(closed, ClosedSession)
    assert (closed.session, closed.count, closed.last) == ("chat-s1", 3, receipts[-1].leaf.digest())
    with pytest.raises(ServiceError) as refused:
        producer.receipt(agent, b"a fourth turn", session="chat-s1")
    assert refused.value.code is ErrorCode.SESSION_CLOSED
    assert producer.close_session(agent, session="chat-s1") == closed  # a retry answers the same receipt
    evidence = [*receipts, closed.path]
    assert _check(runtime_mesh, agent, evidence, [*turns, None], closed=True)
    truncated = _check(runtime_mesh, agent, receipts, list(turns), closed=True)
    assert not truncated and truncated.reason.name == "SESSION_TRUNCATED"  # type: ignore[attr-defined]


def test_the_default_session_is_the_agent_instance(runtime: Make) -> None:
    producer = runtime("deployer-a")
    agent = producer.root("writer-s2", "sessions")
    producer.receipt(agent, b"only turn")
    closed = producer.close_session(agent)
    assert (closed.session, closed.count) == ("writer-s2", 1)
    closed_empty = producer.close_session(agent, session="never-used")
    assert (closed_empty.count, closed_empty.last) == (0, None)


def test_closing_a_record_this_signer_did_not_issue_is_refused(runtime: Make) -> None:
    a, b = runtime("deployer-a"), runtime("deployer-b")
    foreign = b.root("writer-s3", "sessions")
    with pytest.raises(ServiceError) as refused:
        a.close_session(foreign)
    assert refused.value.code is ErrorCode.PARENT_UNKNOWN


def test_a_stream_is_signed_per_chunk_and_verifies_up_to_any_chunk(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    agent = producer.root("streamer-s4", "sessions")
    pieces = [b"The Golden ", b"Gate Bridge ", b"opened in 1937."]  # 38 bytes: chunks of 16, 16, 6
    chunks = producer.stream(agent, iter(pieces), session="answer-s4", n=16, close=True)
    assert all(isinstance(c, ChunkReceipt) for c in chunks)
    assert [(c.seq, c.units, c.closed) for c in chunks] == [(0, 16, False), (1, 16, False), (2, 6, False), (3, 0, True)]
    stream = chunks[0].path.leaf.record.output.stream  # type: ignore[union-attr]
    assert stream is not None and (stream.unit, stream.n) == (StreamUnit.BYTES, 16)
    data = b"".join(pieces)
    outputs: list[bytes | None] = [data[:16], data[16:32], data[32:], None]
    assert _check(runtime_mesh, agent, [c.path for c in chunks], outputs, closed=True)
    # Delivered only up to the second chunk: verifiable as far as it goes, not as a closed session.
    assert _check(runtime_mesh, agent, [c.path for c in chunks[:2]], outputs[:2], closed=False)
    substituted = _check(runtime_mesh, agent, [c.path for c in chunks], [data[:16], b"x" * 16, data[32:], None], True)
    assert not substituted and substituted.index == 1  # type: ignore[attr-defined]
    # Tokens: the runtime counts them; a piece that straddles a chunk boundary is refused, typed.
    tokens = producer.stream(agent, [(b"a b", 2), (b" c", 1)], session="tok-s4", unit="tokens", n=2)
    assert [(c.seq, c.units) for c in tokens] == [(0, 2), (1, 1)]
    with pytest.raises(ServiceError) as refused:
        producer.stream(agent, [(b"a", 1), (b" b c", 2)], session="tok2-s4", unit="tokens", n=2)
    assert refused.value.code is ErrorCode.INVALID_ARGUMENT


def test_the_asyncio_runtime_closes_and_streams(runtime_mesh: LocalMesh) -> None:
    async def scenario() -> None:
        async with async_runtime(runtime_mesh, "deployer-a") as producer:
            agent = await producer.root("writer-s5", "sessions")
            first = await producer.receipt(agent, b"turn one", session="chat-s5")
            chunks = await producer.stream(agent, [b"abcdef"], session="chat-s5", n=4)
            assert [(c.seq, c.units) for c in chunks] == [(1, 4), (2, 2)]
            closed = await producer.close_session(agent, session="chat-s5")
            assert (closed.count, closed.last) == (3, chunks[-1].path.leaf.digest())
            with pytest.raises(ServiceError) as refused:
                await producer.stream(agent, [b"late"], session="chat-s5", n=4)
            assert refused.value.code is ErrorCode.SESSION_CLOSED
            evidence = [first, *(c.path for c in chunks), closed.path]
            assert _check(runtime_mesh, agent, evidence, [b"turn one", b"abcd", b"ef", None], closed=True)

    asyncio.run(scenario())
