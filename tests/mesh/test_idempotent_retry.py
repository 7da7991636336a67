"""An accept-mode request retried with its idempotency key gets its ACCEPT again; nothing else does."""

from __future__ import annotations

import grpc
import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.client import VerifierClient
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, service_error, sha256, verifier_stub

pytestmark = pytest.mark.daemons

OUTPUT = b"the writer's final text\n"


def fresh_path(mesh: LocalMesh) -> bytes:
    runtime = mesh.runtime("deployer-a")
    try:
        root = runtime.root("idempotent-writer", "idempotent-system")
        return runtime.receipt(root, sha256(OUTPUT)).to_bytes()
    finally:
        runtime.close()


def test_retry_with_the_same_key_is_accepted_again(mesh: LocalMesh) -> None:
    path = fresh_path(mesh)
    client = mesh.verifier_client()
    try:
        first = client.verify(path, OUTPUT, request_id="order-4711").result
        assert first
        retried = client.verify(path, OUTPUT, request_id="order-4711").result
        assert retried, "the same request after a lost answer"
        other_key = client.verify(path, OUTPUT, request_id="order-4712").result
        assert other_key.reason is not None and other_key.reason.value == "NONCE_REPLAYED"
        no_key = client.verify(path, OUTPUT).result
        assert no_key.reason is not None and no_key.reason.value == "NONCE_REPLAYED"
    finally:
        client.close()


def test_another_client_identity_cannot_reuse_a_key(mesh: LocalMesh) -> None:
    path = fresh_path(mesh)
    consumer = mesh.verifier_client()
    try:
        assert consumer.verify(path, OUTPUT, request_id="shared-key").result
    finally:
        consumer.close()
    # The operator's certificate is another client identity of the same CA.
    channel = channel_to(mesh, "verifier-0", "operator")
    try:
        response = verifier_stub(channel).VerifyPath(
            verifier_pb2.VerifyPathRequest(path=path, output=OUTPUT, request_id="shared-key"), timeout=10
        )
    finally:
        channel.close()
    assert response.verdict.reason == "NONCE_REPLAYED"


@pytest.mark.parametrize("key", ["x" * 129, "tab\tkey", "ünïcode"])
def test_malformed_keys_are_invalid_arguments(mesh: LocalMesh, key: str) -> None:
    client = VerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client"))
    try:
        error = service_error(lambda: client.verify(fresh_path(mesh), OUTPUT, request_id=key))
    finally:
        client.close()
    assert error.code == "INVALID_ARGUMENT"
    assert error.status is grpc.StatusCode.INVALID_ARGUMENT
