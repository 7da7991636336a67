"""``python -m bench --only capacity``: what a receipt costs the signer's DynamoDB state, counted from the
requests the store's own code builds, and a stream that reads only for its first chunk (ADR 0033)."""

from __future__ import annotations

import pytest

from bench.capacity import report, run

pytestmark = pytest.mark.offline


def test_a_receipt_is_one_read_and_one_conditional_write_and_a_stream_reads_once() -> None:
    results = run(quick=True)
    assert results["receipts"] == results["stream_receipts"] == 50
    # A unary receipt: one read of what it decides from, one transaction of the record, the session and
    # the request id's answer, each at least one KB (a write unit) and twice that in a transaction.
    assert (results["reads_per_receipt"], results["writes_per_receipt"], results["items_per_write"]) == (1, 1, 3)
    assert results["write_units"] >= 2 * results["items_per_write"]
    # A stream decides each chunk from the session its last write left: its reads do not grow with its chunks.
    assert 1 <= results["stream_reads"] <= 2
    assert results["stream_writes"] == results["stream_receipts"]
    table = report(results)
    assert "1 TransactWriteItems of 3 items" in table and "One StreamReceipts call of 50 chunks" in table
    # A VerifyPath on DynamoDB: only accept consumes (one transaction); the replay stores no path again.
    verifier = results["verifier"]
    assert verifier["accept"]["operations"]["TransactWriteItems"] == 1
    assert "TransactWriteItems" not in verifier["audit"]["operations"]
    assert verifier["accept"]["write_units"] > verifier["audit"]["write_units"] > verifier["replay"]["write_units"] > 0
    assert "BatchWriteItem" not in verifier["replay"]["operations"]
    assert "| accept, a new path |" in table and "NONCE_REPLAYED" in table
