"""``python -m tools.zones measure`` (``make zones``) end to end, with a handful of samples: every row of its
table is printed for both storage profiles, with a figure and its two floors, and the run leaves no zone behind."""

from __future__ import annotations

import re

import pytest

from tools.zones.measure import VERIFICATIONS, main
from tools.zones.net import STATE_ROOT

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

NUMBER = r"\d+\.\d{3}"
VERDICTS = ("below", "ABOVE", "ABOVE (so is this host's floor)", "ABOVE (so is this design's floor here)")


def test_measure_prints_every_row_beside_its_floors(zones_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    runs_before = set(STATE_ROOT.glob("*")) if STATE_ROOT.exists() else set()
    argv = ["--profile", "both", "--issuances", "6", "--verifications", "6", "--revocations", "2", "--warmup", "2"]
    assert main(argv) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    issuance = [row for row in table if "co-signed cross-deployer issuance" in row]
    verifications = [row for row in table if "full verification" in row]
    revocations = [row for row in table if row.startswith("| revocation")]
    profiles = 2  # durable and fast-commit
    assert len(issuance) == profiles, table
    assert len(verifications) == profiles * len(VERIFICATIONS) and len(revocations) == profiles, table
    for row in issuance + verifications:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[3] == "6", row  # n
        assert all(re.fullmatch(NUMBER, cell) for cell in cells[4:8]), row  # mean, p50, p95, p99
        assert cells[8] in VERDICTS, row
        for floor in cells[9:11]:  # the raw floor, the design floor; each (ratio)
            assert re.fullmatch(rf"{NUMBER} \(\d+\.\d\d×\)", floor), row
    for row in revocations:
        assert re.search(rf"\| 2 \| {NUMBER} \|", row), row
    runs_after = set(STATE_ROOT.glob("*")) if STATE_ROOT.exists() else set()
    assert runs_after <= runs_before, f"zones left behind: {runs_after - runs_before}"
