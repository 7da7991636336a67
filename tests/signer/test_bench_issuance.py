"""The issuance benchmark's in-process harness still drives the real signer handlers.

``bench/issuance.py`` calls the two signers' handlers directly (no gRPC) through one seam,
``SignerService._peer``; a change to the service that broke the seam would otherwise show only as
a failing benchmark run, long after the change.
"""

from __future__ import annotations

from bench.issuance import in_process_issuance


def test_in_process_issuance_runs_real_delegations() -> None:
    stats = in_process_issuance(20)
    assert stats["n"] == 20
    assert 0 < stats["p50"] <= stats["p99"]
