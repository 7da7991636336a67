"""The session attacks of the conformance harness: every one rejected, the control accepted."""

from __future__ import annotations

import pytest

from countersign.conformance import SESSION_CONSTRUCTIONS, SessionAttack, run_session_matrix

pytestmark = pytest.mark.offline


def test_every_session_attack_is_rejected_with_its_own_reason() -> None:
    cells = run_session_matrix(25, seed=7)
    assert len(cells) == len(SessionAttack) * len(SESSION_CONSTRUCTIONS)
    own_reason = {
        SessionAttack.REORDER: "SESSION_REORDERED",
        SessionAttack.DROP: "SESSION_GAP",
        SessionAttack.DUPLICATE: "SESSION_DUPLICATE",
        SessionAttack.CROSS_SESSION: "SESSION_MISMATCH",
        SessionAttack.CROSS_AGENT: "SESSION_AGENT_MISMATCH",
        SessionAttack.TRUNCATE_CLOSED: "SESSION_TRUNCATED",
        SessionAttack.SUBSTITUTE_CHUNK: "SESSION_OUTPUT_MISMATCH",
    }
    for cell in cells:
        assert cell.matches, cell
        if cell.attack is SessionAttack.HONEST:
            assert cell.accepted == cell.trials
        else:
            assert cell.reasons == {own_reason[cell.attack]: cell.trials}, cell
