"""VerifySession and VerifySessions against a real verifier daemon (mTLS, its SQLite store): sessions
signed by a real signer, verified as a whole; accept consumes every receipt's nonce all or nothing,
audit consumes nothing; the verdict is logged; requests are bounded (docs/spec.md 17.5, ADR 0022)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path as FilePath

import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.client import ServiceError, VerifierClient
from countersign.keys import PublicKey
from countersign.reasons import Reason
from countersign.records import Path
from countersign.registry import KeyEntry, Registry
from countersign.sessions import SessionEvidence
from countersign.state import DependencyKind
from countersign_cli.localmesh import LocalMesh
from tests.coordinator.test_operator_cli import tls
from tests.mesh.helpers import channel_to, service_error, sha256, verifier_stub
from verifier.stores import open_store

pytestmark = pytest.mark.daemons


@dataclass
class Signed:
    agent: Path
    receipts: list[Path]  # each the path agent -> receipt, as the signer answered it
    outputs: list[bytes | None]

    def evidence(self, order: list[int] | None = None) -> SessionEvidence:
        chosen = self.receipts if order is None else [self.receipts[i] for i in order]
        return SessionEvidence(self.agent, tuple(p.leaf for p in chosen))


def sign_session(mesh: LocalMesh, turns: int = 3, *, closed: bool = True) -> Signed:
    """A Writer's session through deployer-a's signer: ``turns`` receipts, then (if ``closed``) the close."""
    runtime = mesh.runtime("deployer-a")
    try:
        name = f"chat-{uuid.uuid4().hex[:8]}"
        agent = runtime.root(f"writer-{name}", "sessions", max_children=1)
        outputs: list[bytes | None] = [b"turn %d of %s" % (i, name.encode()) for i in range(turns)]
        receipts = [runtime.receipt(agent, sha256(o or b""), session=name) for o in outputs]
        if closed:
            receipts.append(runtime.close_session(agent, session=name))
            outputs.append(None)
        return Signed(agent, receipts, outputs)
    finally:
        runtime.close()


@pytest.fixture
def verifier(mesh: LocalMesh) -> Iterator[VerifierClient]:
    with mesh.verifier_client() as client:
        yield client


def test_an_accepted_session_names_its_emitter_and_is_consumed_once(mesh: LocalMesh, verifier: VerifierClient) -> None:
    signed = sign_session(mesh)
    answer = verifier.verify_session(signed.evidence(), signed.outputs, require_closed=True)
    assert answer, answer.result
    assert answer.session is not None
    last = signed.receipts[-1].leaf.record
    assert last.output is not None
    assert (answer.session.session, answer.session.receipts, answer.session.closed) == (last.output.session, 4, True)
    emitter = answer.result.attribution.emitter if answer.result.attribution else None
    assert emitter is not None
    assert (emitter.deployer, emitter.key_id, emitter.session, emitter.seq) == (
        "deployer-a", last.key_id, last.output.session, 3,
    )  # fmt: skip
    assert emitter.agent_instance == signed.agent.leaf.record.agent.instance
    again = verifier.verify_session(signed.evidence(), signed.outputs, require_closed=True)
    assert (again.reason, again.result.index) == (Reason.NONCE_REPLAYED, 0)
    assert again.result.attribution is not None  # decided after the session verified, as VerifyPath does
    # Each receipt is consumed as its own path's leaf: VerifyPath on one of them is a replay too.
    assert verifier.verify(signed.receipts[1], signed.outputs[1] or b"").reason is Reason.NONCE_REPLAYED
    assert verifier.verify_session(signed.evidence(), signed.outputs, audit=True)  # audit still verifies


def test_rearranged_sessions_are_rejected_with_the_first_offending_receipt(
    mesh: LocalMesh, verifier: VerifierClient
) -> None:
    signed = sign_session(mesh)
    cases = {
        "reordered": ([1, 0, 2, 3], False, Reason.SESSION_REORDERED, 0),
        "dropped": ([0, 2, 3], False, Reason.SESSION_GAP, 1),
        "duplicated": ([0, 1, 1, 2, 3], False, Reason.SESSION_DUPLICATE, 1),
        "truncated": ([0, 1, 2], True, Reason.SESSION_TRUNCATED, None),
    }
    for name, (order, closed, reason, index) in cases.items():
        answer = verifier.verify_session(signed.evidence(order), require_closed=closed)
        assert (answer.reason, answer.result.index) == (reason, index), name
        assert answer.session is None and answer.result.attribution is None, name
    substituted = [*signed.outputs]
    substituted[1] = b"another answer"
    answer = verifier.verify_session(signed.evidence(), substituted)
    assert (answer.reason, answer.result.index) == (Reason.SESSION_OUTPUT_MISMATCH, 1)
    # None of the rejects consumed anything: the session is still accepted once.
    assert verifier.verify_session(signed.evidence(), signed.outputs, require_closed=True)


def test_a_session_whose_third_receipt_was_accepted_alone_consumes_nothing(
    mesh: LocalMesh, verifier: VerifierClient
) -> None:
    signed = sign_session(mesh, 4, closed=False)
    assert verifier.verify(signed.receipts[2], signed.outputs[2] or b"")  # VerifyPath on receipt 2 alone
    answer = verifier.verify_session(signed.evidence(), signed.outputs)
    assert (answer.reason, answer.result.index) == (Reason.NONCE_REPLAYED, 2)
    for position in (0, 1, 3):  # none of the others was consumed by the rejected session
        assert verifier.verify(signed.receipts[position], signed.outputs[position] or b""), position


def test_audit_consumes_nothing_and_a_retry_under_its_key_is_accepted_again(
    mesh: LocalMesh, verifier: VerifierClient
) -> None:
    signed = sign_session(mesh, 2)
    for _ in range(2):
        assert verifier.verify_session(signed.evidence(), signed.outputs, audit=True)
    before = time.time_ns() // 1_000_000
    first = verifier.verify_session(signed.evidence(), signed.outputs, request_id="session-retry-1")
    assert first and first.retry_of_ms is None
    # The retry is accepted again and says so, with the time of the acceptance it repeats.
    again = verifier.verify_session(signed.evidence(), signed.outputs, request_id="session-retry-1")
    assert again and again.retry_of_ms is not None
    assert before <= again.retry_of_ms <= time.time_ns() // 1_000_000
    assert again.session == first.session and again.result.attribution == first.result.attribution
    other = verifier.verify_session(signed.evidence(), signed.outputs, request_id="session-retry-2")
    assert other.reason is Reason.NONCE_REPLAYED and other.retry_of_ms is None


def test_the_verdict_is_logged_with_every_record_it_relied_on(mesh: LocalMesh, verifier: VerifierClient) -> None:
    signed = sign_session(mesh, 2)
    assert verifier.verify_session(signed.evidence(), signed.outputs)
    store = open_store(f"sqlite:///{mesh.workdir / 'state' / 'verifier-0.db'}")
    try:
        digests = [p.leaf.digest() for p in signed.receipts]
        logged = store.accepts_relying_on(DependencyKind.RECORD, digests[-1:])
        assert len(logged) == 1 and logged[0].mode == "accept"
        relied_on = [r.digest for r in logged[0].records]
        assert relied_on == [e.digest() for e in signed.agent.envelopes] + digests
    finally:
        store.close()


def test_the_session_stream_answers_each_session_in_order(mesh: LocalMesh) -> None:
    first, second = sign_session(mesh, 2), sign_session(mesh, 1)
    channel = channel_to(mesh, "verifier-0", "client")
    try:
        requests = [
            verifier_pb2.VerifySessionRequest(session=first.evidence().to_bytes()),
            verifier_pb2.VerifySessionRequest(session=first.evidence().to_bytes()),
            verifier_pb2.VerifySessionRequest(session=second.evidence([1, 0]).to_bytes()),
            verifier_pb2.VerifySessionRequest(session=b'{"v": 1, "agent": '),
        ]
        answers = list(verifier_stub(channel).VerifySessions(iter(requests), timeout=30))
    finally:
        channel.close()
    assert [(a.verdict.reason, a.verdict.index) for a in answers] == [
        ("", -1), ("NONCE_REPLAYED", 0), ("SESSION_REORDERED", 0), ("MALFORMED", -1),
    ]  # fmt: skip
    assert answers[0].session.receipts == 3 and answers[0].session.closed
    assert not answers[2].HasField("session")


def test_bad_requests_are_typed_refusals_or_malformed_verdicts(mesh: LocalMesh, verifier: VerifierClient) -> None:
    signed = sign_session(mesh, 2)
    answer = verifier.verify_session(signed.evidence(), signed.outputs[:1])
    assert (answer.reason, answer.result.index) == (Reason.MALFORMED, None)
    assert verifier.verify_session(b"not json").reason is Reason.MALFORMED
    channel = channel_to(mesh, "verifier-0", "client")
    try:
        stub = verifier_stub(channel)
        error = service_error(lambda: stub.VerifySession(
            verifier_pb2.VerifySessionRequest(session=signed.evidence().to_bytes(), mode=7), timeout=10
        ))  # fmt: skip
        assert error.code == "INVALID_ARGUMENT"
        error = service_error(lambda: stub.VerifySession(
            verifier_pb2.VerifySessionRequest(session=b"{}", request_id="\x00bad"), timeout=10
        ))  # fmt: skip
        assert error.code == "INVALID_ARGUMENT"
    finally:
        channel.close()
    assert "Traceback" not in mesh.log_tail("verifier-0", 200)


def test_receipts_per_request_are_bounded(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",), verifier_options={"max_session_receipts": 3})
    signed = sign_session(mesh, 3)  # four receipts with the close
    with mesh.verifier_client() as verifier:
        for audit in (False, True):
            error = service_error(lambda: verifier.verify_session(signed.evidence(), audit=audit))  # noqa: B023
            assert error.code == "INVALID_ARGUMENT" and "at most 3" in str(error)
        assert verifier.verify_session(signed.evidence([0, 1, 2]))  # within the bound: verified and consumed
        assert verifier.verify_session(signed.evidence([0, 1, 2])).reason is Reason.NONCE_REPLAYED


def write_session(signed: Signed, out: FilePath, order: list[int] | None = None) -> FilePath:
    """Lay a session out as ``countersign verify-session`` reads it: agent.json, receipts/, outputs/."""
    (out / "receipts").mkdir(parents=True)
    (out / "outputs").mkdir()
    (out / "agent.json").write_bytes(signed.agent.to_bytes())
    for position, index in enumerate(range(len(signed.receipts)) if order is None else order):
        (out / "receipts" / f"{position:06d}.json").write_bytes(signed.receipts[index].leaf.canonical_bytes())
        output = signed.outputs[index]
        if output is not None:
            (out / "outputs" / f"{position:06d}.bin").write_bytes(output)
    return out


def cli(*args: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run([sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}


def test_verify_session_remote_prints_the_offline_verdict(mesh: LocalMesh, tmp_path: FilePath) -> None:
    signed = sign_session(mesh)
    folder = write_session(signed, tmp_path / "session")
    keys = {d: {k.key_id: KeyEntry(PublicKey(k.public_key), 0)} for d, k in mesh.deployer_keys.items()}
    (tmp_path / "registry.json").write_text(json.dumps(Registry(keys).to_json()))
    remote = ["--verifier", mesh.daemons["verifier-0"].address, *tls(mesh, "client")]
    where = ["--path", str(folder / "agent.json"), "--receipts", str(folder / "receipts"),
             "--outputs", str(folder / "outputs"), "--closed"]  # fmt: skip
    offline = cli("verify-session", *where, "--registry", str(tmp_path / "registry.json"))
    online = cli("verify-session", *where, *remote)
    assert offline[0] == online[0] == 0, (offline, online)
    assert offline[1].keys() == online[1].keys()
    # The same verdict object; only the registry position differs (a file at 0, the verifier's log).
    assert {k: v for k, v in offline[1].items() if k != "registry_sequence"} == {
        k: v for k, v in online[1].items() if k != "registry_sequence"
    }
    replay = cli("verify-session", *where, *remote)
    assert (replay[0], replay[1]["reason"], replay[1]["index"]) == (1, "NONCE_REPLAYED", 0)
    assert cli("verify-session", *where, *remote, "--audit")[0] == 0
    reordered = write_session(signed, tmp_path / "reordered", [1, 0, 2, 3])
    moved = ["--path", str(reordered / "agent.json"), "--receipts", str(reordered / "receipts")]
    code, verdict = cli("verify-session", *moved, *remote, "--audit")
    assert (code, verdict["reason"], verdict["index"]) == (1, "SESSION_REORDERED", 0)
    code, refused = cli("verify-session", *moved, *remote, "--registry", str(tmp_path / "registry.json"))
    assert code == 2 and "not with --verifier" in str(refused["stderr"])
    code, refused = cli("verify-session", *moved, "--verifier", mesh.daemons["verifier-0"].address)
    assert code == 2 and "--ca is required" in str(refused["stderr"])


def test_outputs_as_bytes_or_as_their_sha256_get_the_same_verdict(mesh: LocalMesh) -> None:
    """ADR 0027 for sessions: each output may travel as its bytes or as its SHA-256 (the SDK always
    sends the digest); a changed digest is the mismatch the changed bytes would be; two forms at once,
    a digest of another length, or more than 1 MiB of bytes in all is INVALID_ARGUMENT."""
    signed = sign_session(mesh, 2, closed=False)
    outputs = [o or b"" for o in signed.outputs]
    audit = verifier_pb2.VerifyPathRequest.AUDIT

    def ask(presented: list[verifier_pb2.SessionOutput]) -> verifier_pb2.VerifySessionResponse:
        request = verifier_pb2.VerifySessionRequest(session=signed.evidence().to_bytes(), outputs=presented, mode=audit)
        return stub.VerifySession(request, timeout=10)  # type: ignore[no-any-return]

    channel = channel_to(mesh, "verifier-0", "client")
    try:
        stub = verifier_stub(channel)
        as_bytes = ask([verifier_pb2.SessionOutput(data=o) for o in outputs])
        as_digest = ask([verifier_pb2.SessionOutput(sha256=sha256(o)) for o in outputs])
        assert as_bytes.verdict.verdict == as_bytes.verdict.ACCEPT
        assert as_digest.verdict == as_bytes.verdict
        changed = ask(
            [verifier_pb2.SessionOutput(sha256=sha256(outputs[0])), verifier_pb2.SessionOutput(sha256=sha256(b"x"))]
        )
        assert (changed.verdict.reason, changed.verdict.index) == (Reason.SESSION_OUTPUT_MISMATCH.value, 1)
        for bad in (
            [verifier_pb2.SessionOutput(data=outputs[0], sha256=sha256(outputs[0])), verifier_pb2.SessionOutput()],
            [verifier_pb2.SessionOutput(sha256=b"short"), verifier_pb2.SessionOutput(absent=True)],
            [verifier_pb2.SessionOutput(data=b"o" * (1 << 20)), verifier_pb2.SessionOutput(data=b"o")],
        ):
            assert service_error(lambda bad=bad: ask(bad)).code == "INVALID_ARGUMENT"
    finally:
        channel.close()
    # The SDK's own call (it sends digests) agrees.
    with mesh.verifier_client() as client:
        assert client.verify_session(signed.evidence(), outputs, audit=True)
    assert "Traceback" not in mesh.log_tail("verifier-0", 200)


def test_a_named_consumer_policy_gates_a_session_before_anything_is_consumed(
    make_mesh: Callable[..., LocalMesh],
) -> None:
    policies = {
        "closed-only": json.dumps({"v": 1, "policy": {"require_closed_session": True}}),
        "b-only": json.dumps({"v": 1, "policy": {"allowed_deployers": ["deployer-b"]}}),
    }
    mesh = make_mesh(verifier_options={"policies": policies})
    opened, closed = sign_session(mesh, 2, closed=False), sign_session(mesh, 2)
    with mesh.verifier_client() as verifier:
        for signed, policy in ((opened, "closed-only"), (closed, "b-only")):
            refused = verifier.verify_session(signed.evidence(), signed.outputs, policy=policy)
            assert (refused.reason, refused.result.index) == (Reason.CONSUMER_POLICY_VIOLATION, 0), refused.result
            assert refused.result.attribution is not None  # the session verified: the policy refused it
        # Refused by a policy, a session consumed nothing: it is accepted after, under another policy.
        assert verifier.verify_session(opened.evidence(), opened.outputs)
        assert verifier.verify_session(closed.evidence(), closed.outputs, policy="closed-only")
        with pytest.raises(ServiceError) as unknown:
            verifier.verify_session(closed.evidence(), closed.outputs, audit=True, policy="no-such-policy")
        assert unknown.value.code == "INVALID_ARGUMENT"
