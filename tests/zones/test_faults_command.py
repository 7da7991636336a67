"""``python -m tools.zones faults`` (the second half of ``make zones``) end to end, with one fault and short
windows: it prints the table with a row per fault run, its exit code says whether the correctness targets
held, and it leaves no zone behind. (The faults themselves are asserted in test_replica_faults.py.)"""

from __future__ import annotations

import re

import pytest

from tools.zones.faults import FAULT_LABELS, main
from tools.zones.net import STATE_ROOT

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

NUMBER = r"\d+\.\d"


def test_faults_prints_one_row_per_fault(zones_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    runs_before = set(STATE_ROOT.glob("*")) if STATE_ROOT.exists() else set()
    argv = ["--only", "kill-coordinator", "--baseline-s", "4", "--fault-s", "7"]
    assert main(argv) == 0, "the correctness targets held"
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| fault | signing calls | failed after failover |"), table
    rows = table[2:]
    assert len(rows) == 1, table
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[0].startswith(FAULT_LABELS["kill-coordinator"]), cells
    assert int(cells[1]) > 50, "signing calls were made"
    assert cells[2:6] == ["0", "0 / 0", "0", "0"], cells  # failed, seq, grants used twice, over budget
    for cell in cells[6:8]:  # receipt and delegation p99, before -> during
        assert re.fullmatch(rf"{NUMBER} → {NUMBER}", cell), cell
    for cell in cells[8:10]:  # the fault's ratio, the baseline's own
        assert re.fullmatch(r"\d+\.\d\d×( ABOVE)?", cell), cell
    runs_after = set(STATE_ROOT.glob("*")) if STATE_ROOT.exists() else set()
    assert runs_after <= runs_before, f"zones left behind: {runs_after - runs_before}"
