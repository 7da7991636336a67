"""Two coordinators serving one registry log on PostgreSQL, and on the DynamoDB emulator (ADR 0033):
either accepts a signed statement, each serves what the other stored, the log never forks, and
followers naming both ride out the loss of one: they stay fresh and a revocation submitted at the
survivor reaches them.

Real processes: two ``countersign coordinator serve`` over one schema of this machine's PostgreSQL, two
signers and a verifier following both (``coordinator = "a:1,b:2"``), the operator's checkpoint loop.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.client import OperatorClient, ServiceError
from countersign.client.operator import KnownHead, coordinator_log, submit_statement
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.stores.conftest import PostgresSchemas, dynamodb_url

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

STALENESS_MS = 3_000  # followers go stale this long after their coordinator stops answering


def wait_for(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def operator_at(mesh: LocalMesh, name: str) -> OperatorClient:
    return OperatorClient(
        mesh.daemons[name].address, mesh.tls_for("operator"), mesh.operator,
        checkpoint_lifetime_ms=mesh.lifetime_ms, known_head=mesh.operator_head,
    )  # fmt: skip


def enrolment(operator: OperatorClient, deployer: str) -> object:
    key = Ed25519Signer.generate()
    return operator.prepare(
        StatementKind.ENROL_DEPLOYER, deployer, key.key_id, public_key=b64url_encode(key.public_key), at_ms=0
    )


EMULATOR_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def _log_store(kind: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """A fresh shared log store of ``kind``, and the environment its coordinators need."""
    if kind == "postgresql":
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        return schemas.url(schemas.new()), {}
    from countersign._daemon.dynamodb import ensure_table

    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for name, value in EMULATOR_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    url = dynamodb_url(request.getfixturevalue("dynamodb_emulator"), f"cs-log-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    return url, EMULATOR_CREDENTIALS


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("dynamodb_emulator", marks=pytest.mark.dynamodb_emulator),
    ],
)
def test_two_coordinators_serve_one_log(tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    log_store, env = _log_store(kind, request)
    mesh = LocalMesh(
        tmp_path / "mesh", deployers=("deployer-a", "deployer-b"), coordinators=2, log_store_url=log_store,
        heartbeat_ms=200, staleness_ms=STALENESS_MS, extra_env=env,
    )  # fmt: skip
    with mesh:
        mesh.setup().start_all()
        mesh.enrol_all()  # through the first coordinator
        first, second = (mesh.daemons[name].address for name in mesh.coordinator_names)
        tls = mesh.tls_for("client")
        wait_for(lambda: coordinator_log(second, tls) == coordinator_log(first, tls), 5, "the second to serve the log")

        # Either accepts: a statement submitted at the second is served by the first.
        at_second = operator_at(mesh, "coordinator-1")
        try:
            key = Ed25519Signer.generate()
            at_second.submit(
                StatementKind.ENROL_DEPLOYER,
                "deployer-c",
                key.key_id,
                public_key=b64url_encode(key.public_key),
                at_ms=0,
            )
            wait_for(lambda: len(coordinator_log(first, tls)) == 3, 5, "the first to serve statement 2")

            # Two different statements for one sequence, one at each replica at once: one joins the log.
            # Each signed apart from the mesh's operator, with a record of its own of what it signed (spec
            # 7.5): the loser of the race is a statement no log will hold, which neither the mesh's
            # checkpoint loop nor the other signer may wait for.
            def apart() -> OperatorClient:
                return OperatorClient(
                    mesh.daemons["coordinator-1"].address, mesh.tls_for("operator"), mesh.operator,
                    known_head=KnownHead(),
                )  # fmt: skip

            signers = [apart(), apart(), apart()]
            racing = [enrolment(signers[0], "deployer-d"), enrolment(signers[1], "deployer-e")]

            def submit(job: tuple[str, object]) -> str:
                try:
                    submit_statement(job[0], mesh.tls_for("operator"), job[1], known_head=KnownHead())  # type: ignore[arg-type]
                except ServiceError as exc:
                    return exc.code
                return "OK"

            with ThreadPoolExecutor(2) as pool:
                codes = sorted(pool.map(submit, [(first, racing[0]), (second, racing[1])]))
            assert codes[0] == "OK" and codes[1] in ("SEQUENCE_CONFLICT", "CHAIN_MISMATCH"), codes
            wait_for(lambda: coordinator_log(first, tls) == coordinator_log(second, tls), 5, "one log on both")
            assert len(coordinator_log(first, tls)) == 4

            # The same statement at both (an operator retrying at the other replica): both accept it.
            again = enrolment(signers[2], "deployer-f")
            submit_statement(first, mesh.tls_for("operator"), again, known_head=signers[2].known_head)  # type: ignore[arg-type]
            submit_statement(second, mesh.tls_for("operator"), again, known_head=signers[2].known_head)  # type: ignore[arg-type]
            assert len(coordinator_log(second, tls)) == 5
            for signer in signers:
                signer.close()
        finally:
            at_second.close()

        # One coordinator lost: the followers naming both stay fresh past their staleness bound, and a
        # revocation submitted at the survivor reaches them.
        runtime_b = mesh.runtime("deployer-b")
        output = b"signed before the coordinator died"
        receipt = runtime_b.receipt(runtime_b.root("researcher", "replicas"), hashlib.sha256(output).digest())
        verifier = mesh.verifier_client()
        try:
            assert verifier.verify(receipt, output, audit=True)
            mesh.kill("coordinator")
            time.sleep(STALENESS_MS / 1000 * 1.5)
            assert verifier.verify(receipt, output, audit=True), "the verifier went stale"
            runtime_b.root("still-signing", "replicas")  # a signer refuses when stale (REGISTRY_STALE)
            survivor = operator_at(mesh, "coordinator-1")
            try:
                survivor.submit(StatementKind.REVOKE_KEY, "deployer-b", mesh.deployer_keys["deployer-b"].key_id)
            finally:
                survivor.close()
            wait_for(lambda: verifier.verify(receipt, output, audit=True).reason == "KEY_REVOKED", 5, "the revocation")
        finally:
            verifier.close()
            runtime_b.close()
