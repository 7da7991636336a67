"""The sync clients of ``countersign.client`` against a real mesh (loopback, mTLS): typed results in,
typed results out, every refusal a ServiceError with an ErrorCode member."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.client import (
    ErrorCode,
    EvidenceVerdict,
    Grant,
    OperatorClient,
    RetryPolicy,
    ServiceError,
    SignerClient,
    VerifierClient,
    delegate_with_retry,
    verify_with_failover,
)
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons

QUICK = RetryPolicy(attempts=4, attempt_timeout_s=2.0, deadline_s=10.0, backoff_base_s=0.01, backoff_max_s=0.05)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def signer_of(mesh: LocalMesh, deployer: str, lanes: int = 4) -> SignerClient:
    return SignerClient(mesh.daemons[deployer].address, mesh.tls_for(f"{deployer}-runtime"), deployer, lanes=lanes)


@pytest.fixture(params=[4, 0], ids=["lanes", "unary"])
def lanes(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture
def runtimes(client_mesh: LocalMesh, lanes: int) -> Iterator[dict[str, SignerClient]]:
    clients = {d: signer_of(client_mesh, d, lanes) for d in client_mesh.deployers}
    yield clients
    for client in clients.values():
        client.close()


@pytest.fixture
def verifier(client_mesh: LocalMesh, lanes: int) -> Iterator[VerifierClient]:
    with VerifierClient(client_mesh.daemons["verifier-0"].address, client_mesh.tls_for("client"), lanes=lanes) as v:
        yield v


def test_root_local_child_and_receipt(runtimes: dict[str, SignerClient], verifier: VerifierClient) -> None:
    a = runtimes["deployer-a"]
    root = a.root("planner", "client-sdk", ttl_ms=600_000, max_children=3)
    assert isinstance(root, Path)
    assert (root.leaf.record.deployer, root.leaf.record.depth, root.leaf.record.max_children) == ("deployer-a", 0, 3)
    helper = a.local_child(root, "helper", max_children=1)
    assert (helper.leaf.record.depth, helper.leaf.record.agent.instance) == (1, "helper")
    assert helper.envelopes[0].digest() == root.leaf.digest()
    output = b"a helper's output\n"
    receipt = a.receipt(helper, sha256(output), session="s-1")
    assert receipt.leaf.record.output is not None
    assert verifier.verify(receipt, output, audit=True)  # a Path or its bytes; audit consumes nothing
    assert not verifier.verify(receipt.to_bytes(), output + b"!", audit=True)


def test_open_grant_accept_verify_then_replay(
    client_mesh: LocalMesh, runtimes: dict[str, SignerClient], verifier: VerifierClient
) -> None:
    a, b = runtimes["deployer-a"], runtimes["deployer-b"]
    root = a.root("planner", "client-sdk")
    before = time.time_ns() // 1_000_000
    grant = a.open_grant(root, "deployer-b", ttl_ms=30_000)
    assert isinstance(grant, Grant)
    assert (grant.child_deployer, grant.parent_digest) == ("deployer-b", root.leaf.digest())
    assert grant.parent_key_id == client_mesh.deployer_keys["deployer-a"].key_id
    assert before <= grant.expires_ms <= time.time_ns() // 1_000_000 + 30_000
    assert len(grant.grant_id) == 32

    child = b.accept(root, grant, client_mesh.daemons["deployer-a"].address, "researcher")
    record = child.leaf.record
    assert (record.deployer, record.depth, record.agent.instance) == ("deployer-b", 1, "researcher")
    assert {c.key_id for c in record.cosigs} >= {grant.parent_key_id}  # the parent co-signed the edge

    output = b"the researcher's notes\n"
    receipt = b.receipt(child, sha256(output))
    verdict = verifier.verify(receipt, output)
    assert isinstance(verdict, EvidenceVerdict)
    assert verdict, verdict
    assert (verdict.reason, verdict.registry_sequence) == (None, 3)  # three deployers enrolled
    replay = verifier.verify(receipt.to_bytes(), output)
    assert not replay
    assert (replay.reason, replay.result.index, replay.registry_sequence) == (Reason.NONCE_REPLAYED, 2, 3)


def test_refusals_are_service_errors_with_an_error_code(
    client_mesh: LocalMesh, runtimes: dict[str, SignerClient]
) -> None:
    a, b, c = runtimes["deployer-a"], runtimes["deployer-b"], runtimes["deployer-c"]
    # deployer-c's signer may delegate to deployer-a only (its configuration).
    with pytest.raises(ServiceError) as refused:
        c.open_grant(c.root("writer", "client-sdk"), "deployer-b")
    assert refused.value.code is ErrorCode.POLICY_REFUSED
    # The root's own policy names the only deployer it may delegate to.
    restricted = a.root("restricted", "client-sdk", allowed_children=["deployer-c"])
    assert restricted.leaf.record.policy.allowed_children == ("deployer-c",)
    with pytest.raises(ServiceError) as by_record:
        a.open_grant(restricted, "deployer-b")
    assert by_record.value.code is ErrorCode.POLICY_REFUSED
    # A grant for deployer-c presented by deployer-b: the parent's signer refuses to co-sign.
    root = a.root("planner", "client-sdk")
    for_c = a.open_grant(root, "deployer-c")
    with pytest.raises(ServiceError) as wrong_child:
        b.accept(root, for_c, client_mesh.daemons["deployer-a"].address, "thief")
    assert wrong_child.value.code is ErrorCode.PARENT_REFUSED
    assert wrong_child.value.details.get("parent_code") == ErrorCode.GRANT_WRONG_CHILD
    assert not wrong_child.value.retryable


def test_unreachable_service_is_a_retryable_service_error(client_mesh: LocalMesh, nowhere: str) -> None:
    with VerifierClient(nowhere, client_mesh.tls_for("client"), lanes=0) as lost, pytest.raises(ServiceError) as error:
        lost.verify(b"{}", b"", timeout_s=2)
    assert error.value.code is ErrorCode.UNAVAILABLE
    assert error.value.retryable


def test_verify_with_failover_moves_past_a_dead_replica(
    client_mesh: LocalMesh, runtimes: dict[str, SignerClient], nowhere: str
) -> None:
    a = runtimes["deployer-a"]
    output = b"failover\n"
    receipt = a.receipt(a.root("failover", "client-sdk"), sha256(output))
    tls = client_mesh.tls_for("client")
    with VerifierClient(nowhere, tls) as dead, VerifierClient(client_mesh.daemons["verifier-0"].address, tls) as live:
        # The caller's own policy travels with every attempt; its refusal consumed nothing (spec 16.4).
        nobody = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-nobody"]}}')
        refused = verify_with_failover(
            [dead, live], receipt, output, QUICK, sleep=lambda _: None, consumer_policy=nobody
        )
        assert refused.result is not None and refused.result.reason is Reason.CONSUMER_POLICY_VIOLATION
        outcome = verify_with_failover([dead, live], receipt, output, QUICK, sleep=lambda _: None)
        assert outcome.accepted, outcome
        assert [(t.target, t.code, t.error) for t in outcome.attempts] == [
            (nowhere, "UNAVAILABLE", True), (live.address, "ACCEPT", False),
        ]  # fmt: skip
        # The same presentation again is a replay, not an uncertain accept.
        again = verify_with_failover([live], receipt, output, QUICK)
        assert not again.accepted
        assert again.result is not None and again.result.reason is Reason.NONCE_REPLAYED
        assert not again.replayed_after_unknown


def test_delegate_with_retry(client_mesh: LocalMesh, runtimes: dict[str, SignerClient]) -> None:
    a, b, c = runtimes["deployer-a"], runtimes["deployer-b"], runtimes["deployer-c"]
    root = a.root("planner", "client-sdk")
    address = client_mesh.daemons["deployer-a"].address
    done = delegate_with_retry(a, b, root, "deployer-b", address, "researcher", QUICK)
    assert (done.attempts, done.grants) == (["OK"], 1)
    assert done.path is not None and done.path.leaf.record.deployer == "deployer-b"
    # A refusal that no retry can cure is reported at once, with its code.
    writer = c.root("writer", "client-sdk")
    refused = delegate_with_retry(c, b, writer, "deployer-b", client_mesh.daemons["deployer-c"].address, "x", QUICK)
    assert (refused.path, refused.attempts, refused.grants) == (None, [ErrorCode.POLICY_REFUSED], 0)


def test_operator_client_log_and_a_refused_statement(client_mesh: LocalMesh) -> None:
    with OperatorClient(
        client_mesh.daemons["coordinator"].address, client_mesh.tls_for("operator"), client_mesh.operator
    ) as operator:
        log = operator.log()  # verified against the operator's own key
        enrolled = {s.statement.deployer for s in log.entries if s.statement.kind is StatementKind.ENROL_DEPLOYER}
        assert enrolled == set(client_mesh.deployers)
        key = client_mesh.deployer_keys["deployer-a"]
        public_key = b64url_encode(key.public_key)
        with pytest.raises(ServiceError) as refused:  # deployer-a is enrolled already
            operator.submit(StatementKind.ENROL_DEPLOYER, "deployer-a", key.key_id, public_key=public_key, at_ms=0)
        assert refused.value.code is ErrorCode.INVALID_STATEMENT
        assert operator.log().head_sequence == log.head_sequence
