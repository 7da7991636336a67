"""Scenario 1: the parent's zone is partitioned while a cross-deployer delegation is under way.

The child's signer (zone-b) asks the parent's signer (zone-a) to co-sign. Cut off, it must fail
closed with the typed ``PARENT_UNREACHABLE`` within its deadline (``cosign_timeout_ms``) and leave no
record behind; while partitioned the parent's grant is unused; after healing, delegation works again.

After healing, TCP delivers the abandoned request late: usually the child's cancellation arrives
with it and the parent never runs it; sometimes the parent co-signs it. Either way, retrying the
delegation under the same grant completes the edge the child first proposed (the child keeps it per
grant; the parent answers an identical edge the same way): one grant, one recorded child.

The second test loses only the *answer* (one-way loss, zone-a -> zone-b): the parent spends the
grant, the child fails closed; after healing the retry under the same grant completes the edge.
"""

from __future__ import annotations

import time

import pytest

from countersign.client.retry import RetryPolicy, delegate_with_retry
from countersign.errors import ServiceError
from countersign.records import Path
from tests.zones.helpers import children_count, grant_used, issued_count, poll, service_error

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

COSIGN_TIMEOUT_MS = 1_500
MARGIN_S = 1.0  # the child's own work, the runtime's call and scheduling on a loaded 2-CPU machine
# After healing, TCP retransmits what the partition held back at its next backoff step; waiting this
# long lets the child's abandoned edge (on its co-signing lane) reach the parent if it is going to.
SETTLE_S = 3.5
# The child's runtime makes one attempt per call: these tests watch the signer fail closed, which the
# SDK's failover would otherwise retry (PARENT_UNREACHABLE is retryable) until the call's timeout.
ONE_ATTEMPT = RetryPolicy(attempts=1, attempt_timeout_s=COSIGN_TIMEOUT_MS / 1000 + 3)


def test_partitioned_parent_fails_closed_then_heals(make_zones) -> None:
    zoned = make_zones(delay_ms=0.5, cosign_timeout_ms=COSIGN_TIMEOUT_MS)
    parent_runtime, child_runtime = zoned.runtime("deployer-a"), zoned.runtime("deployer-b", retry=ONE_ATTEMPT)
    address = zoned.signer_address("deployer-a", from_deployer="deployer-b")
    assert address != zoned.local.daemons["deployer-a"].address  # the co-sign goes through zone-b's proxy
    parent = parent_runtime.root("parent", "zones", max_children=8)
    parent_digest = parent.leaf.digest()
    # A delegation across the zones works, and leaves the child's channel to the parent open.
    child_runtime.accept(parent, parent_runtime.open_grant(parent, "deployer-b"), address, "before")
    grant = parent_runtime.open_grant(parent, "deployer-b")
    issued_before = issued_count(zoned, "deployer-b")
    children_before = children_count(zoned, "deployer-a", parent_digest)

    with zoned.partitioned("a"):
        started = time.monotonic()
        error = service_error(lambda: child_runtime.accept(parent, grant, address, "cut-off", timeout_s=10))
        elapsed = time.monotonic() - started
        assert error.code == "PARENT_UNREACHABLE", error
        assert elapsed <= COSIGN_TIMEOUT_MS / 1000 + MARGIN_S, f"failed after {elapsed:.2f} s, past its deadline"
        # Nothing was recorded by the child, nothing spent by the parent.
        assert issued_count(zoned, "deployer-b") == issued_before
        assert not grant_used(zoned, "deployer-a", grant.grant_id)
        assert children_count(zoned, "deployer-a", parent_digest) == children_before

    # Healed. The abandoned request may still be in a TCP send buffer; give it time to arrive.
    time.sleep(SETTLE_S)
    late_cosign = grant_used(zoned, "deployer-a", grant.grant_id)
    # Whatever the parent did, the child recorded nothing for the call that failed.
    assert issued_count(zoned, "deployer-b") == issued_before
    policy = RetryPolicy(attempts=10, attempt_timeout_s=5.0, deadline_s=30.0)
    # Whether or not the parent ran the abandoned request, retrying under the same grant re-sends the
    # edge first proposed, so it completes that edge: exactly one child for the grant, recorded.
    path = poll(same_grant_retry(child_runtime, parent, grant, address), timeout_s=30, interval_s=0.2)
    assert path.leaf.record.agent.instance == "cut-off", "the edge proposed before the partition"
    assert len(path.leaf.record.cosigs) == 2
    assert grant_used(zoned, "deployer-a", grant.grant_id)
    assert children_count(zoned, "deployer-a", parent_digest) == children_before + 1
    assert issued_count(zoned, "deployer-b") == issued_before + 1
    print(f"after healing the abandoned co-sign request was {'co-signed late' if late_cosign else 'dropped'}")
    # A fresh delegation (new grant) works in either case.
    fresh = delegate_with_retry(parent_runtime, child_runtime, parent, "deployer-b", address, "fresh", policy)
    assert fresh.path is not None, fresh.attempts
    assert fresh.path.leaf.record.deployer == "deployer-b"


def same_grant_retry(child_runtime, parent: Path, grant, address: str):
    """A check for ``poll``: the delegation retried under the same grant (None while the child's
    channel to the parent is still reconnecting after the partition)."""

    def check() -> Path | None:
        try:
            return child_runtime.accept(parent, grant, address, "again", timeout_s=5)
        except ServiceError as error:
            if error.code == "PARENT_UNREACHABLE":
                return None
            raise

    return check


def test_lost_answer_is_completed_by_retrying_the_same_grant(make_zones) -> None:
    """One-way loss: the edge reaches the parent, its answer never reaches the child.

    The parent spends the grant and a child slot; the child fails closed with PARENT_UNREACHABLE and
    records nothing. After healing, retrying the delegation under the same grant re-sends the edge
    the child proposed, the parent answers it again (same co-signature), and the child records it:
    one grant, one child, no spent grant left without a record.
    """
    zoned = make_zones(delay_ms=0.5, cosign_timeout_ms=COSIGN_TIMEOUT_MS)
    parent_runtime, child_runtime = zoned.runtime("deployer-a"), zoned.runtime("deployer-b", retry=ONE_ATTEMPT)
    address = zoned.signer_address("deployer-a", from_deployer="deployer-b")
    parent = parent_runtime.root("parent", "zones", max_children=8)
    parent_digest = parent.leaf.digest()
    child_runtime.accept(parent, parent_runtime.open_grant(parent, "deployer-b"), address, "before")
    grant = parent_runtime.open_grant(parent, "deployer-b")
    issued_before = issued_count(zoned, "deployer-b")
    children_before = children_count(zoned, "deployer-a", parent_digest)

    zoned.net.drop_one_way("a", "b")
    try:
        started = time.monotonic()
        error = service_error(lambda: child_runtime.accept(parent, grant, address, "answer-lost", timeout_s=10))
        elapsed = time.monotonic() - started
        assert error.code == "PARENT_UNREACHABLE", error
        assert elapsed <= COSIGN_TIMEOUT_MS / 1000 + MARGIN_S
        poll(lambda: grant_used(zoned, "deployer-a", grant.grant_id), timeout_s=5, what="the parent to co-sign")
    finally:
        zoned.net.heal()
    # The half-granted state: spent grant and child slot at the parent, no record at the child.
    assert issued_count(zoned, "deployer-b") == issued_before
    assert children_count(zoned, "deployer-a", parent_digest) == children_before + 1

    # Healed: the same grant completes the same edge; the parent spends nothing more.
    completed = poll(same_grant_retry(child_runtime, parent, grant, address), timeout_s=20, interval_s=0.2)
    assert completed.leaf.record.agent.instance == "answer-lost", "the edge proposed before the loss"
    assert issued_count(zoned, "deployer-b") == issued_before + 1
    assert children_count(zoned, "deployer-a", parent_digest) == children_before + 1
    policy = RetryPolicy(attempts=10, attempt_timeout_s=5.0, deadline_s=30.0)
    fresh = delegate_with_retry(parent_runtime, child_runtime, parent, "deployer-b", address, "fresh", policy)
    assert fresh.path is not None, fresh.attempts
    assert children_count(zoned, "deployer-a", parent_digest) == children_before + 2
