"""Who reads and marks a verifier's verdict log through ``Impact`` (issue 29), with real daemons over
mTLS: a consumer (a client certificate) sees only the verdicts it was answered and cannot mark; an
auditor and the operator see and mark the whole log; any other certificate is refused. And a query
value of any length comes back as a bounded, typed INVALID_ARGUMENT, not as a transport failure."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from countersign._daemon.tls import PeerIdentity, issue_certificate
from countersign._proto.v1 import verifier_pb2
from countersign.client import TlsConfig, VerifierClient
from countersign.client.errors import ReceivedError, from_rpc_error
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, service_error, sha256, verifier_stub

pytestmark = pytest.mark.daemons


def second_consumer(mesh: LocalMesh) -> TlsConfig:
    """A certificate of another consumer, ``client/bob``, from the mesh's CA."""
    pki = mesh.workdir / "pki"
    cert, key = issue_certificate(pki, pki, "bob", PeerIdentity("client", name="bob"))
    return TlsConfig(ca=str(pki / "ca.pem"), cert=str(cert), key=str(key))


def impact(mesh: LocalMesh, who: str | TlsConfig, **query: object) -> verifier_pb2.ImpactResponse:
    channel = channel_to(mesh, "verifier-0", who)
    try:
        return verifier_stub(channel).Impact(verifier_pb2.ImpactRequest(**query), timeout=10)  # type: ignore[arg-type]
    finally:
        channel.close()


def test_a_consumer_sees_only_its_own_verdicts_and_only_an_auditor_or_the_operator_marks(
    make_mesh: Callable[..., LocalMesh],
) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"))
    bob = second_consumer(mesh)
    a = mesh.runtime("deployer-a")
    root = a.root("planner", "tenancy")
    made: dict[str, list[str]] = {"demo": [], "bob": []}
    consumers = {"demo": mesh.verifier_client(), "bob": VerifierClient(mesh.daemons["verifier-0"].address, bob)}
    for who, count in (("demo", 3), ("bob", 2)):
        for n in range(count):
            output = f"{who} {n}\n".encode()
            path = a.receipt(root, sha256(output))
            assert consumers[who].verify(path.to_bytes(), output, request_id=f"{who}-{n}")
            made[who].append(f"{who}-{n}")
    demo_uri = "spiffe://countersign.local/client/demo"
    bob_uri = "spiffe://countersign.local/client/bob"

    # Each consumer: its own verdicts only, through the raw RPC and the SDK alike.
    own = impact(mesh, "client", deployer="deployer-a")
    assert sorted(v.request_id for v in own.verdicts) == made["demo"]
    assert {v.client for v in own.verdicts} == {demo_uri}
    theirs = consumers["bob"].impact(deployer="deployer-a")
    assert sorted(v.request_id for v in theirs.verdicts) == made["bob"]
    assert {v.client for v in theirs.verdicts} == {bob_uri}

    # A consumer cannot flag anything, its own verdicts included.
    for who in ("demo", "bob"):
        refused = service_error(lambda who=who: consumers[who].impact(deployer="deployer-a", mark=True))  # type: ignore[misc]
        assert (refused.code, refused.status) == ("NOT_AUTHORISED", grpc.StatusCode.PERMISSION_DENIED)
    everyone = impact(mesh, "auditor", deployer="deployer-a")
    assert sorted(v.request_id for v in everyone.verdicts) == sorted(made["demo"] + made["bob"])
    assert not any(v.marked_in_log for v in everyone.verdicts)

    # The operator sees the whole log too; the auditor marks it.
    assert len(impact(mesh, "operator", deployer="deployer-a").verdicts) == 5
    marked = impact(mesh, "auditor", deployer="deployer-a", mark=True)
    assert marked.newly_marked == 5
    assert all(v.marked_in_log for v in impact(mesh, "client", deployer="deployer-a").verdicts)

    for other in ("deployer-a-runtime", "deployer-b-signer", "verifier-0"):
        refused = service_error(lambda other=other: impact(mesh, other, deployer="deployer-a"))  # type: ignore[misc]
        assert (refused.code, refused.status) == ("NOT_AUTHORISED", grpc.StatusCode.PERMISSION_DENIED), other
    for client in consumers.values():
        client.close()
    a.close()


def test_a_query_of_any_length_is_refused_typed_and_bounded(make_mesh: Callable[..., LocalMesh]) -> None:
    """Issue 29: a 10,000-character deployer was echoed into the error, whose trailers passed 16 KiB;
    the client saw RESOURCE_EXHAUSTED and the SDK raised ValueError."""
    mesh = make_mesh(deployers=("deployer-a",))
    client = mesh.verifier_client()
    try:
        for length in (100, 10_000, 15_000):
            error = service_error(lambda length=length: client.impact(deployer="d" * length))  # type: ignore[misc]
            assert type(error) is ReceivedError
            assert (error.code, error.status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT), error
            assert len(str(error)) < 300 and "is not a deployer id" in str(error)
        channel = channel_to(mesh, "verifier-0", "client")
        try:
            raw = verifier_stub(channel).Impact
            with pytest.raises(grpc.RpcError) as failed:
                raw(verifier_pb2.ImpactRequest(deployer="\u00e9" * 7_000), timeout=10)
            error = from_rpc_error(failed.value)
            assert (error.code, failed.value.code()) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT)
        finally:
            channel.close()
    finally:
        client.close()
