"""The mutation matrix reproduces the published pattern (fewer trials than the 1000 of the CLI run)."""

from __future__ import annotations

import math

import pytest

from countersign.conformance import EXPECTED_ACCEPTED, Attack, run_matrix, wilson_upper
from countersign.records import Construction

pytestmark = pytest.mark.offline

TRIALS = 25


@pytest.fixture(scope="module")
def cells():
    return run_matrix(TRIALS, seed=7)


def test_every_cell_matches_the_expected_pattern(cells) -> None:
    mismatches = [(c.attack.name, c.construction.value, c.accepted) for c in cells if not c.matches]
    assert not mismatches


def test_matrix_covers_every_construction_and_attack(cells) -> None:
    assert {(c.attack, c.construction) for c in cells} == {(a, k) for a in Attack for k in Construction}
    assert set(EXPECTED_ACCEPTED) == set(Attack)


def test_signed_dag_alone_rejects_the_child_key_graft(cells) -> None:
    graft = {c.construction: c for c in cells if c.attack is Attack.CHILD_KEY_GRAFT}
    assert graft[Construction.SIGNED_DAG].accepted == 0
    assert graft[Construction.SIGNED_DAG].reasons.get("BAD_COSIGNATURE") == TRIALS
    assert graft[Construction.LINKED_LIST].accepted == TRIALS
    assert graft[Construction.MERKLE].accepted == TRIALS


def test_honest_limits_are_reported_as_accepted(cells) -> None:
    for attack in (Attack.OWN_SUFFIX_REWRITE, Attack.BOTH_KEYS_FORGE):
        assert all(c.accepted == TRIALS for c in cells if c.attack is attack)


def test_fanout_is_caught_by_state_only_where_a_signed_parent_commitment_exists(cells) -> None:
    fanout = {c.construction: c for c in cells if c.attack is Attack.B5_FANOUT}
    for construction in (Construction.LINKED_LIST, Construction.MERKLE, Construction.SIGNED_DAG):
        assert fanout[construction].reasons == {"FANOUT_EXCEEDED": TRIALS}
    assert fanout[Construction.NAIVE_SIG].accepted == TRIALS


def test_a_changed_expectation_is_detected() -> None:
    """The harness really compares: flip one expectation and the same run reports a mismatch."""
    cell = run_matrix(3, seed=1, constructions=[Construction.LINKED_LIST], attacks=[Attack.CHILD_KEY_GRAFT])[0]
    assert cell.matches
    EXPECTED_ACCEPTED[Attack.CHILD_KEY_GRAFT][Construction.LINKED_LIST] = False
    try:
        assert not cell.matches
    finally:
        EXPECTED_ACCEPTED[Attack.CHILD_KEY_GRAFT][Construction.LINKED_LIST] = True


@pytest.mark.parametrize(
    ("successes", "trials", "upper"),
    [(0, 1000, 0.003827), (0, 3000, 0.001279), (1000, 1000, 1.0), (5, 100, 0.111754)],
)
def test_wilson_upper_bound(successes: int, trials: int, upper: float) -> None:
    assert math.isclose(wilson_upper(successes, trials), upper, abs_tol=5e-6)
