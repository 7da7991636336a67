"""Group commit: the writes of concurrent callers made durable together, in one call of the store
(one transaction, one flush), instead of one flush each.

The first caller to find no batch being written leads: it takes every item queued so far (its own
first among them, at most ``max_batch``), writes them in one call, and gives each of their callers
the outcome. Callers that arrive while a batch is being written wait; when the leader is done, it
hands the lead to the oldest of them. So each caller writes at most one batch, and none waits for
more than the batch in flight and its own. A lone caller writes a batch of one, as it would alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Waiter(Generic[T, R]):
    __slots__ = ("error", "item", "leads", "ready", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.ready = threading.Event()
        self.leads = False  # woken to write the next batch, not with an outcome
        self.error: BaseException | None = None
        self.result: R | None = None


class GroupApply(Generic[T, R]):
    """Calls ``write`` with batches of submitted items; ``write`` answers one result per item, in order
    (say, whether each conditional write held). A batch is written all or nothing as far as errors go:
    every caller of a batch whose ``write`` raised sees the error."""

    def __init__(self, write: Callable[[Sequence[T]], Sequence[R]], *, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._write = write
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: deque[_Waiter[T, R]] = deque()
        self._writing = False

    def submit(self, item: T) -> R:
        """Return ``item``'s result once its batch is written; raise what the write of its batch raised."""
        waiter: _Waiter[T, R] = _Waiter(item)
        with self._lock:
            self._queue.append(waiter)
            leads = not self._writing
            self._writing = True
        if not leads:
            waiter.ready.wait()
            leads = waiter.leads
        if leads:
            self._write_batch()
        if waiter.error is not None:
            raise waiter.error
        return waiter.result  # type: ignore[return-value]  # set by the batch's write

    def _write_batch(self) -> None:
        """Write the queue's head (the leader's own item first) and pass the lead on."""
        with self._lock:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        error: BaseException | None = None
        results: Sequence[R] = ()
        try:
            results = self._write([waiter.item for waiter in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} writes answered {len(results)} results")
        except BaseException as exc:  # every caller of the batch gets it; the lead still passes on
            error = exc
        with self._lock:
            if self._queue:
                following = self._queue[0]
                following.leads = True
                following.ready.set()
            else:
                self._writing = False
        for index, waiter in enumerate(batch):
            waiter.error = error
            waiter.result = None if error is not None else results[index]
            waiter.leads = False
            waiter.ready.set()


class GroupCommit(GroupApply[T, None]):
    """:class:`GroupApply` for writes that answer nothing: ``write`` must write a batch all or nothing
    (or, where the store cannot, say so to its callers: every caller of a failed batch sees the failure)."""

    def __init__(self, write: Callable[[Sequence[T]], None], *, max_batch: int = 64) -> None:
        def written(items: Sequence[T]) -> Sequence[None]:
            write(items)
            return [None] * len(items)

        super().__init__(written, max_batch=max_batch)
