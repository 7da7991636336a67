"""Evidence made in process for the zone scenarios and measurements: paths signed with the mesh's own
deployer keys (or fresh keys the operator admits), and operator statements submitted with timing."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from countersign._clock import now_ms
from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import SignedStatement, StatementKind
from countersign.canonical import b64url_encode
from countersign.client.errors import from_rpc_error
from countersign.client.tls import coordinator_dns, open_channel
from countersign.keys import Ed25519Signer
from countersign.records import Construction, Path
from countersign.samples import SampleMesh, cross_deployer_route
from countersign.verify import replay_key
from countersign_cli.localmesh import LocalMesh


@dataclass(frozen=True)
class Evidence:
    """A presented path and the exact output bytes its leaf binds."""

    path: Path
    output: bytes

    @property
    def data(self) -> bytes:
        return self.path.to_bytes()

    @property
    def replay_key(self) -> str:
        """The key under which a verifier store records this path's leaf nonce."""
        leaf = self.path.leaf.record
        return replay_key(leaf.deployer, leaf.nonce)


def signed_paths(
    keys: Mapping[str, Ed25519Signer], count: int, *, depth: int = 5, route: Sequence[str] | None = None
) -> list[Evidence]:
    """``count`` distinct SIGNED-DAG paths of ``depth`` records, every edge crossing deployers and
    co-signed in process, signed by ``keys`` (deployer -> key)."""
    deployers = list(keys)
    hops = list(route) if route is not None else cross_deployer_route(deployers, depth)
    sample = SampleMesh(dict(keys))
    made = []
    for _ in range(count):
        output = b"output " + secrets.token_bytes(16)
        path = sample.issue_path(Construction.SIGNED_DAG, hops, output, now_ms=now_ms(), system="zones")
        made.append(Evidence(path, output))
    return made


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class Operator:
    """The operator next to the coordinator: signs statements and submits them, timing the submission."""

    def __init__(self, mesh: LocalMesh) -> None:
        self._client = mesh.operator_client()
        self._channel = open_channel(mesh.daemons["coordinator"].address, mesh.tls_for("operator"), coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def prepare(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
    ) -> SignedStatement:
        return self._client.prepare(kind, deployer, key_id, public_key=public_key, at_ms=at_ms)

    def submit(self, signed: SignedStatement, timeout_s: float = 10.0) -> tuple[float, float]:
        """Submit; return (monotonic time just before sending, monotonic time the coordinator answered)."""
        started = time.monotonic()
        try:
            self._stub.Submit(coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), timeout=timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return started, time.monotonic()

    def enrol(self, deployer: str, key: Ed25519Signer) -> SignedStatement:
        signed = self.prepare(
            StatementKind.ENROL_DEPLOYER, deployer, key.key_id, public_key=b64url_encode(key.public_key), at_ms=0
        )
        self.submit(signed)
        return signed

    def add_key(self, deployer: str, key: Ed25519Signer) -> SignedStatement:
        signed = self.prepare(
            StatementKind.ADD_KEY, deployer, key.key_id, public_key=b64url_encode(key.public_key), at_ms=0
        )
        self.submit(signed)
        return signed

    def revoke_statement(self, deployer: str, key: Ed25519Signer) -> SignedStatement:
        return self.prepare(StatementKind.REVOKE_KEY, deployer, key.key_id)

    @property
    def sequence(self) -> int:
        return self._client.log().head_sequence

    def close(self) -> None:
        self._client.close()
        self._channel.close()
