"""Which replica a client asks (countersign/client/failover.py ReplicaOrder): the order it names them in,
its own zone first; a replica that could not be reached is asked last for a while, longer after each
failure in a row, then first again; a failure that says nothing about the replica changes nothing."""

from __future__ import annotations

import pytest

from countersign.client.failover import ReplicaOrder, RetryPolicy
from countersign.errors import ErrorCode

pytestmark = pytest.mark.offline

POLICY = RetryPolicy(attempts=6, replica_down_s=5.0, backoff_base_s=0.0, backoff_max_s=0.0)


def first_round(order: ReplicaOrder) -> list[int]:
    return [index for index, _, _ in order.plan(30.0)][:3]


def test_replicas_are_asked_in_the_order_named_and_a_down_one_last(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("countersign.client.failover.time.monotonic", lambda: clock[0])
    order = ReplicaOrder(3, POLICY)
    assert first_round(order) == [0, 1, 2]
    order.failed(0, ErrorCode.UNAVAILABLE)
    assert first_round(order) == [1, 2, 0]
    order.answered(1)  # answering does not move a replica ahead of the one named first
    assert first_round(order) == [1, 2, 0]
    clock[0] += 5.1  # its time is up: asked first again (a restarted replica is back)
    assert first_round(order) == [0, 1, 2]
    order.failed(0, ErrorCode.UNAVAILABLE)  # a second failure in a row: twice as long
    clock[0] += 5.1
    assert first_round(order) == [1, 2, 0]
    clock[0] += 5.0
    assert first_round(order) == [0, 1, 2]
    order.answered(0)
    order.failed(0, ErrorCode.DEADLINE_EXCEEDED)  # answered in between: the count starts again
    clock[0] += 5.1
    assert first_round(order) == [0, 1, 2]


@pytest.mark.parametrize("code", [ErrorCode.STATE_CONFLICT, ErrorCode.STATE_UNAVAILABLE, ErrorCode.PARENT_UNREACHABLE])
def test_a_failure_of_the_request_or_the_shared_store_demotes_no_replica(code: ErrorCode) -> None:
    order = ReplicaOrder(2, POLICY)
    order.failed(0, code)
    assert first_round(order)[:2] == [0, 1]


def test_the_plan_keeps_to_the_attempts_and_wraps_round() -> None:
    plan = list(ReplicaOrder(2, RetryPolicy(attempts=5, backoff_base_s=0.0, backoff_max_s=0.0)).plan(30.0))
    assert [index for index, _, _ in plan] == [0, 1, 0, 1, 0]
    assert all(attempt_s <= 3.0 for _, attempt_s, _ in plan)
