"""The issuance benchmark's in-process harness still drives the real signer handlers.

``bench/issuance.py`` calls the two signers' handlers directly (no gRPC) through one seam, the
``peers`` a ``SignerService`` is given (``signer.peers.Peers``); a change to the service that broke
the seam would otherwise show only as a failing benchmark run, long after the change.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import bench.issuance
from bench.issuance import in_process_issuance

pytestmark = pytest.mark.offline


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


def test_woken_issuance_idles_where_the_daemons_do_and_times_only_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``idle_s`` the harness sleeps before each issuance, before the parent decides and before
    the child resumes (three times an issuance, warm-up included), and leaves those sleeps out of the
    figure: a median under one sleep means none of the two inside the timed call was counted."""
    idle_s, count = 0.02, 4
    slept: list[float] = []
    real_sleep = bench.issuance.time.sleep

    caller = threading.get_ident()

    def recording_sleep(seconds: float) -> None:
        if threading.get_ident() == caller:  # not another test's background threads (time is shared)
            slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(bench.issuance.time, "sleep", recording_sleep)
    stats = in_process_issuance(count, idle_s=idle_s)
    assert slept == [idle_s] * 3 * (count + 50)
    assert stats["n"] == count
    assert 0 < stats["p50"] < idle_s * 1e6, stats
    slept.clear()
    in_process_issuance(2)
    assert slept == []  # back to back by default
