"""ThreadedSignatures splits a path's checks only across cores no other path's checks occupy.

The checks here are stand-ins that record the thread they ran on (and can hold it), so the tests see
where each check ran; that the verdicts agree with the serial checker on real paths is held by the
property tests in test_verify.py and the daemon test in tests/mesh/test_verifier_signature_threads.py.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from countersign.verify import SignatureCheck
from verifier.signature_threads import ThreadedSignatures

pytestmark = pytest.mark.offline


class _Check:
    """A signature check that records its thread, can fail, and can wait for a release."""

    def __init__(self, order: int, *, holds: bool = True, release: threading.Event | None = None) -> None:
        self.order = (order, 0)
        self._holds = holds
        self._release = release
        self.started = threading.Event()
        self.thread: str | None = None

    def holds(self) -> bool:
        self.thread = threading.current_thread().name
        self.started.set()
        if self._release is not None:
            assert self._release.wait(10), "the test never released this check"
        return self._holds


def _checks(count: int) -> list[_Check]:
    return [_Check(n) for n in range(count)]


def _run(batch: ThreadedSignatures, checks: Sequence[_Check]) -> SignatureCheck | None:
    return batch.first_failure(checks)  # type: ignore[arg-type]  # duck-typed stand-ins


def _lanes(checks: Sequence[_Check]) -> int:
    """How many lanes the checks were split into: lane 0, which the calling thread runs, holds checks
    0, k, 2k, ... (the split deals checks out in turn), and no other lane ran on that thread."""
    caller = threading.current_thread().name
    mine = [n for n, check in enumerate(checks) if check.thread == caller]
    lanes = 1 if len(mine) == len(checks) else mine[1] - mine[0]
    assert mine == list(range(0, len(checks), lanes)), f"checks run on the calling thread: {mine}"
    return lanes


@pytest.fixture
def batch() -> Any:
    made: list[ThreadedSignatures] = []

    def make(lanes: int, cores: int) -> ThreadedSignatures:
        made.append(ThreadedSignatures(lanes, cores=cores))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_alone_a_path_uses_a_second_core(batch: Any) -> None:
    checks = _checks(13)
    assert _run(batch(2, 2), checks) is None
    assert _lanes(checks) == 2


def test_lanes_stop_at_the_cores_and_at_two_checks_a_lane(batch: Any) -> None:
    wide = _checks(13)
    _run(batch(4, 3), wide)
    assert _lanes(wide) == 3  # four lanes allowed, three cores
    few = _checks(5)
    _run(batch(4, 8), few)
    assert _lanes(few) == 2  # five checks: two lanes of two or more
    one_core = _checks(13)
    _run(batch(2, 1), one_core)
    assert _lanes(one_core) == 1


def test_while_another_path_holds_the_cores_a_path_is_checked_on_its_own_thread(batch: Any) -> None:
    shared = batch(2, 2)
    release = threading.Event()
    first = [_Check(n, release=release) if n == 1 else _Check(n) for n in range(13)]  # 1: the helper's lane
    runner = threading.Thread(target=_run, args=(shared, first), name="first-path")
    runner.start()
    try:
        assert first[1].started.wait(10)
        second = _checks(13)
        assert _run(shared, second) is None
        assert _lanes(second) == 1
    finally:
        release.set()
        runner.join(10)
    assert first[0].thread == "first-path" and first[1].thread != "first-path"  # it had split
    third = _checks(13)
    _run(shared, third)
    assert _lanes(third) == 2  # the cores were given back


def test_paths_split_at_the_same_time_do_not_wait_for_each_other(batch: Any) -> None:
    """On four cores two paths can each take two lanes; the second's helper lane must not queue behind
    the first's, which is held until the second has finished."""
    shared = batch(2, 4)
    release = threading.Event()
    first = [_Check(n, release=release) if n == 1 else _Check(n) for n in range(13)]
    runner = threading.Thread(target=_run, args=(shared, first), name="first-path")
    runner.start()
    try:
        assert first[1].started.wait(10)
        second = _checks(13)
        finished = threading.Event()
        threading.Thread(target=lambda: (_run(shared, second), finished.set()), name="second-path").start()
        assert finished.wait(10), "the second path's helper lane waited for the first path's"
        assert {check.thread for check in second[1::2]} - {"second-path"}  # it was split too
    finally:
        release.set()
        runner.join(10)


def test_the_first_failure_in_order_is_reported_split_or_not(batch: Any) -> None:
    for cores in (1, 2, 4):
        checks = [_Check(n, holds=n not in (4, 9)) for n in range(13)]
        failed = _run(batch(4, cores), checks)
        assert failed is checks[4]


class _Broken(_Check):
    def __init__(self, order: int) -> None:
        super().__init__(order)
        self.raised = threading.Event()

    def holds(self) -> bool:
        self.raised.set()
        raise RuntimeError("broken check")


def test_a_check_that_raises_gives_its_cores_back_once_every_lane_is_done(batch: Any) -> None:
    """The calling thread's lane raises (check 2) while the helper's lane is held (check 1): the error
    comes out only after the helper's lane has finished, and then the cores are free again."""
    shared = batch(2, 2)
    release = threading.Event()
    broken = _Broken(2)
    checks = [broken if n == 2 else _Check(n, release=release) if n == 1 else _Check(n) for n in range(13)]
    errors: list[BaseException] = []

    def run() -> None:
        try:
            _run(shared, checks)
        except RuntimeError as exc:
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        assert broken.raised.wait(10) and checks[1].started.wait(10)
        runner.join(0.2)
        assert runner.is_alive(), "the error came out while the helper's lane still held its core"
    finally:
        release.set()
        runner.join(10)
    assert [str(e) for e in errors] == ["broken check"]
    after = _checks(13)
    _run(shared, after)
    assert _lanes(after) == 2


def test_configuration_is_checked() -> None:
    with pytest.raises(ValueError, match="SerialSignatures"):
        ThreadedSignatures(1)
    with pytest.raises(ValueError, match="cores"):
        ThreadedSignatures(2, cores=0)
