"""What losing the signer's shared store costs: PostgreSQL stops and starts again under two signer replicas.

While the server is down every signing call is refused with the typed, retryable STATE_UNAVAILABLE:
nothing is issued (a record is answered only once what it spent is durable). Once the server is back the
same replica processes (not restarted) sign again within RECOVERY_BOUND_S of ``pg_isready``, and nothing
written before is forgotten: a session goes on from the seq it had, a spent grant stays spent, a request id
answered before is answered the same.

This restarts this machine's PostgreSQL cluster (root, ``pg_ctlcluster``): run it alone (``-m exclusive``).
The server is started again even when the test fails.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path as FilePath

import pytest

from countersign._proto.v1 import signer_pb2
from countersign.client import RetryPolicy, ServiceError, SignerClient
from countersign_cli.localmesh import LocalMesh
from tests.replicas.conftest import PgCluster, poll
from tests.stores.conftest import PostgresSchemas

pytestmark = [pytest.mark.daemons, pytest.mark.postgres, pytest.mark.slow, pytest.mark.exclusive]

DEPLOYER = "deployer-a"
OUTAGE_S = 8.0
RECOVERY_BOUND_S = 5.0


@pytest.fixture
def mesh(tmp_path: FilePath, pg_schemas: PostgresSchemas) -> Iterator[LocalMesh]:
    made = LocalMesh(
        tmp_path / "mesh", deployers=(DEPLOYER,), verifiers=0, signer_replicas={DEPLOYER: 2},
        signer_state_urls={DEPLOYER: pg_schemas.url(pg_schemas.new(), connect_timeout=2)},
    )  # fmt: skip
    with made:
        made.setup().start_all()
        made.enrol_all()
        yield made


def test_a_store_outage_is_typed_retryable_and_forgets_nothing(mesh: LocalMesh, pg_cluster: PgCluster) -> None:
    tls = mesh.tls_for(f"{DEPLOYER}-runtime")
    replicas = [
        SignerClient(mesh.daemons[name].address, tls, DEPLOYER, lanes=0, retry=RetryPolicy(attempts=1))
        for name in mesh.signer_names(DEPLOYER)
    ]
    try:
        agent = replicas[0].root("writer", "outage", max_children=4)
        first = replicas[0].receipt(agent, hashlib.sha256(b"before").digest(), session="s")
        retried = signer_pb2.IssueReceiptRequest(
            parent_path=agent.to_bytes(), output_sha256=hashlib.sha256(b"retried").digest(), session="s",
            request_id=uuid.uuid4().hex,
        )  # fmt: skip
        second = replicas[1]._call("IssueReceipt", retried)

        assert pg_cluster.ctl("stop").returncode == 0
        down_at = time.monotonic()
        refused: list[tuple[str, bool]] = []
        while time.monotonic() - down_at < OUTAGE_S:
            for index, replica in enumerate(replicas):
                with pytest.raises(ServiceError) as raised:  # never a receipt while the store is down
                    replica.receipt(agent, hashlib.sha256(b"during %d" % index).digest(), session="s")
                refused.append((raised.value.code, raised.value.retryable))
            time.sleep(0.5)
        assert set(refused) == {("STATE_UNAVAILABLE", True)}, set(refused)

        assert pg_cluster.ctl("start").returncode == 0
        poll(pg_cluster.ready, timeout_s=60, interval_s=0.2, what="pg_isready")
        up_at = time.monotonic()
        recovered_in = []
        for index, replica in enumerate(replicas):

            def signs(replica: SignerClient = replica, index: int = index) -> bool:
                try:
                    replica.local_child(agent, f"after-{index}")
                except ServiceError:
                    return False
                return True

            poll(signs, timeout_s=RECOVERY_BOUND_S + 10, interval_s=0.1, what=f"replica {index} signing again")
            recovered_in.append(time.monotonic() - up_at)
        assert max(recovered_in) < RECOVERY_BOUND_S, recovered_in

        # Nothing forgotten: the session goes on from seq 1, the request id answers the same receipt.
        third = replicas[0].receipt(agent, hashlib.sha256(b"after").digest(), session="s")
        assert third.leaf.record.output is not None and third.leaf.record.output.seq == 2
        assert third.leaf.record.output.prev == second.record_digest
        assert replicas[0]._call("IssueReceipt", retried).path == second.path
        assert first.leaf.record.output is not None and first.leaf.record.output.seq == 0
    finally:
        for replica in replicas:
            replica.close()
