"""The wall clock, for the floors above the core (the core takes ``now_ms`` from its caller and reads
no clock: ADR 0001). One definition for the client, the plumbing, the daemons and the command line; it
imports nothing of theirs, so the command line reads it on the core alone."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the epoch, as records, statements and verdicts carry them."""
    return time.time_ns() // 1_000_000
