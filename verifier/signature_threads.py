"""Signature checks split across threads: the verifier's, since the pure core starts no threads."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from countersign.verify import SERIAL, SignatureCheck, split_lanes


class ThreadedSignatures:
    """Splits a path's signatures across up to ``lanes`` threads (libsodium releases the GIL while it
    verifies), but only across cores no other path's signatures are being checked on.

    A verifier with ``cores`` CPUs counts the cores its signature checks occupy: a path takes as many
    lanes as there are free cores (at most ``lanes``, at least its own thread). Alone on an idle
    machine a depth-5 path's 13 checks run on two threads; on a verifier busy on every core each path
    is checked on its request's thread, with no hand-off, so the split costs a loaded service nothing.
    """

    def __init__(self, lanes: int = 2, cores: int | None = None) -> None:
        if lanes < 2:
            raise ValueError("use SerialSignatures for one lane")
        self._lanes = lanes
        self._cores = lanes if cores is None else cores
        if self._cores < 1:
            raise ValueError("cores must be at least 1")
        self._busy = 0  # cores the paths being checked now occupy
        self._lock = threading.Lock()
        # Every helper lane the count lets run gets a thread at once (threads start as needed): at most
        # all cores but the one each split path keeps for itself.
        self._pool = ThreadPoolExecutor(max_workers=max(1, self._cores - 1), thread_name_prefix="countersign-verify")

    def _take(self, checks: int) -> int:
        with self._lock:
            lanes = split_lanes(checks, self._lanes, self._cores - self._busy)
            self._busy += lanes
            return lanes

    def _give_back(self, lanes: int) -> None:
        with self._lock:
            self._busy -= lanes

    def first_failure(self, checks: Sequence[SignatureCheck]) -> SignatureCheck | None:
        lanes = self._take(len(checks))
        futures: list[Future[list[SignatureCheck]]] = []
        try:
            if lanes == 1:
                return SERIAL.first_failure(checks)
            parts = [checks[lane::lanes] for lane in range(lanes)]
            futures = [self._pool.submit(_failures, part) for part in parts[1:]]
            failures = _failures(parts[0])
            for future in futures:
                failures.extend(future.result())
            return min(failures, key=lambda c: c.order, default=None)
        finally:
            if futures:  # a lane that raised: the others still hold their cores until they finish
                wait(futures)
            self._give_back(lanes)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _failures(checks: Sequence[SignatureCheck]) -> list[SignatureCheck]:
    return [check for check in checks if not check.holds()]
