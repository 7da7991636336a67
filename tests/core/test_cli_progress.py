"""`countersign conformance` is not silent for a minute: a progress bar on stderr when it is a
terminal, plain progress lines otherwise (issue 29); and its tables' columns line up (issue 21)."""

from __future__ import annotations

import io

import pytest

from countersign_cli.main import main
from countersign_cli.progress import LINE_EVERY_S, Progress, table

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


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_pipe_gets_a_line_at_each_tenth_and_no_carriage_returns() -> None:
    """Issue 29: `conformance --trials 200` printed one line and then nothing for about 25 s."""
    stream, clock = io.StringIO(), _Clock()
    progress = Progress("conformance", 108, stream, clock=clock)
    for _ in range(108):
        clock.now += 0.2  # faster than a line every LINE_EVERY_S: only the tenths speak
        progress.step()
    progress.done()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "conformance: 108 cells..."
    assert [line.split(": ")[1].split(" cells")[0] for line in lines[1:]] == [
        f"{n}/108" for n in (11, 22, 33, 44, 54, 65, 76, 87, 98, 108)
    ]
    assert lines[-1] == "conformance: 108/108 cells, 22 s"
    assert "\r" not in stream.getvalue()


def test_a_pipe_hears_from_a_slow_run_at_least_every_few_seconds() -> None:
    stream, clock = io.StringIO(), _Clock()
    progress = Progress("conformance", 1_000, stream, clock=clock)
    for _ in range(40):  # 4 % of the work, 60 s: no tenth reached, a line every LINE_EVERY_S
        clock.now += 1.5
        progress.step()
    times = [float(line.rsplit(", ", 1)[1][:-2]) for line in stream.getvalue().splitlines()[1:]]
    gaps = [b - a for a, b in zip([0.0, *times[:-1]], times, strict=True)]
    assert len(times) == 60 // 6 and all(gap <= LINE_EVERY_S + 1.5 for gap in gaps), times


def test_conformance_prints_aligned_tables_and_its_progress_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--trials", "2", "--session-trials", "2"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()  # captured stderr is no terminal: plain lines
    assert lines[0] == "conformance: 108 cells..." and lines[-1].startswith("conformance: 108/108 cells, ")
    assert len(lines) >= 1 + 10  # a line at each tenth (and more if a cell took seconds)
    tables = captured.out.split("\n\n")[:2]
    for block in tables:
        lines = [line for line in block.splitlines() if line]
        assert len(lines) > 5
        positions = _bars(lines)
        assert all(p == positions[0] for p in positions), block
