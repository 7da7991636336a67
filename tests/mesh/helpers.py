"""Helpers of the mesh tests: polling, raw channels with any certificate, the signers' SQLite state,
hand-built edge proposals and Prometheus scraping. Nothing here sleeps to synchronise: ``poll`` retries
a check until a deadline."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
import urllib.request
from collections.abc import Callable
from contextlib import closing
from pathlib import Path as FilePath
from typing import Any, TypeVar

import grpc
from prometheus_client.parser import text_string_to_metric_families

from countersign._proto.v1 import (
    coordinator_pb2_grpc,
    signer_pb2,
    signer_pb2_grpc,
    verifier_pb2_grpc,
)
from countersign.client.errors import ServiceError, from_rpc_error
from countersign.client.tls import CHANNEL_OPTIONS, TlsConfig, coordinator_dns, open_channel, signer_dns, verifier_dns
from countersign.constructions import EdgeProposal, RecordFields, cosign, draft_record
from countersign.records import AgentRef, Construction, CoSignerRole, Envelope, Path
from countersign_cli.localmesh import LocalMesh

T = TypeVar("T")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def poll(check: Callable[[], T | None], *, timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "") -> T:
    """Call ``check`` until it returns something truthy; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}; last value {last!r}")
        time.sleep(interval_s)


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# --- errors -----------------------------------------------------------------------------------


def service_error(call: Callable[[], object]) -> ServiceError:
    """Run ``call`` (a client method or a raw stub call) and return the typed error it must raise."""
    try:
        result = call()
    except ServiceError as exc:
        return exc
    except grpc.RpcError as exc:
        return from_rpc_error(exc)
    raise AssertionError(f"expected an error, got {result!r}")


# --- channels ---------------------------------------------------------------------------------


def server_name_of(mesh: LocalMesh, daemon: str) -> str:
    """The DNS name a client pins for ``daemon`` (its role's, not its address)."""
    kind = mesh.daemons[daemon].kind
    return {"coordinator": coordinator_dns(), "verifier": verifier_dns()}.get(kind) or signer_dns(daemon)


def channel_to(mesh: LocalMesh, daemon: str, identity: str | TlsConfig) -> grpc.Channel:
    """A channel to ``daemon`` presenting ``identity``'s certificate, pinned to the daemon's DNS name."""
    tls = identity if isinstance(identity, TlsConfig) else mesh.tls_for(identity)
    return open_channel(mesh.daemons[daemon].address, tls, server_name_of(mesh, daemon))


def big_channel_to(mesh: LocalMesh, daemon: str, identity: str, max_send: int) -> grpc.Channel:
    """Like :func:`channel_to` but allowed to send ``max_send`` bytes (to test the server's limit)."""
    tls = mesh.tls_for(identity)
    options = [(k, v) for k, v in CHANNEL_OPTIONS if k != "grpc.max_send_message_length"]
    options += [("grpc.max_send_message_length", max_send)]
    options += [("grpc.ssl_target_name_override", server_name_of(mesh, daemon))]
    credentials = grpc.ssl_channel_credentials(tls.material("ca"), tls.material("key"), tls.material("cert"))
    return grpc.secure_channel(mesh.daemons[daemon].address, credentials, options=options)


def signer_stub(channel: grpc.Channel) -> signer_pb2_grpc.SignerStub:
    return signer_pb2_grpc.SignerStub(channel)


def verifier_stub(channel: grpc.Channel) -> verifier_pb2_grpc.VerifierStub:
    return verifier_pb2_grpc.VerifierStub(channel)


def coordinator_stub(channel: grpc.Channel) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(channel)


# --- the signers' durable state ----------------------------------------------------------------


def signer_db(mesh: LocalMesh, deployer: str) -> FilePath:
    return mesh.workdir / "state" / f"{deployer}-signer.db"


def _query(mesh: LocalMesh, deployer: str, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    # Read-only, through SQLite's own locking (WAL): safe while the daemon writes.
    uri = f"file:{signer_db(mesh, deployer)}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
        return db.execute(sql, args).fetchall()


def issued_digests(mesh: LocalMesh, deployer: str) -> set[str]:
    return {row[0] for row in _query(mesh, deployer, "SELECT digest FROM issued")}


def children_of(mesh: LocalMesh, deployer: str, parent_digest: str) -> int:
    return int(_query(mesh, deployer, "SELECT COUNT(*) FROM children WHERE parent = ?", (parent_digest,))[0][0])


def grant_row(mesh: LocalMesh, deployer: str, grant_id: str) -> tuple[Any, ...] | None:
    rows = _query(
        mesh,
        deployer,
        "SELECT grant_id, parent, child_deployer, manifest_digest, parent_cosig FROM grants WHERE grant_id = ?",
        (grant_id,),
    )
    return rows[0] if rows else None


def grant_count(mesh: LocalMesh, deployer: str) -> int:
    return int(_query(mesh, deployer, "SELECT COUNT(*) FROM grants")[0][0])


# --- delegation -------------------------------------------------------------------------------


def delegate(mesh: LocalMesh, parent: Path, child_deployer: str, instance: str, **agent: Any) -> Path:
    """The honest flow: the parent's runtime opens a grant, the child's runtime accepts it."""
    parent_deployer = parent.leaf.record.deployer
    parent_runtime, child_runtime = mesh.runtime(parent_deployer), mesh.runtime(child_deployer)
    try:
        grant = parent_runtime.open_grant(parent, child_deployer)
        return child_runtime.accept(parent, grant, mesh.daemons[parent_deployer].address, instance, **agent)
    finally:
        parent_runtime.close()
        child_runtime.close()


def hand_built_edge(
    mesh: LocalMesh,
    parent: Path,
    grant_id: str,
    child_deployer: str,
    *,
    created_ms: int | None = None,
    expires_ms: int | None = None,
    instance: str = "hand-built",
) -> signer_pb2.CoSignEdgeRequest:
    """A CoSignEdge request as the child's signer would send it, signed with the child deployer's real key."""
    key = mesh.deployer_keys[child_deployer]
    parent_record = parent.leaf.record
    created = now_ms() if created_ms is None else created_ms
    fields = RecordFields(
        deployer=child_deployer,
        agent=AgentRef(instance, parent_record.agent.system),
        created_ms=created,
        expires_ms=min(parent_record.expires_ms, created + 600_000) if expires_ms is None else expires_ms,
    )
    draft = draft_record(Construction.SIGNED_DAG, fields, key.key_id, parent.envelopes)
    proposal = EdgeProposal(parent.leaf, draft, mesh.deployer_keys[parent_record.deployer].key_id)
    child_cosig = cosign(proposal, key, CoSignerRole.CHILD)
    return signer_pb2.CoSignEdgeRequest(
        grant_id=grant_id,
        parent_path=parent.to_bytes(),
        child_record=Envelope.build(draft, None).record_bytes(),
        child_cosignature=json.dumps(child_cosig.to_json()),
    )


def copy_request(request: signer_pb2.CoSignEdgeRequest, **changes: Any) -> signer_pb2.CoSignEdgeRequest:
    """A copy of ``request`` with ``changes`` (protobuf messages are mutable; tests keep the original)."""
    copy = signer_pb2.CoSignEdgeRequest()
    copy.CopyFrom(request)
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


# --- metrics ----------------------------------------------------------------------------------


def scrape(mesh: LocalMesh, daemon: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample the daemon's metrics port serves: name -> [(labels, value)]."""
    port = mesh.daemons[daemon].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples
