"""Checkpoints at a real coordinator (spec 7.5): what it refuses, that a statement and its checkpoint
are stored together or not at all, that the checkpoint survives a restart (SQLite and PostgreSQL),
and the operator's ``checkpoint`` command."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from countersign._proto.v1 import coordinator_pb2
from countersign.admission import SignedStatement, StatementKind, sign_statement
from countersign.canonical import b64url_encode
from countersign.checkpoint import Checkpoint, SignedCheckpoint, checkpoint_of, sign_checkpoint
from countersign.client import AsyncOperatorClient, OperatorClient
from countersign.client.operator import SUBMIT_ATTEMPTS, KnownHead, coordinator_log, now_ms
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.coordinator.test_operator_cli import cli, tls
from tests.mesh.helpers import channel_to, coordinator_stub, service_error
from tests.stores.conftest import PostgresSchemas

pytestmark = pytest.mark.daemons


@pytest.fixture
def quiet(tmp_path: Path) -> Iterator[LocalMesh]:
    """A coordinator with no checkpoint loop: the test submits every checkpoint itself."""
    mesh = LocalMesh(tmp_path / "mesh", verifiers=0, checkpoint_every_ms=0).setup()
    mesh.start("coordinator")
    yield mesh
    mesh.stop_all()


def served_checkpoint(mesh: LocalMesh) -> SignedCheckpoint | None:
    channel = channel_to(mesh, "coordinator", "client")
    try:
        served = coordinator_stub(channel).GetLog(coordinator_pb2.GetLogRequest(), timeout=5).checkpoint
    finally:
        channel.close()
    return SignedCheckpoint.from_bytes(served) if served else None


def submit_checkpoint(mesh: LocalMesh, signed: SignedCheckpoint, identity: str = "operator") -> object:
    channel = channel_to(mesh, "coordinator", identity)
    try:
        request = coordinator_pb2.SubmitCheckpointRequest(checkpoint=signed.to_bytes())
        return coordinator_stub(channel).SubmitCheckpoint(request, timeout=5)
    finally:
        channel.close()


def test_the_coordinator_refuses_every_checkpoint_but_the_operators_newest_of_its_head(quiet: LocalMesh) -> None:
    mesh = quiet
    assert served_checkpoint(mesh) is None
    operator = mesh.operator_client()
    try:
        copy = operator.log()
        issued = now_ms()
        current = sign_checkpoint(checkpoint_of(copy, issued_ms=issued, lifetime_ms=60_000), mesh.operator)
        submit_checkpoint(mesh, current)
        assert served_checkpoint(mesh) == current

        impostor = sign_checkpoint(current.checkpoint, Ed25519Signer.generate())
        ahead = sign_checkpoint(Checkpoint(1, "sha256:" + "0" * 64, issued, issued + 1_000), mesh.operator)
        older = sign_checkpoint(checkpoint_of(copy, issued_ms=issued - 1, lifetime_ms=60_000), mesh.operator)
        for signed, code, status in (
            (impostor, "BAD_STATEMENT_SIGNATURE", grpc.StatusCode.PERMISSION_DENIED),
            (ahead, "SEQUENCE_CONFLICT", grpc.StatusCode.FAILED_PRECONDITION),
            (older, "SEQUENCE_CONFLICT", grpc.StatusCode.FAILED_PRECONDITION),
        ):
            error = service_error(lambda signed=signed: submit_checkpoint(mesh, signed))  # type: ignore[misc]
            assert (error.code, error.status) == (code, status), error
        error = service_error(lambda: submit_checkpoint(mesh, current, identity="client"))
        assert error.code == "NOT_AUTHORISED"
        assert served_checkpoint(mesh) == current

        # A statement whose checkpoint does not name the log it makes is refused whole: nothing stored.
        key = Ed25519Signer.generate()
        statement = copy.next_statement(
            StatementKind.ENROL_DEPLOYER, "deployer-x", key.key_id, issued_ms=now_ms(),
            public_key=b64url_encode(key.public_key), at_ms=0,
        )  # fmt: skip
        signed_statement = sign_statement(statement, mesh.operator)
        channel = channel_to(mesh, "coordinator", "operator")
        try:
            request = coordinator_pb2.SubmitRequest(
                statement=signed_statement.to_bytes(), checkpoint=current.to_bytes()
            )
            error = service_error(lambda: coordinator_stub(channel).Submit(request, timeout=5))
        finally:
            channel.close()
        assert error.code == "SEQUENCE_CONFLICT"
        assert coordinator_log(mesh.daemons["coordinator"].address, mesh.tls_for("client")) == []
        assert served_checkpoint(mesh) == current
    finally:
        operator.close()


def test_the_checkpoint_survives_a_restart(quiet: LocalMesh) -> None:
    mesh = quiet
    mesh.enrol_all(wait=False)
    before = served_checkpoint(mesh)
    assert before is not None and before.checkpoint.sequence == len(mesh.deployers)
    assert mesh.stop("coordinator") == 0
    mesh.start("coordinator")
    assert served_checkpoint(mesh) == before


@pytest.mark.postgres
def test_the_checkpoint_survives_a_restart_elsewhere_in_postgres(tmp_path: Path, pg_schemas: PostgresSchemas) -> None:
    store = pg_schemas.url(pg_schemas.new())
    mesh = LocalMesh(
        tmp_path / "mesh", verifiers=0, checkpoint_every_ms=0, extra_env={"COUNTERSIGN_LOG_STORE": store}
    ).setup()
    with mesh:
        mesh.start("coordinator")
        mesh.enrol_all(wait=False)
        before = served_checkpoint(mesh)
        assert before is not None and before.checkpoint.sequence == len(mesh.deployers)
        assert mesh.stop("coordinator") == 0
        (mesh.workdir / "state" / "coordinator.db").unlink(missing_ok=True)
        mesh.start("coordinator")
        assert served_checkpoint(mesh) == before


def test_the_checkpoint_command(quiet: LocalMesh, tmp_path: Path) -> None:
    mesh = quiet
    address = mesh.daemons["coordinator"].address
    key = mesh.workdir / "keys" / "operator.jwk"
    deployer = Ed25519Signer.generate()
    enrolled = cli(
        "operator", "enrol", "--key", str(key), "--deployer", "deployer-x",
        f"--public-key={b64url_encode(deployer.public_key)}", "--coordinator", address,
        "--lifetime-ms", "30000", *tls(mesh, "operator"),
    )  # fmt: skip
    assert enrolled.returncode == 0, enrolled.stderr
    served = served_checkpoint(mesh)
    assert served is not None
    assert served.checkpoint.sequence == 1
    assert served.checkpoint.expires_ms - served.checkpoint.issued_ms == 30_000
    head_file = key.with_suffix(".head.json")
    recorded = json.loads(head_file.read_text())
    assert recorded == {"sequence": 1, "head": served.checkpoint.head, "statements": [[0, served.checkpoint.head]]}

    once = cli("operator", "checkpoint", "--key", str(key), "--coordinator", address, *tls(mesh, "operator"))
    assert once.returncode == 0, once.stderr
    printed = json.loads(once.stdout)
    assert (printed["sequence"], printed["head"]) == (1, served.checkpoint.head)
    assert served_checkpoint(mesh).checkpoint.expires_ms == printed["expires_ms"]  # type: ignore[union-attr]

    # The operator's record says it submitted more than the coordinator serves: no checkpoint is signed.
    head_file.write_text(json.dumps({"sequence": 2, "head": "sha256:" + "1" * 64}))
    refused = cli("operator", "checkpoint", "--key", str(key), "--coordinator", address, *tls(mesh, "operator"))
    assert refused.returncode != 0
    assert "NOT_SERVED" in refused.stderr
    assert served_checkpoint(mesh).checkpoint.expires_ms == printed["expires_ms"]  # type: ignore[union-attr]

    bad = cli("operator", "checkpoint", "--key", str(key), "--coordinator", address, "--lifetime-ms", "5")
    assert bad.returncode != 0 and "--lifetime-ms" in bad.stderr


def _loop_signs_in_between(mesh: LocalMesh, rounds: int) -> tuple[Callable[[Any], None], list[SignedCheckpoint]]:
    """A hook to run before each of a submit's first ``rounds`` requests reaches the coordinator: the
    operator's checkpoint loop signs a checkpoint of the log as it stands, a few milliseconds later
    than the submit's own (the race a fresh-clone CI run lost at enrolment). Returns it and the
    checkpoints each request carried. The loop read the operator's record of signed statements just
    before the submit recorded its own (a loop reading it after refuses: NOT_SERVED, nothing signed),
    so it is given the record as it stood then."""
    carried: list[SignedCheckpoint] = []
    snapshot = KnownHead()
    for position, digest in sorted(mesh.operator_head.statements().items()):
        snapshot._held[position] = digest

    def before(request: Any) -> None:
        carried.append(SignedCheckpoint.from_bytes(request.checkpoint))
        if len(carried) <= rounds:
            time.sleep(0.003)
            loop = OperatorClient(
                mesh.daemons["coordinator"].address, mesh.tls_for("operator"), mesh.operator,
                checkpoint_lifetime_ms=mesh.lifetime_ms, known_head=snapshot,
            )  # fmt: skip
            with loop:
                loop.checkpoint()

    return before, carried


def _enrol_x(operator: Any) -> Any:
    key = Ed25519Signer.generate()
    return operator.submit(
        StatementKind.ENROL_DEPLOYER, "deployer-x", key.key_id, public_key=b64url_encode(key.public_key), at_ms=0
    )


def _served_digests(mesh: LocalMesh) -> list[str]:
    served = coordinator_log(mesh.daemons["coordinator"].address, mesh.tls_for("client"))
    return [SignedStatement.from_bytes(statement).digest() for statement in served]


def test_a_submit_that_loses_the_race_to_the_checkpoint_loop_is_signed_again(quiet: LocalMesh) -> None:
    mesh = quiet
    before, carried = _loop_signs_in_between(mesh, rounds=1)
    operator = mesh.operator_client()
    submit = operator._submit
    operator._submit = lambda request, timeout_s: (before(request), submit(request, timeout_s))[1]
    try:
        signed = _enrol_x(operator)
    finally:
        operator.close()
    # The first request carried a checkpoint older than the loop's and was refused whole; the second,
    # signed afresh against the log as served, landed.
    assert len(carried) == 2 and carried[1].checkpoint.issued_ms > carried[0].checkpoint.issued_ms
    assert _served_digests(mesh) == [signed.digest()]
    assert served_checkpoint(mesh) == carried[1]


def test_a_submit_that_keeps_losing_the_race_gives_up_with_sequence_conflict(quiet: LocalMesh) -> None:
    mesh = quiet
    before, carried = _loop_signs_in_between(mesh, rounds=SUBMIT_ATTEMPTS)
    operator = mesh.operator_client()
    submit = operator._submit
    operator._submit = lambda request, timeout_s: (before(request), submit(request, timeout_s))[1]
    try:
        error = service_error(lambda: _enrol_x(operator))
    finally:
        operator.close()
    assert error.code == "SEQUENCE_CONFLICT"
    assert len(carried) == SUBMIT_ATTEMPTS  # bounded: it does not sign forever
    assert _served_digests(mesh) == []


def test_the_async_submit_is_signed_again_too(quiet: LocalMesh) -> None:
    mesh = quiet
    before, carried = _loop_signs_in_between(mesh, rounds=1)

    async def scenario() -> Any:
        async with AsyncOperatorClient(
            mesh.daemons["coordinator"].address, mesh.tls_for("operator"), mesh.operator
        ) as operator:
            real = operator._stub.Submit

            async def submit(request: Any, timeout: float) -> Any:
                # The hook blocks on purpose: it stands for the loop's thread winning the race.
                before(request)
                return await real(request, timeout=timeout)

            operator._stub.Submit = submit
            return await _enrol_x(operator)

    signed = asyncio.run(scenario())
    assert len(carried) == 2
    assert _served_digests(mesh) == [signed.digest()]
