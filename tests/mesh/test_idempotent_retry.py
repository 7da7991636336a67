"""An accept-mode request retried with its idempotency key gets its ACCEPT again, marked as a retry of
the earlier acceptance with its time; nothing else does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.client import VerifierClient
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, now_ms, service_error, sha256, verifier_stub

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
        before = now_ms()
        first = client.verify(path, OUTPUT, request_id="order-4711")
        assert first and first.retry_of_ms is None and first.request_id == "order-4711"
        retried = client.verify(path, OUTPUT, request_id="order-4711")
        assert retried, "the same request after a lost answer"
        assert retried.retry_of_ms is not None and before <= retried.retry_of_ms <= now_ms()
        other_key = client.verify(path, OUTPUT, request_id="order-4712").result
        assert other_key.reason is not None and other_key.reason.value == "NONCE_REPLAYED"
        no_key = client.verify(path, OUTPUT).result
        assert no_key.reason is not None and no_key.reason.value == "NONCE_REPLAYED"
    finally:
        client.close()


def test_nine_concurrent_sends_of_one_key_are_one_acceptance_and_eight_retries(mesh: LocalMesh) -> None:
    """The issue's case: one certificate sends one request id nine times at once. One answer is the
    acceptance; the other eight say they repeat it, each with the same acceptance time, over the
    unary call and over verification lanes alike."""
    for lanes in (0, 4):
        path = fresh_path(mesh)
        client = VerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client"), lanes=lanes)
        try:
            with ThreadPoolExecutor(9) as pool:
                sends = [pool.submit(client.verify, path, OUTPUT, request_id="burst-1") for _ in range(9)]
                answers = [send.result() for send in sends]
        finally:
            client.close()
        assert all(answers), [a.reason for a in answers]
        firsts = [a for a in answers if a.retry_of_ms is None]
        retries = [a for a in answers if a.retry_of_ms is not None]
        assert (len(firsts), len(retries)) == (1, 8)
        assert len({a.retry_of_ms for a in retries}) == 1 and retries[0].retry_of_ms > 0


def test_the_sdk_draws_a_fresh_128_bit_key_per_request(mesh: LocalMesh) -> None:
    """By default each request carries its own random key, so a second logical request for an
    accepted path is a replay, never a retry; the key used comes back to retry with."""
    path = fresh_path(mesh)
    client = mesh.verifier_client()
    try:
        first = client.verify(path, OUTPUT)
        assert first and len(first.request_id) == 32 and int(first.request_id, 16) >= 0
        second = client.verify(path, OUTPUT)
        assert second.reason is not None and second.reason.value == "NONCE_REPLAYED"
        assert second.request_id != first.request_id
        again = client.verify(path, OUTPUT, request_id=first.request_id)
        assert again and again.retry_of_ms is not None
        # An explicit empty key sends none: then even the same call is a replay.
        assert client.verify(fresh_path(mesh), OUTPUT, request_id="").request_id == ""
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
