"""``memory:``: the reference model behind a lock, for tests (state lives and dies with the process)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from countersign.signer_state import SignerStateModel, StateReads, StateView, StateWrite


class MemoryState:
    batches = True

    def __init__(self) -> None:
        self._model = SignerStateModel()
        self._lock = threading.Lock()

    def read(self, reads: StateReads) -> StateView:
        with self._lock:
            return self._model.read(reads)

    def apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        with self._lock:
            return self._model.apply_all(writes)

    def collect_expired(self, cutoff_ms: int, limit: int) -> dict[str, int]:
        with self._lock:
            return self._model.collect_expired(cutoff_ms)

    def row_counts(self) -> dict[str, int] | None:
        with self._lock:
            return self._model.row_counts()

    def close(self) -> None:
        return None
