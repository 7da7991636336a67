"""A consumer's own policy, applied by the client (docs/spec.md 16.4), against a real verifier daemon
(mTLS, SQLite) configured with the same policies by name: over a matrix of evidence and policies, the
verdict the client reaches with ``consumer_policy=`` equals the one the verifier reaches with
``policy=<name>`` (reason, index, detail, emitter), and so does what stays consumable afterwards: a
refused path or session consumes nothing either way. The command line's ``--policy FILE`` with
``--verifier`` is the same call."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path as FilePath

import pytest

from countersign.client import AsyncVerifierClient, SignerClient, VerifierClient
from countersign.policy import ConsumerPolicy, parse_policy
from countersign.reasons import Reason, VerificationResult
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh
from tests.coordinator.test_operator_cli import tls
from tests.mesh.conftest import start_mesh
from tests.mesh.helpers import sha256

pytestmark = pytest.mark.daemons

DOCUMENTS = {
    "b-only": {"v": 1, "policy": {"allowed_deployers": ["deployer-b"]}},  # refuses deployer-a's evidence
    "a-only": {"v": 1, "policy": {"allowed_deployers": ["deployer-a"]}},  # allows it
    "closed-only": {"v": 1, "policy": {"require_closed_session": True}},  # a single path never passes
}
POLICIES: dict[str, ConsumerPolicy] = {name: parse_policy(json.dumps(doc).encode()) for name, doc in DOCUMENTS.items()}
PATH_CASES = ("fresh", "wrong output", "bad signature", "replayed", "malformed")
SESSION_CASES = ("open", "closed", "reordered", "replayed", "malformed")


@pytest.fixture(scope="module")
def policed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    policies = {name: json.dumps(doc) for name, doc in DOCUMENTS.items()}
    mesh = start_mesh(tmp_path_factory.mktemp("policed-mesh"), verifier_options={"policies": policies})
    yield mesh
    mesh.stop_all()


@pytest.fixture
def signer(policed: LocalMesh) -> Iterator[SignerClient]:
    client = policed.runtime("deployer-a")
    yield client
    client.close()


@pytest.fixture
def verifier(policed: LocalMesh) -> Iterator[VerifierClient]:
    with policed.verifier_client() as client:
        yield client


def shape(result: VerificationResult, session: str = "") -> tuple[object, ...]:
    """What must agree: the verdict and where and why it failed, and whom it names (not the times, and
    not the session's id, which differs between two sessions alike)."""
    emitter = None if result.attribution is None else result.attribution.emitter
    who = None if emitter is None else (emitter.deployer, emitter.key_id, emitter.agent_instance, emitter.seq)
    detail = result.detail.replace(session, "<session>") if session else result.detail
    return result.verdict, result.reason, result.index, detail, who


def a_path(signer: SignerClient, verifier: VerifierClient, case: str) -> tuple[Path | bytes, bytes]:
    """Evidence of one case, issued by deployer-a's signer; the same case twice is alike but for nonces."""
    if case == "malformed":
        return b'{"v":1,"envelopes":[', b"x"
    agent = signer.root("writer", "policy-matrix")
    output = b"the answer"
    path = signer.receipt(agent, sha256(output))
    if case == "wrong output":
        return path, b"another answer"
    if case == "bad signature":  # a well-formed signature, but another record's
        return Path((*path.envelopes[:-1], path.leaf.with_sig(path.envelopes[0].sig))), output
    if case == "replayed":
        assert verifier.verify(path, output)
    return path, output


@pytest.mark.parametrize("policy", sorted(DOCUMENTS))
@pytest.mark.parametrize("case", PATH_CASES)
def test_a_path_gets_the_verdict_the_verifier_gives_under_the_same_policy(
    signer: SignerClient, verifier: VerifierClient, case: str, policy: str
) -> None:
    mine, output = a_path(signer, verifier, case)
    theirs, _ = a_path(signer, verifier, case)
    client_side = verifier.verify(mine, output, consumer_policy=POLICIES[policy])
    verifier_side = verifier.verify(theirs, output, policy=policy)
    assert shape(client_side.result) == shape(verifier_side.result)
    if policy != "a-only" and case in ("fresh", "replayed"):
        assert client_side.reason is Reason.CONSUMER_POLICY_VIOLATION  # the matrix holds refusals too
    # What is left to consume is the same: a refused path consumed nothing (accept mode: audit does not
    # look at consumed nonces).
    after_mine, after_theirs = verifier.verify(mine, output), verifier.verify(theirs, output)
    assert shape(after_mine.result) == shape(after_theirs.result)
    if policy != "a-only" and case == "fresh":
        assert after_mine, after_mine.result


@dataclass
class Session:
    evidence: SessionEvidence | bytes
    outputs: list[bytes | None] | None
    name: str = ""


def a_session(signer: SignerClient, verifier: VerifierClient, case: str) -> Session:
    if case == "malformed":
        return Session(b'{"v":1,"agent":', None)
    name = f"chat-{uuid.uuid4().hex[:8]}"
    agent = signer.root("writer", "policy-matrix", max_children=1)
    outputs: list[bytes | None] = [b"turn 0", b"turn 1"]
    receipts = [signer.receipt(agent, sha256(o or b""), session=name) for o in outputs]
    if case != "open":
        receipts.append(signer.close_session(agent, session=name))
        outputs.append(None)
    if case == "reordered":
        receipts[0], receipts[1] = receipts[1], receipts[0]
        outputs[0], outputs[1] = outputs[1], outputs[0]
    evidence = SessionEvidence(agent, tuple(p.leaf for p in receipts))
    if case == "replayed":
        assert verifier.verify_session(evidence, outputs)
    return Session(evidence, outputs, name)


@pytest.mark.parametrize("policy", sorted(DOCUMENTS))
@pytest.mark.parametrize("case", SESSION_CASES)
def test_a_session_gets_the_verdict_the_verifier_gives_under_the_same_policy(
    signer: SignerClient, verifier: VerifierClient, case: str, policy: str
) -> None:
    mine, theirs = a_session(signer, verifier, case), a_session(signer, verifier, case)
    client_side = verifier.verify_session(mine.evidence, mine.outputs, consumer_policy=POLICIES[policy])
    verifier_side = verifier.verify_session(theirs.evidence, theirs.outputs, policy=policy)
    assert shape(client_side.result, mine.name) == shape(verifier_side.result, theirs.name)
    facts = [
        None if v.session is None else (v.session.receipts, v.session.closed) for v in (client_side, verifier_side)
    ]
    assert facts[0] == facts[1]  # the session ids differ: each side has a session of its own
    if (policy, case) in (("closed-only", "open"), ("b-only", "closed"), ("b-only", "replayed")):
        assert client_side.reason is Reason.CONSUMER_POLICY_VIOLATION
    if (policy, case) == ("closed-only", "closed"):
        assert client_side, client_side.result
    if (policy, case) == ("closed-only", "open"):  # refused: consumed nothing
        assert verifier.verify_session(mine.evidence, mine.outputs, audit=False)
        return
    after_mine = verifier.verify_session(mine.evidence, mine.outputs)
    after_theirs = verifier.verify_session(theirs.evidence, theirs.outputs)
    assert shape(after_mine.result, mine.name) == shape(after_theirs.result, theirs.name)


def test_the_asyncio_client_applies_it_the_same_way(
    policed: LocalMesh, signer: SignerClient, verifier: VerifierClient
) -> None:
    path, output = a_path(signer, verifier, "fresh")
    session = a_session(signer, verifier, "open")

    async def scenario() -> tuple[VerificationResult, VerificationResult]:
        async with AsyncVerifierClient(policed.daemons["verifier-0"].address, policed.tls_for("client")) as client:
            refused = await client.verify(path, output, consumer_policy=POLICIES["b-only"])
            session_refused = await client.verify_session(
                session.evidence, session.outputs, consumer_policy=POLICIES["closed-only"]
            )
            return refused.result, session_refused.result

    refused, session_refused = asyncio.run(scenario())
    assert (refused.reason, refused.index) == (Reason.CONSUMER_POLICY_VIOLATION, 0)
    assert refused.detail.startswith("allowed_deployers: ") and refused.attribution is not None
    assert (session_refused.reason, session_refused.index) == (Reason.CONSUMER_POLICY_VIOLATION, 0)
    assert verifier.verify(path, output)  # neither consumed anything
    assert verifier.verify_session(session.evidence, session.outputs)


def test_the_command_line_applies_a_policy_file_with_a_verifier(
    policed: LocalMesh, signer: SignerClient, verifier: VerifierClient, tmp_path: FilePath
) -> None:
    path, output = a_path(signer, verifier, "fresh")
    assert isinstance(path, Path)
    (tmp_path / "path.json").write_bytes(path.to_bytes())
    (tmp_path / "output.bin").write_bytes(output)
    (tmp_path / "b-only.json").write_text(json.dumps(DOCUMENTS["b-only"]))
    remote = ["--verifier", policed.daemons["verifier-0"].address, *tls(policed, "client")]
    where = ["--path", str(tmp_path / "path.json"), "--output", str(tmp_path / "output.bin"), *remote]

    def cli(*args: str) -> tuple[int, dict[str, object]]:
        done = subprocess.run(
            [sys.executable, "-m", "countersign_cli", "verify", *where, *args], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert "Traceback" not in done.stderr and done.stderr == "", done.stderr
        return done.returncode, json.loads(done.stdout)

    code, refused = cli("--policy", str(tmp_path / "b-only.json"))
    assert (code, refused["reason"], refused["index"]) == (1, "CONSUMER_POLICY_VIOLATION", 0)
    code, accepted = cli()  # the refusal consumed nothing
    assert (code, accepted["verdict"]) == (0, "ACCEPT")
    code, replayed = cli()
    assert (code, replayed["reason"]) == (1, "NONCE_REPLAYED")


def test_nothing_the_client_refused_put_a_traceback_in_the_log(
    policed: LocalMesh, signer: SignerClient, verifier: VerifierClient
) -> None:
    for case in PATH_CASES:
        verifier.verify(*a_path(signer, verifier, case), consumer_policy=POLICIES["closed-only"])
    assert "Traceback" not in policed.log_tail("verifier-0", 400)
