"""Every co-signature refusal fails closed with its typed code and leaves no record behind.

The child's runtime sees ``PARENT_REFUSED`` (FAILED_PRECONDITION) whose message names the parent
signer and the parent's own code; the parent's code itself is checked by calling ``CoSignEdge``
directly with the child signer's certificate. "No record" is checked in the signers' SQLite state:
no new ``issued`` row at the child, no new child at the parent, the grant unspent (then spent by an
honest retry, which proves it was still good).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from countersign._proto.v1.signer_pb2_grpc import SignerStub
from countersign.client import Grant, SignerClient
from countersign.errors import ServiceError
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import (
    channel_to,
    children_of,
    copy_request,
    delegate,
    grant_count,
    grant_row,
    hand_built_edge,
    issued_digests,
    now_ms,
    poll,
    service_error,
    signer_stub,
)

pytestmark = pytest.mark.daemons
REFUSED = grpc.StatusCode.FAILED_PRECONDITION


@pytest.fixture(scope="module")
def rt(mesh: LocalMesh) -> Iterator[dict[str, SignerClient]]:
    clients = {d: mesh.runtime(d) for d in mesh.deployers}
    yield clients
    for client in clients.values():
        client.close()


@pytest.fixture(scope="module")
def as_b_signer(mesh: LocalMesh) -> Iterator[SignerStub]:
    """deployer-a's signer, called with deployer-b's signer certificate (as b's signer would)."""
    channel = channel_to(mesh, "deployer-a", "deployer-b-signer")
    yield signer_stub(channel)
    channel.close()


class Snapshot:
    """What a refused delegation must leave unchanged."""

    def __init__(self, mesh: LocalMesh, parent: Path, child: str) -> None:
        self.mesh, self.parent, self.child = mesh, parent, child
        self.parent_deployer = parent.leaf.record.deployer
        self.issued = issued_digests(mesh, child)
        self.children = children_of(mesh, self.parent_deployer, parent.leaf.digest())

    def assert_unchanged(self) -> None:
        assert issued_digests(self.mesh, self.child) == self.issued, "the child signer stored a record"
        assert children_of(self.mesh, self.parent_deployer, self.parent.leaf.digest()) == self.children


def assert_parent_refused(error: object, parent: str, code: str) -> None:
    assert getattr(error, "code", None) == "PARENT_REFUSED", error
    assert getattr(error, "status", None) is REFUSED
    assert getattr(error, "retryable", None) is False
    assert str(error).startswith(f"parent signer {parent}: {code}: "), str(error)
    assert getattr(error, "details", {}).get("parent_code") == code, "the parent's code travels as data too"


def a_root(rt: dict[str, SignerClient], **agent: int) -> Path:
    return rt["deployer-a"].root(f"planner-{secrets.token_hex(4)}", "refusals", **agent)


def test_no_grant(mesh: LocalMesh, rt: dict[str, SignerClient], as_b_signer: SignerStub) -> None:
    root = a_root(rt)
    before = Snapshot(mesh, root, "deployer-b")
    missing = Grant(secrets.token_hex(16), "", mesh.deployer_keys["deployer-a"].key_id, "deployer-b", 0)
    error = service_error(lambda: rt["deployer-b"].accept(root, missing, mesh.daemons["deployer-a"].address, "r"))
    assert_parent_refused(error, "deployer-a", "GRANT_NOT_FOUND")
    before.assert_unchanged()

    direct = service_error(
        lambda: as_b_signer.CoSignEdge(hand_built_edge(mesh, root, missing.grant_id, "deployer-b"), timeout=10)
    )
    assert (direct.code, direct.status) == ("GRANT_NOT_FOUND", REFUSED)
    before.assert_unchanged()

    # A retry with a real grant works.
    child = delegate(mesh, root, "deployer-b", "r")
    assert child.leaf.digest() in issued_digests(mesh, "deployer-b")
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1


def test_wrong_child(mesh: LocalMesh, rt: dict[str, SignerClient], as_b_signer: SignerStub) -> None:
    root = a_root(rt)
    grant_for_c = rt["deployer-a"].open_grant(root, "deployer-c")
    before = Snapshot(mesh, root, "deployer-b")
    error = service_error(lambda: rt["deployer-b"].accept(root, grant_for_c, mesh.daemons["deployer-a"].address, "r"))
    assert_parent_refused(error, "deployer-a", "GRANT_WRONG_CHILD")
    direct = service_error(
        lambda: as_b_signer.CoSignEdge(hand_built_edge(mesh, root, grant_for_c.grant_id, "deployer-b"), timeout=10)
    )
    assert (direct.code, direct.status) == ("GRANT_WRONG_CHILD", REFUSED)
    before.assert_unchanged()
    row = grant_row(mesh, "deployer-a", grant_for_c.grant_id)
    assert row is not None
    assert row[3] is None, "a refused edge spent the grant"

    # A grant for another parent record is the wrong grant too.
    other_root = a_root(rt)
    grant_other = rt["deployer-a"].open_grant(other_root, "deployer-b")
    error = service_error(lambda: rt["deployer-b"].accept(root, grant_other, mesh.daemons["deployer-a"].address, "r"))
    assert_parent_refused(error, "deployer-a", "GRANT_WRONG_CHILD")
    before.assert_unchanged()

    # The grant is still good for the deployer it names.
    child = rt["deployer-c"].accept(root, grant_for_c, mesh.daemons["deployer-a"].address, "w")
    assert child.leaf.record.deployer == "deployer-c"
    assert grant_row(mesh, "deployer-a", grant_for_c.grant_id)[3] is not None  # type: ignore[index]


def test_used_grant(mesh: LocalMesh, rt: dict[str, SignerClient], as_b_signer: SignerStub) -> None:
    """One grant is one edge: asking the child's signer again returns the same record (a runtime that
    lost the answer gets it back), and the parent refuses any other edge under the spent grant."""
    root = a_root(rt)
    grant = rt["deployer-a"].open_grant(root, "deployer-b")
    first = rt["deployer-b"].accept(root, grant, mesh.daemons["deployer-a"].address, "r1")
    before = Snapshot(mesh, root, "deployer-b")
    assert first.leaf.digest() in before.issued
    assert before.children == 1
    again = rt["deployer-b"].accept(root, grant, mesh.daemons["deployer-a"].address, "r2")
    assert again.to_bytes() == first.to_bytes()
    before.assert_unchanged()
    other_edge = hand_built_edge(mesh, root, grant.grant_id, "deployer-b", instance="another")
    error = service_error(lambda: as_b_signer.CoSignEdge(other_edge, timeout=10))
    assert (error.code, error.status) == ("GRANT_USED", REFUSED)
    before.assert_unchanged()


def test_same_edge_retried_gets_the_same_cosignature(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    root = a_root(rt)
    grant = rt["deployer-a"].open_grant(root, "deployer-b")
    request = hand_built_edge(mesh, root, grant.grant_id, "deployer-b")
    channel = channel_to(mesh, "deployer-a", "deployer-b-signer")
    stub = signer_stub(channel)
    first = stub.CoSignEdge(request, timeout=10).parent_cosignature
    assert stub.CoSignEdge(copy_request(request), timeout=10).parent_cosignature == first
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1
    other_edge = hand_built_edge(mesh, root, grant.grant_id, "deployer-b", instance="another")
    error = service_error(lambda: stub.CoSignEdge(other_edge, timeout=10))
    assert (error.code, error.status) == ("GRANT_USED", REFUSED)
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1
    channel.close()


def test_fanout_exceeded(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    root = a_root(rt, max_children=1)
    delegate(mesh, root, "deployer-b", "r1")
    grant = rt["deployer-a"].open_grant(root, "deployer-b")
    before = Snapshot(mesh, root, "deployer-b")
    assert before.children == 1
    error = service_error(lambda: rt["deployer-b"].accept(root, grant, mesh.daemons["deployer-a"].address, "r2"))
    assert_parent_refused(error, "deployer-a", "FANOUT_EXCEEDED")
    before.assert_unchanged()
    # The same limit holds for the parent's own local children; receipts are counted apart (ADR 0018).
    local = service_error(lambda: rt["deployer-a"].local_child(root, "local"))
    assert (local.code, local.status) == ("FANOUT_EXCEEDED", REFUSED)
    assert rt["deployer-a"].receipt(root, b"\x00" * 32).leaf.record.max_children == 0
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1


def test_child_expiry_is_clamped_to_the_parent(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    root = a_root(rt, ttl_ms=60_000)
    child = delegate(mesh, root, "deployer-b", "r", ttl_ms=24 * 3_600_000)
    assert child.leaf.record.expires_ms == root.leaf.record.expires_ms


def test_expiry_beyond_parent_refused(mesh: LocalMesh, rt: dict[str, SignerClient], as_b_signer: SignerStub) -> None:
    root = a_root(rt, ttl_ms=60_000)
    grant = rt["deployer-a"].open_grant(root, "deployer-b")
    before = Snapshot(mesh, root, "deployer-b")
    request = hand_built_edge(mesh, root, grant.grant_id, "deployer-b", expires_ms=root.leaf.record.expires_ms + 1)
    error = service_error(lambda: as_b_signer.CoSignEdge(request, timeout=10))
    assert (error.code, error.status) == ("EXPIRY_EXCEEDS_PARENT", REFUSED)
    before.assert_unchanged()
    assert grant_row(mesh, "deployer-a", grant.grant_id)[3] is None  # type: ignore[index]
    # The unspent grant still serves an honest delegation.
    delegate_with = rt["deployer-b"].accept(root, grant, mesh.daemons["deployer-a"].address, "r")
    assert delegate_with.leaf.record.expires_ms == root.leaf.record.expires_ms


def test_expired_grant(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    root = a_root(rt)
    grant = rt["deployer-a"].open_grant(root, "deployer-b", ttl_ms=1)
    poll(lambda: now_ms() > grant.expires_ms, timeout_s=2, interval_s=0.005, what="the grant to expire")
    before = Snapshot(mesh, root, "deployer-b")
    error = service_error(lambda: rt["deployer-b"].accept(root, grant, mesh.daemons["deployer-a"].address, "r"))
    assert_parent_refused(error, "deployer-a", "GRANT_EXPIRED")
    before.assert_unchanged()


def test_child_not_allowed_by_signer_policy(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    # The shared mesh lets deployer-c delegate to deployer-a only.
    root = rt["deployer-c"].root("writer-root", "refusals")
    grants = grant_count(mesh, "deployer-c")
    error = service_error(lambda: rt["deployer-c"].open_grant(root, "deployer-b"))
    assert (error.code, error.status) == ("POLICY_REFUSED", REFUSED)
    assert "deployer-c does not delegate to deployer-b" in str(error)
    assert grant_count(mesh, "deployer-c") == grants
    assert rt["deployer-c"].open_grant(root, "deployer-a").grant_id  # the allowed deployer is fine


@pytest.mark.parametrize(
    ("restrict", "child", "message"),
    [
        (["deployer-c"], "deployer-b", "the parent record does not allow deployer-b"),
        (None, "deployer-z", "does not delegate to deployer-z"),
        (None, "deployer-a", "use IssueLocalChild"),
    ],
    ids=["record-policy", "unknown-deployer", "same-deployer"],
)
def test_open_grant_policy_refusals(
    mesh: LocalMesh, rt: dict[str, SignerClient], restrict: list[str] | None, child: str, message: str
) -> None:
    root = rt["deployer-a"].root("restricted", "refusals", ttl_ms=600_000, max_children=4, allowed_children=restrict)
    grants = grant_count(mesh, "deployer-a")
    error = service_error(lambda: rt["deployer-a"].open_grant(root, child))
    assert (error.code, error.status) == ("POLICY_REFUSED", REFUSED)
    assert message in str(error)
    assert grant_count(mesh, "deployer-a") == grants


def race(attempts: list[Callable[[], Path]]) -> tuple[list[Path], list[ServiceError]]:
    """Run the attempts at once; split the outcomes into issued paths and typed refusals."""
    start = threading.Barrier(len(attempts))

    def run(attempt: Callable[[], Path]) -> Path | ServiceError:
        start.wait(timeout=10)
        try:
            return attempt()
        except ServiceError as exc:
            return exc

    with ThreadPoolExecutor(len(attempts)) as pool:
        outcomes = list(pool.map(run, attempts))
    return [o for o in outcomes if isinstance(o, Path)], [o for o in outcomes if isinstance(o, ServiceError)]


def test_concurrent_delegations_never_exceed_max_children(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    root = a_root(rt, max_children=2)
    children = ["deployer-b", "deployer-c"] * 4
    grants = [rt["deployer-a"].open_grant(root, child) for child in children]
    parent = mesh.daemons["deployer-a"].address
    attempts = [
        (lambda i=i: rt[children[i]].accept(root, grants[i], parent, f"racer-{i}")) for i in range(len(children))
    ]
    won, lost = race(attempts)
    assert len(won) == 2
    assert len(lost) == len(children) - 2
    for error in lost:
        assert_parent_refused(error, "deployer-a", "FANOUT_EXCEEDED")
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 2
    for path in won:
        assert path.leaf.digest() in issued_digests(mesh, path.leaf.record.deployer)


def test_one_grant_raced_is_spent_once(mesh: LocalMesh, rt: dict[str, SignerClient]) -> None:
    """Six concurrent delegations under one grant are one edge: the first proposal is the one every
    racer sends (a retry re-sends the same edge), the parent co-signs it once, all get that record."""
    root = a_root(rt)
    grant = rt["deployer-a"].open_grant(root, "deployer-b")
    before = issued_digests(mesh, "deployer-b")
    parent = mesh.daemons["deployer-a"].address
    won, lost = race([(lambda i=i: rt["deployer-b"].accept(root, grant, parent, f"racer-{i}")) for i in range(6)])
    assert not lost
    assert len(won) == 6
    assert len({path.to_bytes() for path in won}) == 1
    assert issued_digests(mesh, "deployer-b") == before | {won[0].leaf.digest()}
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1
    # Asked again after it was sealed: the same record, still one child.
    assert rt["deployer-b"].accept(root, grant, parent, "late-racer").to_bytes() == won[0].to_bytes()
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1
