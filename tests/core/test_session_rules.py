"""The signer's session rules (countersign/cosigning.py), offline: positions, closing, streams."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.cosigning import ChunkBuffer, EarlierClose, Refusal, SessionState, session_position, stream_spec
from countersign.errors import ErrorCode
from countersign.records import EMPTY_OUTPUT_SHA256, BindingScope, OutputReceipt, SessionClose, StreamChunk, StreamUnit

pytestmark = pytest.mark.offline

AGENT = "sha256:" + "a" * 64
LAST = "sha256:" + "b" * 64
TURN = OutputReceipt("sha256:" + "c" * 64, BindingScope.PER_TURN, "s", 0, None)
CLOSE = OutputReceipt(EMPTY_OUTPUT_SHA256, BindingScope.PER_SESSION, "s", 0, None, close=SessionClose(0, None))


def test_a_new_session_starts_at_zero_and_an_open_one_continues() -> None:
    assert session_position(None, agent_digest=AGENT, output=TURN, max_outputs=10) == (0, None)
    state = SessionState("s", AGENT, 4, LAST)
    assert session_position(state, agent_digest=AGENT, output=TURN, max_outputs=10) == (5, LAST)


@given(st.integers(0, 1000), st.booleans())
def test_a_closed_session_takes_no_receipt_and_answers_its_close_again(last_seq: int, closing: bool) -> None:
    state = SessionState("s", AGENT, last_seq, LAST, closed=True)
    answer = session_position(state, agent_digest=AGENT, output=CLOSE if closing else TURN, max_outputs=10_000)
    if closing:
        assert answer == EarlierClose(LAST)
    else:
        assert isinstance(answer, Refusal) and answer.code is ErrorCode.SESSION_CLOSED


def test_a_session_belongs_to_one_agent_and_is_bounded() -> None:
    other = session_position(SessionState("s", LAST, 0, LAST), agent_digest=AGENT, output=TURN, max_outputs=10)
    assert isinstance(other, Refusal) and other.code is ErrorCode.INVALID_ARGUMENT
    full = session_position(SessionState("s", AGENT, 9, LAST), agent_digest=AGENT, output=TURN, max_outputs=10)
    assert isinstance(full, Refusal) and full.code is ErrorCode.FANOUT_EXCEEDED
    # The close receipt is always allowed: a full session can still be closed.
    assert session_position(SessionState("s", AGENT, 9, LAST), agent_digest=AGENT, output=CLOSE, max_outputs=10) == (
        10,
        LAST,
    )


def test_a_stream_keeps_its_unit_and_n() -> None:
    chunk = OutputReceipt(TURN.sha256, BindingScope.PER_N_TOKENS, "s", 0, None, StreamChunk(StreamUnit.BYTES, 4, 4))
    state = SessionState("s", AGENT, 0, LAST, stream=(StreamUnit.TOKENS, 4))
    refused = session_position(state, agent_digest=AGENT, output=chunk, max_outputs=10)
    assert isinstance(refused, Refusal) and refused.code is ErrorCode.INVALID_ARGUMENT
    assert isinstance(stream_spec("words", 4), Refusal)
    assert isinstance(stream_spec("bytes", 0), Refusal)
    assert stream_spec("tokens", 16) == (StreamUnit.TOKENS, 16)


@given(st.lists(st.binary(max_size=40), max_size=12), st.integers(1, 16))
def test_a_bytes_stream_is_cut_into_chunks_of_n_that_join_to_the_input(pieces: list[bytes], n: int) -> None:
    buffer = ChunkBuffer(StreamUnit.BYTES, n)
    chunks: list[tuple[bytes, int]] = []
    for piece in pieces:
        done = buffer.add(piece, 0)
        assert not isinstance(done, Refusal)
        chunks.extend(done)
    rest = buffer.flush()
    assert all(len(data) == units == n for data, units in chunks)
    if rest is not None:
        assert 1 <= rest[1] == len(rest[0]) < n
        chunks.append(rest)
    assert b"".join(data for data, _ in chunks) == b"".join(pieces)


@given(st.lists(st.integers(1, 5), max_size=12), st.integers(1, 8))
def test_a_token_piece_never_straddles_a_chunk(counts: list[int], n: int) -> None:
    buffer = ChunkBuffer(StreamUnit.TOKENS, n)
    held = 0
    for count in counts:
        done = buffer.add(b"t" * count, count)
        if held + count > n:
            assert isinstance(done, Refusal) and done.code is ErrorCode.INVALID_ARGUMENT
            return
        assert not isinstance(done, Refusal)
        held = (held + count) % n
        assert [units for _, units in done] == ([n] if held == 0 else [])
