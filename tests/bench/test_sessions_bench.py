"""``python -m bench --only sessions``: the verification rows are measured on valid sessions and the
table names the target, the floor and every row (the streaming half is run by ``make bench``)."""

from __future__ import annotations

import pytest

from bench.sessions import TARGET_RATIO, report, verification

pytestmark = pytest.mark.offline


def test_the_session_rows_are_measured_and_reported() -> None:
    rows = verification(sizes=(3, 12), rounds=2)
    assert [(r["outputs"], r["receipts"]) for r in rows] == [(3, 4), (12, 13)]
    for row in rows:
        assert row["raw_us"] > 0 and row["check_us"] > row["raw_us"] / 2
        # its signature and the reading besides, and its share of the agent path's 4 signatures
        assert row["floor_ratio"] > 1 + 4 / row["receipts"]
    lock = {"mean": 900.0, "p50": 800.0, "p95": 1500.0, "p99": 2000.0, "n": 10}
    streaming = {"chunks": 10, "chunk_bytes": 256, "receipts_per_s": 700.0, "lockstep_us": lock,
                 "unary_receipt_us": lock}  # fmt: skip
    table = report({"verification": rows, "streaming": streaming})
    assert table.count("\n| 3 |") + table.count("\n| 12 |") == 2
    assert f"≤ {TARGET_RATIO}x" in table and "receipts per second per signer" in table
    assert table.count(f"none (≤ {TARGET_RATIO}x from 100 outputs on)") == 2  # both rows are under 100 outputs
    hundred = {**rows[1], "outputs": 100, "receipts": 101, "ratio": TARGET_RATIO + 0.01, "floor_ratio": 1.1}
    table = report({"verification": [*rows, hundred], "streaming": streaming})
    assert f"| {TARGET_RATIO + 0.01:.2f}x (" in table and f"≤ {TARGET_RATIO}x missed |" in table
    assert "is above the target" not in table  # the rows under 100 outputs have no target to be above
