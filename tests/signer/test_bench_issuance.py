"""The issuance benchmark's in-process harness still drives the real signer handlers.

``bench/issuance.py`` calls the two signers' handlers directly (no gRPC) through one seam,
``SignerService._peer``; a change to the service that broke the seam would otherwise show only as
a failing benchmark run, long after the change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.issuance
from bench.issuance import in_process_issuance


def test_in_process_issuance_runs_real_delegations() -> None:
    stats = in_process_issuance(20)
    assert stats["n"] == 20
    assert 0 < stats["p50"] <= stats["p99"]


def test_in_process_issuance_keeps_its_state_where_it_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``zones measure`` times these handlers on the disk the daemons' state is on (tmpfs for its
    fast-commit profile): the signers' SQLite files go under the folder it names, and are removed."""
    removed: list[Path] = []
    real_rmtree = bench.issuance.shutil.rmtree

    def recording_rmtree(path: Path, ignore_errors: bool = False) -> None:
        removed.append(path)
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(bench.issuance.shutil, "rmtree", recording_rmtree)
    in_process_issuance(3, tmp_path)
    assert len(removed) == 1 and removed[0].parent == tmp_path, removed
    assert list(tmp_path.iterdir()) == []
