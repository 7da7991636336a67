"""A dishonest coordinator against real signers and verifiers (spec 7.5, ADR 0025).

The coordinator cannot forge a statement, but it can withhold one, serve an old checkpoint, or drop
heartbeats. Each test puts a lying proxy (tests/mesh/dishonest.py) between the real coordinator and
every follower and operator client, and shows that the followers fail closed with ``REGISTRY_STALE``
within the checkpoint lifetime, while the heartbeat bound (``staleness_ms``) is set far longer, so
only the checkpoint can be what bounds them; and that the operator is told (``NOT_SERVED``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from countersign.admission import SignedStatement, StatementKind
from countersign.canonical import b64url_encode
from countersign.checkpoint import SignedCheckpoint
from countersign.client import OperatorClient
from countersign.client.operator import CheckpointLoop, KnownHead
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from tests.mesh.conftest import enrol_some, log_tails
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
    submit_statement(dishonest.proxy.address, mesh.tls_for("operator"), signed, known_head=mesh.operator_head)
    mesh.wait_for_registry(3)
    a = mesh.runtime("deployer-b")
    output = b"still fresh\n"
    path = a.receipt(a.root("researcher", "offline"), sha256(output)).to_bytes()
    assert verdict_of(mesh, path, output) == "ACCEPT"
    poll(lambda: any(c.checkpoint.sequence == 3 for c in dishonest.checkpoints), timeout_s=5, what="a checkpoint of 3")
    a.close()


# --- a statement signed on one machine and submitted from another (the offline flow) -------------------

MEASURE_S = 3.0  # how long after lifetime + 1 s the revoked key's path is presented


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


class CheckpointCommand:
    """``countersign operator checkpoint --every-ms`` as the operator runs it: a process of its own,
    its head file beside the operator key (the default), talking to the coordinator through the proxy."""

    def __init__(self, key: Path, coordinator: str) -> None:
        argv = [
            sys.executable, "-m", "countersign_cli", "operator", "checkpoint", "--key", str(key),
            "--every-ms", str(EVERY_MS), "--lifetime-ms", str(LIFETIME_MS), "--coordinator", coordinator,
            "--insecure-loopback",
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.printed: list[dict[str, object]] = []
        self.complaints: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, out: bool) -> None:
        for line in stream:
            if out:
                self.printed.append(json.loads(line))
            else:
                self.complaints.append(line.strip())

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def accepts_after_lifetime(mesh: LocalMesh, path: bytes, output: bytes, since: float) -> tuple[int, int]:
    """Present ``path`` from lifetime + 1 s after ``since`` for MEASURE_S seconds: (ACCEPTs, answers)."""
    start = since + LIFETIME_MS / 1000 + 1.0
    time.sleep(max(0.0, start - time.monotonic()))
    accepted = answers = 0
    while time.monotonic() < start + MEASURE_S:
        reason = verdict_of(mesh, path, output)
        assert reason in ("ACCEPT", "REGISTRY_STALE"), reason
        accepted += reason == "ACCEPT"
        answers += 1
        time.sleep(0.05)
    return accepted, answers


@pytest.mark.parametrize("recorded_by", ["signing", "submitting"])
def test_a_revocation_signed_offline_and_withheld_is_bounded_by_the_checkpoint_lifetime(
    tmp_path: Path, recorded_by: str
) -> None:
    """Issue 29: the revocation is signed offline (``operator revoke-key --out``) and carried to a
    connected machine (``operator submit``); the coordinator says OK and withholds it. The operator's
    checkpoint command must refuse to vouch for the log without it, whichever of the two commands ran
    where the checkpoint command's head file is: ``signing`` signs beside the operator key (the
    loop's head file) and submits from elsewhere; ``submitting`` signs elsewhere and submits with the
    loop's head file."""
    mesh = LocalMesh(
        tmp_path / "mesh", deployers=("deployer-a", "deployer-b"), tls=False, staleness_ms=STALENESS_MS,
        checkpoint_lifetime_ms=LIFETIME_MS, checkpoint_every_ms=0,
    ).setup()  # fmt: skip
    key = mesh.workdir / "keys" / "operator.jwk"
    loop_head = key.with_suffix(".head.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mesh.operator_head = KnownHead(loop_head)  # the connected enrolment records where the loop reads
    proxy: DishonestCoordinator | None = None
    loop: CheckpointCommand | None = None
    try:
        mesh.start("coordinator")
        proxy = DishonestCoordinator(mesh.daemons["coordinator"].address)
        mesh.coordinator_for_followers = proxy.address
        loop = CheckpointCommand(key, proxy.address)
        for name in mesh.daemons:
            mesh.start(name)
        enrol_some(mesh, ["deployer-a", "deployer-b"])
        b = mesh.runtime("deployer-b")
        output = b"signed by b, revoked offline\n"
        path = b.receipt(b.root("researcher", "offline-revoked"), sha256(output)).to_bytes()
        b.close()
        assert verdict_of(mesh, path, output) == "ACCEPT"

        connect = ["--coordinator", proxy.address, "--insecure-loopback"]
        export = tmp_path / "export"
        operator_public = f"--operator-public-key={b64url_encode(mesh.operator.public_key)}"
        exported = run_cli("registry", "export", operator_public, "--out", str(export), *connect)
        assert exported.returncode == 0, exported.stderr
        revocation = tmp_path / "revoke.json"
        sign_head = [] if recorded_by == "signing" else ["--head-file", str(elsewhere / "head.json")]
        signed = run_cli(
            "operator", "revoke-key", "--key", str(key), "--deployer", "deployer-b",
            "--key-id", mesh.deployer_keys["deployer-b"].key_id, "--log", str(export / "registry-log.json"),
            "--out", str(revocation), *sign_head,
        )  # fmt: skip
        assert signed.returncode == 0, signed.stderr

        proxy.withhold = lambda statement: statement.statement.kind is StatementKind.REVOKE_KEY
        submit_head = str(elsewhere / "head.json") if recorded_by == "signing" else str(loop_head)
        submitted = run_cli("operator", "submit", "--statement", str(revocation), "--head-file", submit_head, *connect)
        revoked_at = time.monotonic()
        assert [s.statement.kind for s in proxy.withheld] == [StatementKind.REVOKE_KEY]
        assert submitted.returncode != 0 and "NOT_SERVED" in submitted.stderr, submitted.stderr

        accepted, answers = accepts_after_lifetime(mesh, path, output, revoked_at)
        print(f"offline revocation ({recorded_by}): {accepted} ACCEPTs of {answers} after lifetime + 1 s")
        assert accepted == 0, f"{accepted} ACCEPTs of the revoked key after the checkpoint lifetime + 1 s"
        assert any("NOT_SERVED" in line for line in loop.complaints), loop.complaints
        assert all(int(str(c["sequence"])) <= 2 for c in loop.printed)
    finally:
        if loop is not None:
            loop.stop()
        mesh.stop_all()
        if proxy is not None:
            proxy.close()
