"""A large output need not travel (ADR 0027): the consumer sends its SHA-256 (``output_sha256``)
instead of its bytes, and each method of each daemon is held to the message size it needs."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import grpc
import pytest

from countersign._proto.v1 import verifier_pb2, verifier_pb2_grpc
from countersign.client import Consumer
from countersign.client.verifier import VerifierClient
from countersign.reasons import Reason
from countersign.records import Path
from countersign.verify import OutputDigest
from countersign_cli.localmesh import LocalMesh
from signer.daemon import SIGNER_MESSAGE_BYTES
from tests.mesh.helpers import big_channel_to, service_error, verifier_stub
from verifier.daemon import MAX_OUTPUT_BYTES, SESSION_MESSAGE_BYTES, VERIFY_MESSAGE_BYTES

pytestmark = pytest.mark.daemons

AUDIT = verifier_pb2.VerifyPathRequest.AUDIT
LARGE_OUTPUT = b"a large output, " * (3 << 20)  # 48 MiB: over every message limit of the mesh


@pytest.fixture(scope="module")
def large(mesh: LocalMesh) -> tuple[Path, bytes]:
    """A receipt for a 48 MiB output, issued by its digest (the signer never sees the bytes either)."""
    runtime = mesh.runtime("deployer-a")
    try:
        return runtime.receipt(runtime.root("writer", "large-output"), hashlib.sha256(LARGE_OUTPUT).digest()), (
            LARGE_OUTPUT
        )
    finally:
        runtime.close()


@pytest.fixture
def stub(mesh: LocalMesh) -> Iterator[verifier_pb2_grpc.VerifierStub]:
    channel = big_channel_to(mesh, "verifier-0", "client", 8 << 20)
    yield verifier_stub(channel)
    channel.close()


def _ask(stub: verifier_pb2_grpc.VerifierStub, **fields: object) -> verifier_pb2.VerifyPathResponse:
    return stub.VerifyPath(verifier_pb2.VerifyPathRequest(mode=AUDIT, **fields), timeout=10)  # type: ignore[arg-type]


def test_the_sdk_verifies_a_48_mib_output_by_its_digest_on_lanes_and_unary(
    mesh: LocalMesh, large: tuple[Path, bytes]
) -> None:
    path, output = large
    for lanes in (2, 0):
        client = VerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client"), lanes=lanes)
        try:
            assert client.verify(path, output, audit=True).result
            assert client.verify(path, OutputDigest.of(output), audit=True).result
            assert client.verify(path, output + b"!", audit=True).result.reason is Reason.OUTPUT_MISMATCH
        finally:
            client.close()
    with Consumer.online(mesh.daemons["verifier-0"].address, mesh.tls_for("client")) as consumer:
        assert consumer.path(path, output, audit=True).result


def test_the_wire_takes_the_digest_or_bounded_bytes_and_refuses_both_or_a_bad_digest(
    stub: verifier_pb2_grpc.VerifierStub, large: tuple[Path, bytes]
) -> None:
    path, output = large
    digest = hashlib.sha256(output).digest()
    data = path.to_bytes()
    assert _ask(stub, path=data, output_sha256=digest).verdict.reason == ""  # accepted
    wrong = _ask(stub, path=data, output_sha256=hashlib.sha256(b"other").digest()).verdict
    assert wrong.reason == Reason.OUTPUT_MISMATCH.value
    for fields, what in (
        ({"output": b"x", "output_sha256": digest}, "not both"),
        ({"output_sha256": digest[:31]}, "32 bytes"),
        ({"output_sha256": digest + b"\0"}, "32 bytes"),
        ({"output": b"o" * (MAX_OUTPUT_BYTES + 1)}, "output_sha256"),
    ):
        error = service_error(lambda fields=fields: _ask(stub, path=data, **fields))
        assert (error.code, error.status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT), error
        assert what in str(error)
    # Bytes up to the bound still work as before (a client with no SHA-256 to hand, grpcurl).
    assert _ask(stub, path=data, output=b"small output\n").verdict.reason == Reason.OUTPUT_MISMATCH.value
    assert _ask(stub, path=data, output=b"o" * MAX_OUTPUT_BYTES).verdict.reason == Reason.OUTPUT_MISMATCH.value


@pytest.mark.parametrize(
    ("daemon", "method", "limit"),
    [
        ("verifier-0", "/countersign.v1.Verifier/VerifyPath", VERIFY_MESSAGE_BYTES),
        ("verifier-0", "/countersign.v1.Verifier/VerifySession", SESSION_MESSAGE_BYTES),
        ("verifier-0", "/countersign.v1.Verifier/Impact", 16 << 10),
        ("verifier-0", "/grpc.health.v1.Health/Check", 64 << 10),
        ("deployer-a", "/countersign.v1.Signer/IssueReceipt", SIGNER_MESSAGE_BYTES),
        ("deployer-a", "/grpc.health.v1.Health/Check", 64 << 10),
        ("coordinator", "/countersign.v1.Coordinator/Submit", 2 << 20),
        ("coordinator", "/countersign.v1.Coordinator/SubmitCheckpoint", 16 << 10),
        ("coordinator", "/countersign.v1.Coordinator/GetLog", 4 << 10),
        ("coordinator", "/grpc.health.v1.Health/Check", 64 << 10),
    ],
)
def test_each_daemon_method_refuses_past_its_own_size_limit_and_takes_up_to_it(
    mesh: LocalMesh, daemon: str, method: str, limit: int
) -> None:
    channel = big_channel_to(mesh, daemon, "client", 8 << 20)
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)

    def sized(size: int) -> bytes:  # an unknown field 15 (length-delimited) padding the message to size
        for header in range(1, 6):  # the varint length's own size
            body = size - 1 - header
            encoded = _varint(body)
            if 1 + len(encoded) + body == size:
                return b"\x7a" + encoded + b"\0" * body
        raise AssertionError(size)

    def status(size: int) -> grpc.StatusCode:
        try:
            call(sized(size), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    try:
        assert status(limit + 1) is grpc.StatusCode.RESOURCE_EXHAUSTED
        # At the limit the size check passes: what answers is the handler (an empty request's own answer).
        assert status(limit) is not grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        channel.close()


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
