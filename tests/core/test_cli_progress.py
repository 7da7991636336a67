"""`countersign conformance` is not silent for a minute: a progress bar on stderr when it is a
terminal, one quiet line otherwise; and its tables' columns line up (issue 21, the first hour)."""

from __future__ import annotations

import io

import pytest

from countersign_cli.main import main
from countersign_cli.progress import Progress, table

pytestmark = pytest.mark.offline


def _bars(lines: list[str]) -> list[list[int]]:
    return [[i for i, ch in enumerate(line) if ch in "|+"] for line in lines]


def test_every_column_lines_up_whatever_the_widths() -> None:
    lines = table(["a long first header", "b", "c"], [["x", "a much longer cell", "≤1.00%"], ["yy", "z", ""]])
    positions = _bars(lines)
    assert all(p == positions[0] for p in positions), lines
    assert lines[0].startswith("a long first header |")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_that_fills_and_is_erased() -> None:
    stream = _Terminal()
    progress = Progress("conformance", 4, stream)
    for _ in range(4):
        progress.step()
    progress.done()
    text = stream.getvalue()
    assert text.count("\r") == 6  # drawn at start, after each of 4 steps, and erased
    assert "[" + "#" * 30 + "] 4/4 cells" in text
    assert text.endswith("\r\033[K")


def test_a_pipe_gets_one_quiet_line_and_no_carriage_returns() -> None:
    stream = io.StringIO()
    progress = Progress("conformance", 108, stream)
    for _ in range(108):
        progress.step()
    progress.done()
    assert stream.getvalue() == "conformance: 108 cells...\n"


def test_conformance_prints_aligned_tables_and_its_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--trials", "2", "--session-trials", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "conformance: 108 cells...\n"  # captured stderr is no terminal: one line
    tables = captured.out.split("\n\n")[:2]
    for block in tables:
        lines = [line for line in block.splitlines() if line]
        assert len(lines) > 5
        positions = _bars(lines)
        assert all(p == positions[0] for p in positions), block
