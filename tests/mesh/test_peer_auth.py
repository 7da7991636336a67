"""mTLS and identities: who may call what.

A certificate from another CA, no certificate, or plaintext never gets past the handshake (the client
sees UNAVAILABLE) at any daemon. A certificate of the mesh CA gets in, but the identity in it decides:
runtimes only reach their own deployer's signer, and only the child deployer's signer may ask for a
co-signature on its edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path as FilePath

import grpc
import pytest

from countersign._daemon.tls import PeerIdentity, create_ca, issue_certificate
from countersign._proto.v1 import coordinator_pb2, signer_pb2, verifier_pb2
from countersign.client.tls import TlsConfig
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import (
    channel_to,
    children_of,
    coordinator_stub,
    grant_row,
    hand_built_edge,
    issued_digests,
    server_name_of,
    service_error,
    sha256,
    signer_stub,
    verifier_stub,
)

pytestmark = pytest.mark.daemons
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def foreign_pki(tmp_path_factory: pytest.TempPathFactory) -> FilePath:
    """Another CA, with certificates claiming mesh identities."""
    pki = tmp_path_factory.mktemp("foreign-pki")
    create_ca(pki)
    issue_certificate(pki, pki, "client", PeerIdentity("client", name="demo"))
    issue_certificate(pki, pki, "operator", PeerIdentity("operator"))
    issue_certificate(pki, pki, "b-signer", PeerIdentity("signer", deployer="deployer-b"), dns=[])
    issue_certificate(pki, pki, "a-runtime", PeerIdentity("runtime", deployer="deployer-a"))
    return pki


@pytest.fixture(scope="module")
def root_a(mesh: LocalMesh) -> Path:
    runtime = mesh.runtime("deployer-a")
    try:
        return runtime.root("planner", "peer-auth")
    finally:
        runtime.close()


def calls(mesh: LocalMesh, root: Path) -> dict[str, tuple[str, Callable[[grpc.Channel], object]]]:
    """One call per daemon kind, each valid for the right identity."""
    return {
        "verifier": (
            "verifier-0",
            lambda ch: verifier_stub(ch).VerifyPath(verifier_pb2.VerifyPathRequest(), timeout=5),
        ),
        "coordinator-getlog": (
            "coordinator",
            lambda ch: coordinator_stub(ch).GetLog(coordinator_pb2.GetLogRequest(), timeout=5),
        ),
        "coordinator-submit": (
            "coordinator",
            lambda ch: coordinator_stub(ch).Submit(coordinator_pb2.SubmitRequest(), timeout=5),
        ),
        "signer-runtime": (
            "deployer-a",
            lambda ch: signer_stub(ch).OpenGrant(
                signer_pb2.OpenGrantRequest(parent_path=root.to_bytes(), child_deployer="deployer-b"), timeout=5
            ),
        ),
        "signer-cosign": (
            "deployer-a",
            lambda ch: signer_stub(ch).CoSignEdge(hand_built_edge(mesh, root, "0" * 32, "deployer-b"), timeout=5),
        ),
    }


CALL_NAMES = ["verifier", "coordinator-getlog", "coordinator-submit", "signer-runtime", "signer-cosign"]


@pytest.mark.parametrize("call", CALL_NAMES)
@pytest.mark.parametrize("holder", ["client", "operator", "b-signer", "a-runtime"])
def test_certificate_of_another_ca_is_refused(
    mesh: LocalMesh, foreign_pki: FilePath, root_a: Path, call: str, holder: str
) -> None:
    daemon, invoke = calls(mesh, root_a)[call]
    ca = str(mesh.workdir / "pki" / "ca.pem")
    tls = TlsConfig(ca=ca, cert=str(foreign_pki / f"{holder}.pem"), key=str(foreign_pki / f"{holder}.key"))
    channel = channel_to(mesh, daemon, tls)
    error = service_error(lambda: invoke(channel))
    assert (error.code, error.status) == ("UNAVAILABLE", grpc.StatusCode.UNAVAILABLE), error
    channel.close()


@pytest.mark.parametrize("call", CALL_NAMES)
@pytest.mark.parametrize("how", ["no-certificate", "plaintext"])
def test_client_without_certificate_is_refused(mesh: LocalMesh, root_a: Path, call: str, how: str) -> None:
    daemon, invoke = calls(mesh, root_a)[call]
    address = mesh.daemons[daemon].address
    if how == "plaintext":
        channel = grpc.insecure_channel(address)
    else:
        ca = (mesh.workdir / "pki" / "ca.pem").read_bytes()
        server_name = server_name_of(mesh, daemon)
        channel = grpc.secure_channel(
            address, grpc.ssl_channel_credentials(ca), options=[("grpc.ssl_target_name_override", server_name)]
        )
    error = service_error(lambda: invoke(channel))
    assert (error.code, error.status) == ("UNAVAILABLE", grpc.StatusCode.UNAVAILABLE), error
    channel.close()


def test_the_mesh_ca_certificates_do_get_in(mesh: LocalMesh, root_a: Path) -> None:
    """The positive control of the two tests above: the right identity passes the same calls."""
    identities = {
        "verifier": "client",
        "coordinator-getlog": "client",
        "coordinator-submit": "operator",
        "signer-runtime": "deployer-a-runtime",
        "signer-cosign": "deployer-b-signer",
    }
    for call, (daemon, invoke) in calls(mesh, root_a).items():
        channel = channel_to(mesh, daemon, identities[call])
        # Success, or a typed refusal of the (deliberately empty) request: either way past TLS and authz.
        assert status_of(invoke, channel) not in (grpc.StatusCode.UNAVAILABLE, DENIED), call
        channel.close()


def status_of(invoke: Callable[[grpc.Channel], object], channel: grpc.Channel) -> grpc.StatusCode:
    try:
        invoke(channel)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


RUNTIME_RPCS: dict[str, Callable[[Path], object]] = {
    "IssueRoot": lambda root: signer_pb2.IssueRootRequest(
        agent=signer_pb2.AgentFields(instance="x", system="s", ttl_ms=60_000)
    ),
    "IssueLocalChild": lambda root: signer_pb2.IssueLocalChildRequest(
        parent_path=root.to_bytes(), agent=signer_pb2.AgentFields(instance="x", ttl_ms=60_000)
    ),
    "IssueReceipt": lambda root: signer_pb2.IssueReceiptRequest(parent_path=root.to_bytes(), output_sha256=sha256(b"")),
    "OpenGrant": lambda root: signer_pb2.OpenGrantRequest(parent_path=root.to_bytes(), child_deployer="deployer-c"),
    "AcceptDelegation": lambda root: signer_pb2.AcceptDelegationRequest(
        parent_path=root.to_bytes(),
        grant_id="0" * 32,
        parent_signer="127.0.0.1:1",
        agent=signer_pb2.AgentFields(instance="x", ttl_ms=60_000),
    ),
}


@pytest.fixture(scope="module")
def root_b(mesh: LocalMesh) -> Path:
    runtime = mesh.runtime("deployer-b")
    try:
        return runtime.root("researcher", "peer-auth")
    finally:
        runtime.close()


@pytest.mark.parametrize("method", list(RUNTIME_RPCS))
@pytest.mark.parametrize("identity", ["deployer-a-runtime", "deployer-b-signer", "client", "operator"])
def test_runtime_rpcs_only_for_the_deployers_own_runtime(
    mesh: LocalMesh, root_b: Path, method: str, identity: str
) -> None:
    before = issued_digests(mesh, "deployer-b")
    channel = channel_to(mesh, "deployer-b", identity)
    error = service_error(lambda: getattr(signer_stub(channel), method)(RUNTIME_RPCS[method](root_b), timeout=10))
    assert (error.code, error.status) == ("NOT_AUTHORISED", DENIED)
    assert issued_digests(mesh, "deployer-b") == before
    channel.close()


@pytest.fixture(scope="module")
def cosign_channels(mesh: LocalMesh) -> Iterator[Callable[[str], grpc.Channel]]:
    opened: dict[str, grpc.Channel] = {}

    def get(identity: str) -> grpc.Channel:
        return opened.get(identity) or opened.setdefault(identity, channel_to(mesh, "deployer-a", identity))

    yield get
    for channel in opened.values():
        channel.close()


def test_only_the_child_deployers_signer_may_ask_for_a_cosignature(
    mesh: LocalMesh, cosign_channels: Callable[[str], grpc.Channel]
) -> None:
    runtime = mesh.runtime("deployer-a")
    root = runtime.root("planner", "peer-auth-cosign")
    grant = runtime.open_grant(root, "deployer-b")
    runtime.close()
    request = hand_built_edge(mesh, root, grant.grant_id, "deployer-b")
    for identity in ("deployer-c-signer", "deployer-b-runtime", "deployer-a-signer", "client", "operator"):
        error = service_error(
            lambda identity=identity: signer_stub(cosign_channels(identity)).CoSignEdge(request, timeout=10)
        )
        assert (error.code, error.status) == ("NOT_AUTHORISED", DENIED), identity
    assert grant_row(mesh, "deployer-a", grant.grant_id)[3] is None  # type: ignore[index]
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 0
    # The same request from deployer-b's signer is co-signed.
    answer = signer_stub(cosign_channels("deployer-b-signer")).CoSignEdge(request, timeout=10)
    assert '"role":"parent"' in answer.parent_cosignature.replace(" ", "")
    assert children_of(mesh, "deployer-a", root.leaf.digest()) == 1


def test_child_signer_pins_the_parents_identity_not_its_address(mesh: LocalMesh) -> None:
    """Told that deployer-a's signer lives at deployer-c's address, deployer-b's signer refuses to talk to it."""
    a, b = mesh.runtime("deployer-a"), mesh.runtime("deployer-b")
    root = a.root("planner", "peer-auth-pinning")
    grant = a.open_grant(root, "deployer-b")
    before = issued_digests(mesh, "deployer-b")
    error = service_error(lambda: b.accept(root, grant, mesh.daemons["deployer-c"].address, "r"))
    # Not retryable: the server there says what it is (deployer-c's signer), and it is not the parent's.
    assert (error.code, error.status, error.retryable) == ("PARENT_REFUSED", grpc.StatusCode.FAILED_PRECONDITION, False)
    assert error.details["parent_code"] == "WRONG_SERVER" and "deployer-c" in str(error)
    assert issued_digests(mesh, "deployer-b") == before
    assert grant_row(mesh, "deployer-a", grant.grant_id)[3] is None  # type: ignore[index]
    # Among the parent's replicas a wrong one is passed over: the next address named is asked.
    wrong_then_right = f"{mesh.daemons['deployer-c'].address},{mesh.daemons['deployer-a'].address}"
    assert b.accept(root, grant, wrong_then_right, "r").leaf.record.depth == 1
    a.close()
    b.close()
