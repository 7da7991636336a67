"""A dishonest coordinator against real signers and verifiers (spec 7.5, ADR 0025).

The coordinator cannot forge a statement, but it can withhold one, serve an old checkpoint, or drop
heartbeats. Each test puts a lying proxy (tests/mesh/dishonest.py) between the real coordinator and
every follower and operator client, and shows that the followers fail closed with ``REGISTRY_STALE``
within the checkpoint lifetime, while the heartbeat bound (``staleness_ms``) is set far longer, so
only the checkpoint can be what bounds them; and that the operator is told (``NOT_SERVED``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign.admission import SignedStatement, StatementKind
from countersign.canonical import b64url_encode
from countersign.checkpoint import SignedCheckpoint
from countersign.client import OperatorClient
from countersign.client.operator import CheckpointLoop
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.mesh.conftest import log_tails
from tests.mesh.dishonest import DishonestCoordinator
from tests.mesh.helpers import poll, service_error, sha256

pytestmark = pytest.mark.daemons

LIFETIME_MS = 3_000  # the checkpoint lifetime: the bound every test checks
EVERY_MS = 500
STALENESS_MS = 60_000  # the heartbeat bound, far longer: it cannot be what makes a follower stale
SLACK_S = 2.0  # heartbeat delivery, polling and process scheduling on a shared machine


class Dishonest:
    """A mesh whose followers and operator all talk to the coordinator through the proxy."""

    def __init__(self, workdir: Path) -> None:
        self.mesh = LocalMesh(
            workdir, deployers=("deployer-a", "deployer-b"), tls=False, staleness_ms=STALENESS_MS,
            checkpoint_lifetime_ms=LIFETIME_MS, checkpoint_every_ms=0,
        ).setup()  # fmt: skip
        self.proxy: DishonestCoordinator | None = None
        self.loop: CheckpointLoop | None = None
        self.errors: list[str] = []
        self.checkpoints: list[SignedCheckpoint] = []

    def start(self) -> Dishonest:
        self.mesh.start("coordinator")
        self.proxy = DishonestCoordinator(self.mesh.daemons["coordinator"].address)
        self.mesh.coordinator_for_followers = self.proxy.address
        self.loop = CheckpointLoop(
            lambda: self.proxy.address if self.proxy else "", self.mesh.tls_for("operator"), self.mesh.operator,
            every_ms=EVERY_MS, checkpoint_lifetime_ms=LIFETIME_MS, known_head=self.mesh.operator_head,
            on_checkpoint=self.checkpoints.append, on_error=self._error,
        ).start()  # fmt: skip
        for name in self.mesh.daemons:
            self.mesh.start(name)
        operator = self.operator()
        try:
            for deployer, key in self.mesh.deployer_keys.items():
                public = b64url_encode(key.public_key)
                operator.submit(StatementKind.ENROL_DEPLOYER, deployer, key.key_id, public_key=public, at_ms=0)
        finally:
            operator.close()
        self.mesh.wait_for_registry(2)
        return self

    def _error(self, exc: Exception) -> None:
        self.errors.append(str(getattr(exc, "code", exc)))

    def operator(self) -> OperatorClient:
        assert self.proxy is not None
        return OperatorClient(
            self.proxy.address, self.mesh.tls_for("operator"), self.mesh.operator,
            checkpoint_lifetime_ms=LIFETIME_MS, known_head=self.mesh.operator_head,
        )  # fmt: skip

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        self.mesh.stop_all()
        if self.proxy is not None:
            self.proxy.close()


@pytest.fixture
def dishonest(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Dishonest]:
    made = Dishonest(tmp_path / "mesh").start()
    try:
        yield made
    finally:
        if hasattr(request.node, "rep_call") and request.node.rep_call.failed:
            print(log_tails(made.mesh))
        made.stop()


def verdict_of(mesh: LocalMesh, path: bytes, output: bytes) -> str:
    client = mesh.verifier_client()
    try:
        return str(client.verify(path, output, audit=True).result.reason or "ACCEPT")
    finally:
        client.close()


def accepted_until_stale(mesh: LocalMesh, path: bytes, output: bytes, since: float) -> tuple[float, float]:
    """Verify repeatedly until REGISTRY_STALE; return (seconds after ``since`` of the last ACCEPT,
    seconds until the first REGISTRY_STALE). Every answer in between must be one of the two."""
    last_accept = 0.0
    deadline = since + LIFETIME_MS / 1000 + SLACK_S
    while True:
        reason = verdict_of(mesh, path, output)
        elapsed = time.monotonic() - since
        if reason == "REGISTRY_STALE":
            return last_accept, elapsed
        assert reason == "ACCEPT", reason
        last_accept = elapsed
        assert time.monotonic() < deadline, f"still accepted {elapsed:.1f} s after the attack began"
        time.sleep(0.05)


def test_a_withheld_revocation_is_bounded_by_the_checkpoint_lifetime(dishonest: Dishonest) -> None:
    mesh, proxy = dishonest.mesh, dishonest.proxy
    assert proxy is not None
    b = mesh.runtime("deployer-b")
    output = b"signed by b\n"
    path = b.receipt(b.root("researcher", "withheld"), sha256(output)).to_bytes()
    assert verdict_of(mesh, path, output) == "ACCEPT"

    proxy.withhold = lambda signed: signed.statement.kind is StatementKind.REVOKE_KEY
    operator = dishonest.operator()
    try:
        error = service_error(
            lambda: operator.submit(StatementKind.REVOKE_KEY, "deployer-b", mesh.deployer_keys["deployer-b"].key_id)
        )
    finally:
        operator.close()
    revoked_at = time.monotonic()
    # The coordinator said OK; the operator's own read-back is what catches the lie.
    assert error.code == "NOT_SERVED", error
    assert [s.statement.kind for s in proxy.withheld] == [StatementKind.REVOKE_KEY]

    last_accept, stale_after = accepted_until_stale(mesh, path, output, revoked_at)
    print(f"withheld revocation: last ACCEPT {last_accept:.2f} s, REGISTRY_STALE from {stale_after:.2f} s")
    assert last_accept < LIFETIME_MS / 1000 + SLACK_S
    assert stale_after < LIFETIME_MS / 1000 + SLACK_S
    # The operator's loop refuses to checkpoint a log without the revocation it submitted.
    poll(lambda: "NOT_SERVED" in dishonest.errors, timeout_s=5, what="the checkpoint loop to report NOT_SERVED")
    signed_before = len(dishonest.checkpoints)
    assert all(c.checkpoint.sequence <= 2 for c in dishonest.checkpoints)
    # Signers fail closed as well: nothing is signed for anyone on the frozen registry.
    a = mesh.runtime("deployer-a")
    assert service_error(lambda: a.root("planner", "frozen")).code == "REGISTRY_STALE"
    # And it stays that way: the withheld statement never reaches the followers.
    time.sleep(EVERY_MS / 1000 * 3)
    assert verdict_of(mesh, path, output) == "REGISTRY_STALE"
    assert len(dishonest.checkpoints) == signed_before
    for client in (a, b):
        client.close()


def test_an_old_checkpoint_served_in_place_of_the_newest_makes_followers_stale(dishonest: Dishonest) -> None:
    mesh, proxy = dishonest.mesh, dishonest.proxy
    assert proxy is not None
    a = mesh.runtime("deployer-a")
    output = b"signed by a\n"
    path = a.receipt(a.root("planner", "frozen"), sha256(output)).to_bytes()
    assert verdict_of(mesh, path, output) == "ACCEPT"

    frozen = SignedCheckpoint.from_bytes(proxy.freeze_checkpoint())
    frozen_at = time.monotonic()
    # The operator's loop goes on signing newer checkpoints, which the coordinator accepts and hides.
    poll(lambda: "NOT_SERVED" in dishonest.errors, timeout_s=5, what="the loop to see its checkpoint not served")
    # A statement goes through, but its checkpoint is not served back either: the submit says so.
    extra = Ed25519Signer.generate()
    operator = dishonest.operator()
    try:
        error = service_error(
            lambda: operator.submit(
                StatementKind.ADD_KEY, "deployer-a", extra.key_id, public_key=b64url_encode(extra.public_key), at_ms=0
            )
        )
    finally:
        operator.close()
    assert error.code == "NOT_SERVED", error
    assert "older checkpoint" in str(error)

    _, stale_after = accepted_until_stale(mesh, path, output, frozen_at)
    print(f"frozen checkpoint: REGISTRY_STALE from {stale_after:.2f} s")
    expires_in_s = (frozen.checkpoint.expires_ms - frozen.checkpoint.issued_ms) / 1000
    assert stale_after < expires_in_s + SLACK_S
    assert service_error(lambda: a.root("planner", "frozen-2")).code == "REGISTRY_STALE"

    # Served honestly again, the followers take the operator's newest checkpoint and serve again.
    proxy.frozen_checkpoint = None
    poll(lambda: verdict_of(mesh, path, output) == "ACCEPT", timeout_s=10, what="fresh again once honest")
    a.close()


def test_dropped_heartbeats_are_bounded_by_the_checkpoint_lifetime(dishonest: Dishonest) -> None:
    mesh, proxy = dishonest.mesh, dishonest.proxy
    assert proxy is not None
    b = mesh.runtime("deployer-b")
    output = b"signed by b, heartbeats dropped\n"
    path = b.receipt(b.root("researcher", "silent"), sha256(output)).to_bytes()
    assert verdict_of(mesh, path, output) == "ACCEPT"

    proxy.drop_heartbeats.set()
    dropped_at = time.monotonic()
    _, stale_after = accepted_until_stale(mesh, path, output, dropped_at)
    print(f"dropped heartbeats: REGISTRY_STALE from {stale_after:.2f} s")
    assert stale_after < LIFETIME_MS / 1000 + SLACK_S  # STALENESS_MS is a minute: the checkpoint did it
    assert service_error(lambda: b.root("researcher", "silent-2")).code == "REGISTRY_STALE"

    proxy.drop_heartbeats.clear()
    poll(lambda: verdict_of(mesh, path, output) == "ACCEPT", timeout_s=10, what="fresh again with heartbeats")
    b.close()


def test_a_statement_signed_offline_keeps_followers_fresh_until_the_loop_names_it(dishonest: Dishonest) -> None:
    """A statement submitted without a checkpoint (the offline flow) extends the checkpointed log, so
    followers stay fresh on the previous checkpoint and the loop's next one names the new head."""
    from countersign.client.operator import submit_statement

    mesh = dishonest.mesh
    operator = dishonest.operator()
    try:
        statement = operator.log().next_statement(
            StatementKind.RETIRE_KEY, "deployer-a", mesh.deployer_keys["deployer-a"].key_id, issued_ms=1, at_ms=1
        )
    finally:
        operator.close()
    from countersign.admission import sign_statement

    signed: SignedStatement = sign_statement(statement, mesh.operator)
    assert dishonest.proxy is not None
    submit_statement(dishonest.proxy.address, mesh.tls_for("operator"), signed)
    mesh.wait_for_registry(3)
    a = mesh.runtime("deployer-b")
    output = b"still fresh\n"
    path = a.receipt(a.root("researcher", "offline"), sha256(output)).to_bytes()
    assert verdict_of(mesh, path, output) == "ACCEPT"
    poll(lambda: any(c.checkpoint.sequence == 3 for c in dishonest.checkpoints), timeout_s=5, what="a checkpoint of 3")
    a.close()
