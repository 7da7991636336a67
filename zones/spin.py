"""``python -m zones.spin``: keep one CPU out of its idle state at the lowest priority (SCHED_IDLE).

On a virtual machine an idle vCPU halts, and waking it costs tens to hundreds of microseconds at
every hand-off between processes; a request that crosses a few processes pays that several times.
A SCHED_IDLE busy loop runs only when nothing else wants the CPU, so it takes no time from the
measured processes but keeps the vCPU awake — what a dedicated host (or ``idle=poll``) gives.
``python -m zones measure --spin`` starts one per CPU; each dies with its parent (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def main() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        pass


if __name__ == "__main__":
    main()
