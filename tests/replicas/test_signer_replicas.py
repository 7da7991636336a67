"""Signer replicas on one shared state (ADR 0033): three ``countersign signer serve`` processes per deployer,
every one of them over the same store, raced on purpose.

Real processes throughout (a coordinator, three signer replicas of the parent deployer and three of the
child deployer, each deployer on its own store, a verifier), over mTLS on loopback. The PostgreSQL case
uses this machine's real server (a fresh schema per deployer); the DynamoDB case runs the same races,
smaller, against moto in server mode, an emulator (tests/stores/conftest.py says what it proves).

* Grants: each grant of the parent is accepted by 12 concurrent ``AcceptDelegation`` calls spread over
  the child's three replicas (each asking the parent's replicas in turn): every call answers, all with
  one and the same child record, and the parent's signers spent exactly one child slot per grant.
* Sessions: receipts of many sessions sent concurrently, interleaved over the three replicas: every
  session's receipts number 0, 1, ... without a gap or a repeat, chain each to the one before, and the
  verifier accepts each session whole (``VerifySession``).
* Retries: one receipt asked under one request id at each replica in turn gets the same receipt back
  every time, and takes one place in its session.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path as FilePath

import pytest

from countersign._proto.v1 import signer_pb2
from countersign.client import ServiceError, SignerClient
from countersign.client.results import Grant
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh
from tests.stores.conftest import PostgresSchemas, dynamodb_url

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

PARENT, CHILD = "deployer-a", "deployer-b"
REPLICAS = 3
EMULATOR_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "x"}


def _store_urls(kind: str, request: pytest.FixtureRequest) -> dict[str, str]:
    """A fresh store per deployer: one's signer replicas share it, the other deployer's never see it."""
    if kind == "postgresql":
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        return {d: schemas.url(schemas.new()) for d in (PARENT, CHILD)}
    from countersign._daemon.dynamodb import ensure_table

    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    for name, value in EMULATOR_CREDENTIALS.items():  # boto3's ordinary chain, as a task role would be
        monkeypatch.setenv(name, value)
    endpoint = request.getfixturevalue("dynamodb_emulator")
    urls = {d: dynamodb_url(endpoint, f"cs-signer-{uuid.uuid4().hex[:10]}") for d in (PARENT, CHILD)}
    for url in urls.values():
        ensure_table(url)
    return urls


@pytest.fixture
def replicated(tmp_path: FilePath, request: pytest.FixtureRequest) -> Iterator[Callable[[str], LocalMesh]]:
    meshes: list[LocalMesh] = []

    def make(kind: str) -> LocalMesh:
        mesh = LocalMesh(
            tmp_path / f"mesh-{kind}",
            deployers=(PARENT, CHILD),
            verifiers=1,
            signer_replicas={PARENT: REPLICAS, CHILD: REPLICAS},
            signer_state_urls=_store_urls(kind, request),
            extra_env=EMULATOR_CREDENTIALS if kind == "dynamodb_emulator" else {},
            signer_options={"max_workers": 48},
        ).setup()
        meshes.append(mesh)
        mesh.start_all()
        mesh.enrol_all()
        return mesh

    yield make
    for mesh in meshes:
        mesh.stop_all()


def replica_clients(mesh: LocalMesh, deployer: str) -> list[SignerClient]:
    """One client per replica, each naming that replica alone (so the test decides who is asked)."""
    tls = mesh.tls_for(f"{deployer}-runtime")
    return [SignerClient(mesh.daemons[name].address, tls, deployer, lanes=0) for name in mesh.signer_names(deployer)]


def race_grants(mesh: LocalMesh, grants: int, callers: int) -> None:
    parents, children = replica_clients(mesh, PARENT), replica_clients(mesh, CHILD)
    parent_signers = mesh.signer_addresses(PARENT)
    try:
        root = parents[0].root("planner", "races", max_children=grants * 2)
        opened: list[Grant] = [parents[i % REPLICAS].open_grant(root, CHILD) for i in range(grants)]

        def accept(job: tuple[int, int]) -> tuple[int, bytes]:
            grant, caller = job
            child = children[(grant + caller) % REPLICAS]
            return grant, child.accept(root, opened[grant], parent_signers, f"r{grant}-{caller}").to_bytes()

        jobs = list(itertools.product(range(grants), range(callers)))
        with ThreadPoolExecutor(24) as pool:
            answers = list(pool.map(accept, jobs))
        edges: dict[int, set[bytes]] = defaultdict(set)
        for grant, path in answers:
            edges[grant].add(path)
        assert len(answers) == grants * callers, "every call was answered"
        assert {grant: len(paths) for grant, paths in edges.items()} == dict.fromkeys(range(grants), 1)
        # The parent spent exactly one slot per grant: as many more as allowed are still free.
        spare = [parents[0].local_child(root, f"spare-{i}") for i in range(grants)]
        assert len(spare) == grants
        with pytest.raises(ServiceError) as full:
            parents[1].local_child(root, "one-too-many")
        assert full.value.code == "FANOUT_EXCEEDED"
    finally:
        for client in parents + children:
            client.close()


def race_sessions(mesh: LocalMesh, sessions: int, per_session: int) -> None:
    children = replica_clients(mesh, CHILD)
    try:
        agent = children[0].root("writer", "races", max_children=1)
        outputs = {(s, k): f"session {s} output {k}".encode() for s in range(sessions) for k in range(per_session)}

        def issue(job: tuple[int, int]) -> tuple[int, bytes, Path]:
            s, k = job
            output = outputs[s, k]
            receipt = children[(s + k) % REPLICAS].receipt(agent, hashlib.sha256(output).digest(), session=f"s{s}")
            return s, output, receipt

        # Interleaved: session after session, each receipt to the next replica, all in flight at once.
        jobs = [(s, k) for k in range(per_session) for s in range(sessions)]
        with ThreadPoolExecutor(24) as pool:
            issued = list(pool.map(issue, jobs))
        by_session: dict[int, list[tuple[int, bytes, Path]]] = defaultdict(list)
        for s, output, receipt in issued:
            record = receipt.leaf.record
            assert record.output is not None
            by_session[s].append((record.output.seq, output, receipt))
        verifier = mesh.verifier_client()
        try:
            for s, receipts in by_session.items():
                receipts.sort(key=lambda item: item[0])
                assert [seq for seq, _, _ in receipts] == list(range(per_session)), f"session {s}: a gap or repeat"
                evidence = SessionEvidence(agent, tuple(r.leaf for _, _, r in receipts))
                verdict = verifier.verify_session(evidence, [output for _, output, _ in receipts])
                assert verdict, (s, verdict.result)
        finally:
            verifier.close()
    finally:
        for client in children:
            client.close()


def retries_get_the_first_answer(mesh: LocalMesh) -> None:
    children = replica_clients(mesh, CHILD)
    try:
        agent = children[0].root("retrier", "races")
        request = signer_pb2.IssueReceiptRequest(
            parent_path=agent.to_bytes(), output_sha256=hashlib.sha256(b"once").digest(), session="retried",
            request_id=uuid.uuid4().hex,
        )  # fmt: skip
        answers = {children[i % REPLICAS]._call("IssueReceipt", request).path for i in range(6)}
        assert len(answers) == 1
        (first,) = answers
        # It took one place: the session's next receipt is seq 1.
        following = children[2].receipt(agent, hashlib.sha256(b"next").digest(), session="retried")
        assert following.leaf.record.output is not None and following.leaf.record.output.seq == 1
        assert following.leaf.record.output.prev == Path.from_bytes(first).leaf.digest()
        # The same request id for a different output is refused, not answered with the first receipt.
        other = signer_pb2.IssueReceiptRequest()
        other.CopyFrom(request)
        other.output_sha256 = hashlib.sha256(b"something else").digest()
        with pytest.raises(ServiceError) as reused:
            children[1]._call("IssueReceipt", other)
        assert reused.value.code == "INVALID_ARGUMENT"
    finally:
        for client in children:
            client.close()


@pytest.mark.postgres
def test_three_replicas_on_postgresql(replicated: Callable[[str], LocalMesh]) -> None:
    mesh = replicated("postgresql")
    race_grants(mesh, grants=int(os.environ.get("COUNTERSIGN_TEST_RACED_GRANTS", "200")), callers=12)
    race_sessions(mesh, sessions=100, per_session=6)
    retries_get_the_first_answer(mesh)


@pytest.mark.dynamodb_emulator
def test_three_replicas_on_the_dynamodb_emulator(replicated: Callable[[str], LocalMesh]) -> None:
    mesh = replicated("dynamodb_emulator")
    race_grants(mesh, grants=20, callers=12)
    race_sessions(mesh, sessions=10, per_session=6)
    retries_get_the_first_answer(mesh)
