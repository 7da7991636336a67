"""The asyncio clients of ``countersign.client`` (grpc.aio) against a real mesh (loopback, mTLS): the
same typed results and errors as their sync twins, from coroutines on one event loop."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.client import (
    AsyncOperatorClient,
    AsyncSignerClient,
    AsyncVerifierClient,
    ErrorCode,
    EvidenceVerdict,
    Grant,
    ServiceError,
)
from countersign.reasons import Reason
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons

T = TypeVar("T")


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run one scenario on a fresh event loop (clients are created inside it, as grpc.aio requires)."""

    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


def signer_of(mesh: LocalMesh, deployer: str) -> AsyncSignerClient:
    return AsyncSignerClient(mesh.daemons[deployer].address, mesh.tls_for(f"{deployer}-runtime"), deployer)


def verifier_of(mesh: LocalMesh) -> AsyncVerifierClient:
    return AsyncVerifierClient(mesh.daemons["verifier-0"].address, mesh.tls_for("client"))


def test_issue_delegate_verify_then_replay(client_mesh: LocalMesh) -> None:
    async def scenario() -> tuple[Path, Path, Grant, Path, EvidenceVerdict, EvidenceVerdict]:
        async with (
            signer_of(client_mesh, "deployer-a") as a,
            signer_of(client_mesh, "deployer-b") as b,
            verifier_of(client_mesh) as verifier,
        ):
            root = await a.root("planner", "client-sdk-aio", max_children=4)
            helper = await a.local_child(root, "helper")
            grant = await a.open_grant(root, "deployer-b")
            child = await b.accept(root, grant, client_mesh.daemons["deployer-a"].address, "researcher")
            receipt = await b.receipt(child, sha256(b"notes\n"))
            first = await verifier.verify(receipt, b"notes\n")
            replay = await verifier.verify(receipt.to_bytes(), b"notes\n")
            return root, helper, grant, child, first, replay

    root, helper, grant, child, first, replay = run(scenario)
    assert (root.leaf.record.deployer, root.leaf.record.depth, root.leaf.record.max_children) == ("deployer-a", 0, 4)
    assert (helper.leaf.record.depth, helper.envelopes[0].digest()) == (1, root.leaf.digest())
    assert isinstance(grant, Grant)
    assert (grant.child_deployer, grant.parent_digest) == ("deployer-b", root.leaf.digest())
    assert grant.parent_key_id == client_mesh.deployer_keys["deployer-a"].key_id
    assert (child.leaf.record.deployer, child.leaf.record.depth) == ("deployer-b", 1)
    assert isinstance(first, EvidenceVerdict)
    assert first and (first.reason, first.registry_sequence) == (None, 3)
    assert not replay and (replay.reason, replay.result.index) == (Reason.NONCE_REPLAYED, 2)


def test_calls_run_concurrently_on_one_loop(client_mesh: LocalMesh) -> None:
    async def scenario() -> list[EvidenceVerdict]:
        async with signer_of(client_mesh, "deployer-a") as a, verifier_of(client_mesh) as verifier:
            root = await a.root("fan-out", "client-sdk-aio")
            outputs = [f"output {i}\n".encode() for i in range(8)]
            receipts = await asyncio.gather(*(a.receipt(root, sha256(o)) for o in outputs))
            return list(await asyncio.gather(*(verifier.verify(r, o) for r, o in zip(receipts, outputs, strict=True))))

    verdicts = run(scenario)
    assert len(verdicts) == 8 and all(verdicts), verdicts


def test_refusals_are_service_errors_with_an_error_code(client_mesh: LocalMesh) -> None:
    async def scenario() -> tuple[ServiceError, ServiceError]:
        async with (
            signer_of(client_mesh, "deployer-a") as a,
            signer_of(client_mesh, "deployer-b") as b,
            signer_of(client_mesh, "deployer-c") as c,
        ):
            writer = await c.root("writer", "client-sdk-aio")
            with pytest.raises(ServiceError) as refused:  # deployer-c may delegate to deployer-a only
                await c.open_grant(writer, "deployer-b")
            root = await a.root("planner", "client-sdk-aio")
            for_c = await a.open_grant(root, "deployer-c")
            with pytest.raises(ServiceError) as wrong_child:
                await b.accept(root, for_c, client_mesh.daemons["deployer-a"].address, "thief")
            return refused.value, wrong_child.value

    refused, wrong_child = run(scenario)
    assert refused.code is ErrorCode.POLICY_REFUSED
    assert "deployer-b" in str(refused)
    assert wrong_child.code is ErrorCode.PARENT_REFUSED
    assert wrong_child.details.get("parent_code") == ErrorCode.GRANT_WRONG_CHILD
    assert not wrong_child.retryable


def test_unreachable_service_is_a_retryable_service_error(client_mesh: LocalMesh, nowhere: str) -> None:
    async def scenario() -> ServiceError:
        async with AsyncVerifierClient(nowhere, client_mesh.tls_for("client")) as lost:
            with pytest.raises(ServiceError) as error:
                await lost.verify(b"{}", b"", timeout_s=2)
            return error.value

    error = run(scenario)
    assert (error.code, error.retryable) == (ErrorCode.UNAVAILABLE, True)


def test_operator_log_and_a_refused_statement(client_mesh: LocalMesh) -> None:
    key = client_mesh.deployer_keys["deployer-b"]

    async def scenario() -> tuple[int, set[str], ServiceError, int]:
        async with AsyncOperatorClient(
            client_mesh.daemons["coordinator"].address, client_mesh.tls_for("operator"), client_mesh.operator
        ) as operator:
            log = await operator.log()
            enrolled = {s.statement.deployer for s in log.entries if s.statement.kind is StatementKind.ENROL_DEPLOYER}
            with pytest.raises(ServiceError) as refused:  # deployer-b is enrolled already
                await operator.submit(
                    StatementKind.ENROL_DEPLOYER, "deployer-b", key.key_id, public_key=b64url_encode(key.public_key),
                    at_ms=0,
                )  # fmt: skip
            return log.head_sequence, enrolled, refused.value, (await operator.log()).head_sequence

    before, enrolled, refused, after = run(scenario)
    assert enrolled == set(client_mesh.deployers)
    assert refused.code is ErrorCode.INVALID_STATEMENT
    assert after == before


def test_operator_checkpoint_is_served_back(client_mesh: LocalMesh) -> None:
    from countersign.checkpoint import SignedCheckpoint

    async def scenario() -> tuple[SignedCheckpoint, SignedCheckpoint, int]:
        async with AsyncOperatorClient(
            client_mesh.daemons["coordinator"].address, client_mesh.tls_for("operator"), client_mesh.operator,
            checkpoint_lifetime_ms=45_000,
        ) as operator:  # fmt: skip
            signed = await operator.checkpoint()
            copy, served = await operator._served()
            return signed, SignedCheckpoint.from_bytes(served), copy.head_sequence

    signed, served, length = run(scenario)
    assert signed.checkpoint.sequence == length
    assert signed.checkpoint.expires_ms - signed.checkpoint.issued_ms == 45_000
    # The mesh's own loop may have renewed it since, never with an older one.
    assert served.checkpoint.issued_ms >= signed.checkpoint.issued_ms
