"""The registry log in PostgreSQL: a coordinator restarted elsewhere (no local files) loses no statement."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.client.operator import coordinator_log
from countersign.errors import ServiceError
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.stores.conftest import PostgresSchemas

pytestmark = [pytest.mark.daemons, pytest.mark.postgres]


def test_coordinator_restarted_on_another_host_keeps_every_statement(
    tmp_path: Path, pg_schemas: PostgresSchemas
) -> None:
    log_store = pg_schemas.url(pg_schemas.new())
    mesh = LocalMesh(tmp_path / "mesh", verifiers=1, extra_env={"COUNTERSIGN_LOG_STORE": log_store}, heartbeat_ms=200)
    with mesh:
        mesh.setup().start_all()
        mesh.enrol_all()
        coordinator = mesh.daemons["coordinator"]
        before = coordinator_log(coordinator.address, mesh.tls_for("client"))
        assert len(before) == 3
        assert mesh.stop("coordinator") == 0
        # "Another host": nothing of the first coordinator's local state survives.
        shutil.rmtree(mesh.workdir / "state", ignore_errors=True)
        (mesh.workdir / "state").mkdir()
        mesh.start("coordinator")
        assert coordinator_log(coordinator.address, mesh.tls_for("client")) == before
        extra = Ed25519Signer.generate()
        operator = mesh.operator_client()
        try:
            signed = operator.submit(
                StatementKind.ENROL_DEPLOYER,
                "deployer-d",
                extra.key_id,
                public_key=b64url_encode(extra.public_key),
                at_ms=0,
            )
            assert signed.statement.sequence == 3
            with pytest.raises(ServiceError) as refused:  # the stored head is enforced after the restart too
                operator.submit(
                    StatementKind.ENROL_DEPLOYER, "deployer-d", extra.key_id,
                    public_key=b64url_encode(extra.public_key), at_ms=0,
                )  # fmt: skip
            assert refused.value.code == "INVALID_STATEMENT"
        finally:
            operator.close()
        assert len(coordinator_log(coordinator.address, mesh.tls_for("client"))) == 4
