"""``python -m bench --only signing``: real signer daemons stream receipts and the table compares group
commit with one commit per receipt, measured in the same rounds (a short run; ``make bench`` runs it
in full)."""

from __future__ import annotations

import pytest

from bench.signing import STREAMS, TARGET, report, run

pytestmark = [pytest.mark.daemons, pytest.mark.slow]


def test_the_signing_table_is_measured_in_the_same_rounds() -> None:
    results = run(quick=True)
    figures = results["receipts_per_s"]
    assert {"group commit", "one commit per receipt"} <= set(figures)
    for by in figures.values():
        assert by[STREAMS] > 0 and by[1] > 0  # every configuration really signed receipts
    assert results["ratio"] > 0 and results["ratio_min"] <= results["ratio"]
    table = report(results)
    assert f"target ≥ {TARGET:g}x" in table
    assert table.count("| group commit") >= 1 and "| one commit per receipt |" in table
