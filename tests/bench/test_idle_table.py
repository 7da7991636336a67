"""``python -m bench --only idle``: each variant waits as its row says, and the table reports every row
with its ratio to the back-to-back figure of the same run."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import bench.idle
from bench.idle import BUSY_MS, GAPS_MS, HANDLER_GAPS_MS, ROUNDS, report, run

pytestmark = pytest.mark.offline


def test_each_variant_waits_as_its_row_says(monkeypatch: pytest.MonkeyPatch) -> None:
    caller = threading.get_ident()
    slept: list[float] = []
    real_sleep = bench.idle.time.sleep

    def recording_sleep(seconds: float) -> None:
        if threading.get_ident() == caller:  # time is shared with other tests' background threads
            slept.append(seconds)
        real_sleep(seconds)

    handler_idles: list[float] = []

    def handlers(count: int, directory: Any = None, idle_s: float = 0.0) -> dict[str, float]:
        handler_idles.append(idle_s)  # the real harness is tested in tests/signer/test_bench_issuance.py
        return {"p50": 1000.0 * (1 + idle_s * 100)}

    monkeypatch.setattr(bench.idle.time, "sleep", recording_sleep)
    monkeypatch.setattr(bench.idle, "in_process_issuance", handlers)
    results = run(quick=True)
    per_variant = 60 // ROUNDS
    for ms in GAPS_MS:
        assert slept.count(ms / 1000) == ROUNDS * per_variant, ms
    assert len(slept) == ROUNDS * per_variant * len(GAPS_MS)  # the busy-wait does not sleep
    assert handler_idles == [0.0, *(ms / 1000 for ms in HANDLER_GAPS_MS)] * ROUNDS
    assert set(results["verify_p50_us"]) == {
        "back to back",
        *(f"after {ms:g} ms idle" for ms in GAPS_MS),
        f"after {BUSY_MS:g} ms busy-waiting",
    }
    assert results["issuance_handlers_p50_us"]["each part after 2 ms idle"] == 1200.0
    assert all(value > 0 for value in results["verify_p50_us"].values())


def test_the_table_gives_each_row_its_ratio_to_back_to_back() -> None:
    results = {
        "verify_p50_us": {"back to back": 50.0, "after 2 ms idle": 100.0},
        "issuance_handlers_p50_us": {"back to back": 1000.0, "each part after 0.5 ms idle": 1500.0},
    }
    text = report(results)
    assert "| after 2 ms idle | 100 | 2.00 |" in text
    assert "| each part after 0.5 ms idle | 1,500 | 1.50 |" in text
    assert text.count("| back to back |") == 2
