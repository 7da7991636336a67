"""Group commit of the verifier's verdict log (countersign/_daemon/group_commit.py): concurrent callers'
items written together, each written exactly once, each caller answered only after its own batch was
written and with that batch's outcome, and the lead handed on so nobody writes more than one batch."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

from countersign._daemon.group_commit import GroupCommit
from countersign.errors import StateUnavailable

pytestmark = pytest.mark.offline


class Writes:
    """A store's batched write: slow enough that callers pile up behind it, recording every batch."""

    def __init__(self, seconds: float = 0.005, failing: frozenset[int] = frozenset()) -> None:
        self.seconds = seconds
        self.failing = failing  # a batch holding any of these fails, all of it
        self.batches: list[tuple[int, ...]] = []
        self.writers: list[str] = []
        self.durable: set[int] = set()
        self._lock = threading.Lock()

    def __call__(self, items: Sequence[int]) -> None:
        time.sleep(self.seconds)
        with self._lock:
            self.batches.append(tuple(items))
            self.writers.append(threading.current_thread().name)
            if self.failing & set(items):
                raise StateUnavailable(f"batch {tuple(items)} not written")
            self.durable.update(items)


def test_a_lone_caller_writes_a_batch_of_one() -> None:
    writes = Writes(seconds=0)
    commits = GroupCommit(writes)
    for item in range(3):
        commits.submit(item)
    assert writes.batches == [(0,), (1,), (2,)]


def test_concurrent_callers_share_batches_and_return_only_once_written() -> None:
    writes = Writes()
    commits = GroupCommit(writes, max_batch=8)
    written_when_answered: dict[int, bool] = {}

    def call(item: int) -> None:
        commits.submit(item)
        written_when_answered[item] = item in writes.durable

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(200)))
    every = [item for batch in writes.batches for item in batch]
    assert sorted(every) == list(range(200))  # each item written exactly once
    assert all(written_when_answered.values()) and len(written_when_answered) == 200
    assert len(writes.batches) < 200 // 2, "callers waiting behind a write did not share a batch"
    assert max(len(batch) for batch in writes.batches) <= 8


def test_a_failed_batch_fails_exactly_its_own_callers() -> None:
    writes = Writes(failing=frozenset({7}))
    commits = GroupCommit(writes)
    outcomes: dict[int, str] = {}

    def call(item: int) -> None:
        try:
            commits.submit(item)
            outcomes[item] = "written"
        except StateUnavailable:
            outcomes[item] = "refused"

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(call, range(40)))
    (failed,) = [batch for batch in writes.batches if 7 in batch]
    assert {item for item, outcome in outcomes.items() if outcome == "refused"} == set(failed)
    assert {item for item, outcome in outcomes.items() if outcome == "written"} == writes.durable
    assert len(outcomes) == 40  # the lead passed on after the failure: nobody was left waiting


def test_each_caller_writes_at_most_one_batch() -> None:
    """A batch is written by the caller whose item heads it, and the lead passes to the oldest waiter
    after each batch: under a steady stream of callers no thread keeps writing other callers' batches
    while its own answer waits behind them."""
    writes = Writes(seconds=0.002)
    commits = GroupCommit(writes, max_batch=4)
    submitter: dict[int, str] = {}

    def call(item: int) -> None:
        submitter[item] = threading.current_thread().name
        commits.submit(item)

    with ThreadPoolExecutor(12, thread_name_prefix="caller") as pool:
        list(pool.map(call, range(300)))
    assert [submitter[batch[0]] for batch in writes.batches] == writes.writers
    assert len(writes.batches) < 300 // 2


def test_an_unexpected_error_reaches_every_caller_of_its_batch() -> None:
    def broken(items: Sequence[int]) -> None:
        raise ZeroDivisionError("a bug in the store")

    commits = GroupCommit(broken)
    with pytest.raises(ZeroDivisionError):
        commits.submit(1)
    with pytest.raises(ZeroDivisionError):  # and the next caller leads again instead of waiting forever
        commits.submit(2)


def test_max_batch_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(Writes(), max_batch=0)
