"""The consumer object names every verifier replica (ADR 0033): a replica killed between two checks, or
one whose registry copy is stale, costs a check nothing but a retry at the next, under one request id.

Real processes: two verifiers sharing one SQLite store (replicas on one host), a coordinator and a signer.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path as FilePath

import pytest

from countersign.client import Consumer
from countersign.reasons import Reason
from countersign_cli.localmesh import LocalMesh

pytestmark = [pytest.mark.daemons, pytest.mark.slow]


@pytest.fixture
def mesh(tmp_path: FilePath) -> Iterator[LocalMesh]:
    made = LocalMesh(
        tmp_path / "mesh", deployers=("deployer-a",), verifiers=2, staleness_ms=3_000,
        verifier_store_url=f"sqlite:///{tmp_path / 'shared-verifier.db'}",
    )  # fmt: skip
    with made:
        made.setup().start_all()
        made.enrol_all()
        yield made


def receipts(mesh: LocalMesh, count: int) -> list[tuple[bytes, bytes]]:
    runtime = mesh.runtime("deployer-a")
    try:
        agent = runtime.root("writer", "consumer-failover")
        outputs = [f"output {i}".encode() for i in range(count)]
        return [(runtime.receipt(agent, hashlib.sha256(o).digest()).to_bytes(), o) for o in outputs]
    finally:
        runtime.close()


def test_a_killed_verifier_costs_a_check_a_retry(mesh: LocalMesh) -> None:
    evidence = receipts(mesh, 4)
    addresses = ",".join(mesh.daemons[f"verifier-{i}"].address for i in range(2))
    with Consumer.online(addresses, mesh.tls_for("client")) as consumer:
        assert consumer.path(*evidence[0])
        mesh.kill("verifier-0")  # the replica that answered
        assert consumer.path(*evidence[1]), "answered by the other replica"
        assert consumer.path(*evidence[0]).reason is Reason.NONCE_REPLAYED, "one store: consumed is consumed"


def test_a_stale_replica_checked_nothing_and_the_next_one_answers(mesh: LocalMesh) -> None:
    evidence = receipts(mesh, 1)
    addresses = ",".join(mesh.daemons[f"verifier-{i}"].address for i in range(2))
    # verifier-0 restarted to follow a coordinator that is not there: past its staleness bound it answers
    # REGISTRY_STALE for everything (it checked nothing); verifier-1 still follows the real one.
    mesh.stop("verifier-0")
    mesh.coordinator_for_followers = "127.0.0.1:9"
    mesh.start("verifier-0")
    mesh.coordinator_for_followers = None
    stale_alone = Consumer.online(mesh.daemons["verifier-0"].address, mesh.tls_for("client"))
    try:
        deadline = time.monotonic() + mesh.staleness_ms / 1000 + 10
        while stale_alone.path(*evidence[0], audit=True).reason is not Reason.REGISTRY_STALE:
            assert time.monotonic() < deadline, "verifier-0 never went stale"
            time.sleep(0.2)
    finally:
        stale_alone.close()
    with Consumer.online(addresses, mesh.tls_for("client")) as consumer:
        verdict = consumer.path(*evidence[0])
        assert verdict, verdict.result  # verifier-0 answered REGISTRY_STALE; verifier-1 checked and accepted
        assert consumer.path(*evidence[0]).reason is Reason.NONCE_REPLAYED
