"""The admission registry in a running mesh: revocation, unenrolled deployers, refused statements."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from countersign._proto.v1 import coordinator_pb2
from countersign.admission import SignedStatement, Statement, StatementKind, sign_statement
from countersign.canonical import b64url_encode
from countersign.client import Grant
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import (
    channel_to,
    coordinator_stub,
    delegate,
    grant_row,
    hand_built_edge,
    issued_digests,
    now_ms,
    poll,
    service_error,
    sha256,
    signer_stub,
)

pytestmark = pytest.mark.daemons
DENIED = grpc.StatusCode.PERMISSION_DENIED


def test_revocation_reaches_a_running_verifier(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"))
    b = mesh.runtime("deployer-b")
    output = b"signed by b\n"
    own = b.receipt(b.root("researcher", "revocation"), sha256(output))
    via_a = delegate(mesh, mesh.runtime("deployer-a").root("planner", "revocation"), "deployer-b", "r")
    via_a_receipt = b.receipt(via_a, sha256(output))
    verifier = mesh.verifier_client()
    for path in (own, via_a_receipt):
        verdict = verifier.verify(path.to_bytes(), output, audit=True)
        result, sequence = verdict.result, verdict.registry_sequence
        assert (bool(result), sequence) == (True, 2), result
    verifier_pid = mesh.daemons["verifier-0"].process.pid  # type: ignore[union-attr]

    operator = mesh.operator_client()
    operator.submit(StatementKind.REVOKE_KEY, "deployer-b", mesh.deployer_keys["deployer-b"].key_id, note="stolen")
    operator.close()
    revoked_at = time.monotonic()

    def revoked() -> tuple[object, int] | None:
        verdict = verifier.verify(own.to_bytes(), output, audit=True)
        result, sequence = verdict.result, verdict.registry_sequence
        return (result, sequence) if result.reason == "KEY_REVOKED" else None

    result, sequence = poll(revoked, timeout_s=5, what="KEY_REVOKED")
    assert time.monotonic() - revoked_at < 5
    assert (getattr(result, "index", None), sequence) == (0, 3)
    through = verifier.verify(via_a_receipt.to_bytes(), output, audit=True).result
    assert (through.reason, through.index) == ("KEY_REVOKED", 1)
    assert mesh.daemons["verifier-0"].process.pid == verifier_pid  # type: ignore[union-attr]
    assert mesh.daemons["verifier-0"].alive

    # The parent's signer no longer co-signs for the revoked key either.
    a = mesh.runtime("deployer-a")
    root = a.root("planner-2", "revocation")

    def refused() -> object:
        error = service_error(
            lambda: b.accept(root, a.open_grant(root, "deployer-b"), mesh.daemons["deployer-a"].address, "late")
        )
        return error if "NOT_AUTHORISED" in str(error) else None

    error = poll(refused, timeout_s=5, what="deployer-a to refuse the revoked key")
    assert getattr(error, "code", None) == "PARENT_REFUSED"
    for client in (a, b, verifier):
        client.close()


def test_unenrolled_deployer_is_rejected(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b", "deployer-d"), enrol=["deployer-a", "deployer-b"])
    a, d = mesh.runtime("deployer-a"), mesh.runtime("deployer-d")
    parent = mesh.daemons["deployer-a"].address

    # Its own paths: the signer signs (it holds the key), but no verifier admits them.
    output = b"from an unenrolled deployer\n"
    own = d.receipt(d.root("rogue", "unenrolled"), sha256(output))
    verifier = mesh.verifier_client()
    verdict = verifier.verify(own.to_bytes(), output, audit=True)
    result, sequence = verdict.result, verdict.registry_sequence
    assert (result.reason, result.index, sequence) == ("UNKNOWN_DEPLOYER", 0, 2)
    verifier.close()

    # No grant can name it, and a grant for someone else does not get it a co-signature.
    root = a.root("planner", "unenrolled")
    error = service_error(lambda: a.open_grant(root, "deployer-d"))
    assert (error.code, error.status) == ("POLICY_REFUSED", grpc.StatusCode.FAILED_PRECONDITION)
    assert "not an enrolled deployer" in str(error)
    grant = a.open_grant(root, "deployer-b")
    before = issued_digests(mesh, "deployer-d")
    error = service_error(lambda: d.accept(root, grant, parent, "rogue-child"))
    assert error.code == "PARENT_REFUSED"
    assert str(error).startswith("parent signer deployer-a: NOT_AUTHORISED: ")
    assert issued_digests(mesh, "deployer-d") == before

    # Asked directly, with its own signer certificate from the mesh CA and a record signed by its key.
    channel = channel_to(mesh, "deployer-a", "deployer-d-signer")
    request = hand_built_edge(mesh, root, grant.grant_id, "deployer-d")
    error = service_error(lambda: signer_stub(channel).CoSignEdge(request, timeout=10))
    assert (error.code, error.status) == ("NOT_AUTHORISED", DENIED)
    channel.close()
    assert grant_row(mesh, "deployer-a", grant.grant_id)[3] is None  # type: ignore[index]
    assert delegate_with_grant(mesh, root, grant).leaf.record.deployer == "deployer-b"
    a.close()
    d.close()


def delegate_with_grant(mesh: LocalMesh, root: object, grant: Grant) -> object:
    b = mesh.runtime("deployer-b")
    try:
        return b.accept(root, grant, mesh.daemons["deployer-a"].address, "honest")  # type: ignore[arg-type]
    finally:
        b.close()


# --- statements refused by the coordinator (shared mesh: nothing here changes the log) ----------------


@pytest.fixture(scope="module")
def submit_as(mesh: LocalMesh) -> Iterator[Callable[[str, SignedStatement], object]]:
    channels: dict[str, grpc.Channel] = {}

    def submit(identity: str, signed: SignedStatement) -> object:
        channel = channels.get(identity) or channels.setdefault(identity, channel_to(mesh, "coordinator", identity))
        request = coordinator_pb2.SubmitRequest(statement=signed.to_bytes())
        return coordinator_stub(channel).Submit(request, timeout=10)

    yield submit
    for channel in channels.values():
        channel.close()


def next_enrolment(mesh: LocalMesh, key: Ed25519Signer, deployer: str = "deployer-x") -> Statement:
    operator = mesh.operator_client()
    try:
        log = operator.log()
    finally:
        operator.close()
    public = b64url_encode(key.public_key)
    return log.next_statement(
        StatementKind.ENROL_DEPLOYER, deployer, key.key_id, issued_ms=now_ms(), public_key=public, at_ms=0
    )


def head(mesh: LocalMesh) -> tuple[int, str | None]:
    operator = mesh.operator_client()
    try:
        log = operator.log()
    finally:
        operator.close()
    return log.head_sequence, log.head_digest


def test_self_enrolment_is_refused(mesh: LocalMesh, submit_as: Callable[[str, SignedStatement], object]) -> None:
    before = head(mesh)
    own_key = Ed25519Signer.generate()
    statement = next_enrolment(mesh, own_key)

    # With the operator's certificate but signed by the deployer's own key.
    error = service_error(lambda: submit_as("operator", sign_statement(statement, own_key)))
    assert (error.code, error.status) == ("BAD_STATEMENT_SIGNATURE", DENIED)
    # Signed by a deployer key the registry already holds: still not the operator's.
    error = service_error(lambda: submit_as("operator", sign_statement(statement, mesh.deployer_keys["deployer-a"])))
    assert (error.code, error.status) == ("BAD_STATEMENT_SIGNATURE", DENIED)

    # Without the operator's certificate, even a correctly signed statement is refused.
    operator_signed = sign_statement(statement, mesh.operator)
    for identity in ("deployer-a-signer", "deployer-a-runtime", "client", "verifier-0", "coordinator"):
        error = service_error(lambda identity=identity: submit_as(identity, operator_signed))
        assert (error.code, error.status) == ("NOT_AUTHORISED", DENIED), identity
    assert head(mesh) == before


@pytest.mark.parametrize(
    ("change", "code", "status"),
    [
        ({"sequence": 4}, "SEQUENCE_CONFLICT", grpc.StatusCode.FAILED_PRECONDITION),
        ({"sequence": 2}, "SEQUENCE_CONFLICT", grpc.StatusCode.FAILED_PRECONDITION),
        ({"prev": "sha256:" + "0" * 64}, "CHAIN_MISMATCH", grpc.StatusCode.FAILED_PRECONDITION),
        ({"prev": None}, "CHAIN_MISMATCH", grpc.StatusCode.FAILED_PRECONDITION),
        # One status per code, from the edge's table: a statement that cannot apply is INVALID_ARGUMENT too.
        ({"deployer": "deployer-a"}, "INVALID_STATEMENT", grpc.StatusCode.INVALID_ARGUMENT),
        ({"public_key": None}, "INVALID_STATEMENT", grpc.StatusCode.INVALID_ARGUMENT),
    ],
    ids=["sequence-ahead", "sequence-behind", "prev-wrong", "prev-null", "already-enrolled", "no-public-key"],
)
def test_statement_that_does_not_extend_the_log_is_refused(
    mesh: LocalMesh,
    submit_as: Callable[[str, SignedStatement], object],
    change: dict[str, object],
    code: str,
    status: grpc.StatusCode,
) -> None:
    before = head(mesh)
    statement = dataclasses.replace(next_enrolment(mesh, Ed25519Signer.generate()), **change)  # type: ignore[arg-type]
    error = service_error(lambda: submit_as("operator", sign_statement(statement, mesh.operator)))
    assert (error.code, error.status) == (code, status)
    assert head(mesh) == before
