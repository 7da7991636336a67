"""A progress bar on stderr for long commands, and tables whose columns line up.

The bar is drawn only when stderr is a terminal; otherwise (a log, a pipe, a CI job) plain lines
say how far it got, one at each tenth of the work and at least every few seconds, so nothing stays
silent for long and no carriage returns land in a file. Standard output is never written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

BAR_WIDTH = 30
LINE_EVERY_S = 5.0
"""Without a terminal, the longest silence between two progress lines (a line also marks each tenth)."""


class Progress:
    """``step()`` once per unit of work done out of ``total``; ``done()`` clears the bar."""

    def __init__(
        self,
        what: str,
        total: int,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total = max(total, 1)
        self.count = 0
        self._stream = sys.stderr if stream is None else stream
        self._tty = self._stream.isatty() if tty is None else tty
        self._clock = clock
        self._started = self._last_line = clock()
        self._tenths = 0
        if self._tty:
            self._draw()
        else:
            self._stream.write(f"{what}: {total} cells...\n")
            self._stream.flush()

    def step(self) -> None:
        self.count += 1
        if self._tty:
            self._draw()
            return
        now = self._clock()
        tenths = 10 * self.count // self.total
        if tenths > self._tenths or now - self._last_line >= LINE_EVERY_S:
            self._tenths, self._last_line = tenths, now
            self._stream.write(f"{self.what}: {self.count}/{self.total} cells, {now - self._started:.0f} s\n")
            self._stream.flush()

    def _draw(self) -> None:
        filled = BAR_WIDTH * self.count // self.total
        elapsed = self._clock() - self._started
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self._stream.write(f"\r{self.what} [{bar}] {self.count}/{self.total} cells {elapsed:.0f} s")
        self._stream.flush()

    def done(self) -> None:
        if self._tty:
            self._stream.write("\r\033[K")  # erase the bar: the table follows on stdout
            self._stream.flush()


def table(header: Sequence[str], rows: Sequence[Sequence[str]], *, first_left: bool = True) -> list[str]:
    """Lines of a table: every column as wide as its widest cell (header included), separated by
    " | ", the first column left-aligned and the others centred, a rule under the header."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            cell.ljust(width) if index == 0 and first_left else cell.center(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "-+-".join("-" * width for width in widths)
    return [line(header), rule, *(line(row) for row in rows)]
