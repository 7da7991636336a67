"""Sessions through a real signer: receipts beyond max_children, CloseSession, streamed chunks, and a
restart that neither reuses a seq nor reopens a closed session (docs/spec.md 17.6, ADR 0018)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from countersign.client.signer import AsyncSignerClient
from countersign.keys import PublicKey
from countersign.reasons import Reason
from countersign.records import StreamUnit
from countersign.registry import KeyEntry, Registry
from countersign.sessions import SessionEvidence, check_session_evidence
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import children_of, now_ms, service_error, sha256

pytestmark = pytest.mark.daemons


def _registry(mesh: LocalMesh) -> Registry:
    return Registry({d: {k.key_id: KeyEntry(PublicKey(k.public_key), 0)} for d, k in mesh.deployer_keys.items()})


def test_restart_neither_reuses_a_seq_nor_reopens_a_closed_session(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",))
    a = mesh.runtime("deployer-a")
    agent = a.root("writer", "sessions", max_children=2)
    turns = [b"turn %d" % i for i in range(4)]  # more outputs than max_children: receipts are counted apart
    receipts = [a.receipt(agent, sha256(turn), session="chat").leaf for turn in turns[:3]]
    assert children_of(mesh, "deployer-a", agent.leaf.digest()) == 0
    a.close()

    mesh.kill("deployer-a")
    mesh.start("deployer-a")
    a = mesh.runtime("deployer-a")
    fourth = a.receipt(agent, sha256(turns[3]), session="chat").leaf
    assert fourth.record.output is not None
    assert (fourth.record.output.seq, fourth.record.output.prev) == (3, receipts[2].digest())
    receipts.append(fourth)
    close = a.close_session(agent, session="chat")
    assert close.leaf.record.output is not None and close.leaf.record.output.close is not None
    assert (close.leaf.record.output.close.count, close.leaf.record.output.close.last) == (4, fourth.digest())
    receipts.append(close.leaf)
    a.close()

    mesh.stop("deployer-a")
    mesh.start("deployer-a")
    a = mesh.runtime("deployer-a")
    error = service_error(lambda: a.receipt(agent, sha256(b"late"), session="chat"))
    assert error.code == "SESSION_CLOSED"
    assert a.close_session(agent, session="chat").to_bytes() == close.to_bytes()  # a retry: the same answer
    a.close()

    registry = _registry(mesh)
    session = SessionEvidence(agent, tuple(receipts))
    outputs: list[bytes | None] = [*turns, None]
    verdict = check_session_evidence(session, outputs, registry=registry, now_ms=now_ms(), require_closed=True).result
    assert verdict, verdict
    reordered = SessionEvidence(agent, (receipts[1], receipts[0], *receipts[2:]))
    result = check_session_evidence(reordered, registry=registry, now_ms=now_ms()).result
    assert (result.reason, result.index) == (Reason.SESSION_REORDERED, 0)


def test_streamed_chunks_chain_and_close(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",))
    a = mesh.runtime("deployer-a")
    agent = a.root("streamer", "sessions", max_children=0)
    pieces = [b"The qu", b"ick brown", b" fox"]  # 19 bytes: chunks of 8, 8 and 3
    chunks = a.stream_receipts(agent, pieces, session="stream", unit="bytes", n=8, close=True)
    assert [(c.seq, c.units, c.closed) for c in chunks] == [(0, 8, False), (1, 8, False), (2, 3, False), (3, 0, True)]
    first = chunks[0].path.leaf.record.output
    assert first is not None and first.stream is not None
    assert (first.stream.unit, first.stream.n) == (StreamUnit.BYTES, 8)
    data = b"".join(pieces)
    outputs: list[bytes | None] = [data[0:8], data[8:16], data[16:], None]
    session = SessionEvidence(agent, tuple(c.path.leaf for c in chunks))
    registry = _registry(mesh)
    assert check_session_evidence(session, outputs, registry=registry, now_ms=now_ms(), require_closed=True).result
    partial = SessionEvidence(agent, session.receipts[:2])  # delivered up to the second chunk
    assert check_session_evidence(partial, outputs[:2], registry=registry, now_ms=now_ms()).result
    assert service_error(lambda: a.receipt(agent, sha256(b"x"), session="stream")).code == "SESSION_CLOSED"

    # Tokens: the runtime counts; a piece that straddles a chunk boundary is refused.
    tokens = a.stream_receipts(agent, [(b"a b", 2), (b" c", 1), (b" d", 1)], session="tok", unit="tokens", n=3)
    assert [(c.seq, c.units) for c in tokens] == [(0, 3), (1, 1)]
    straddle = service_error(
        lambda: a.stream_receipts(agent, [(b"a b", 2), (b" c d", 2)], session="tok2", unit="tokens", n=3)
    )
    assert straddle.code == "INVALID_ARGUMENT"
    a.close()

    async def asynchronously() -> None:
        async with AsyncSignerClient(mesh.daemons["deployer-a"].address, mesh.tls_for("deployer-a-runtime"),
                                     "deployer-a") as client:  # fmt: skip
            streamed = await client.stream_receipts(agent, [b"abcd"], session="async", n=2, close=True)
            assert [(c.seq, c.closed) for c in streamed] == [(0, False), (1, False), (2, True)]
            again = await client.close_session(agent, session="async")
            assert again.to_bytes() == streamed[-1].path.to_bytes()

    asyncio.run(asynchronously())
