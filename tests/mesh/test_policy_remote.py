"""Consumer policy on the verifier service: named policies chosen per request, refusals that consume
nothing, and the attribution in every proven verdict (docs/api.md, spec sections 6.2 and 15)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path as FilePath

import grpc
import pytest

from countersign._proto.v1 import common_pb2, verifier_pb2
from countersign.records import Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, delegate, sha256, verifier_stub

pytestmark = pytest.mark.daemons

ACCEPT, REJECT = common_pb2.Verdict.ACCEPT, common_pb2.Verdict.REJECT
ANSWER = b"the researcher's answer\n"


@pytest.fixture
def policy_mesh(make_mesh: Callable[..., LocalMesh], tmp_path: FilePath) -> LocalMesh:
    """A verifier with two named policies: ``a-and-c-only`` from a file, ``signed-dag`` inline."""
    strict = tmp_path / "a-and-c-only.json"
    strict.write_text(json.dumps({"v": 1, "policy": {"allowed_deployers": ["deployer-a", "deployer-c"]}}))
    inline = json.dumps(
        {"v": 1, "policy": {"all_of": [{"cross_deployer_construction": ["signed-dag"]}, {"max_depth": 4}]}}
    )
    return make_mesh(verifier_options={"policies": {"a-and-c-only": str(strict), "signed-dag": inline}})


@pytest.fixture
def stub(policy_mesh: LocalMesh) -> Iterator[Callable[..., verifier_pb2.VerifyPathResponse]]:
    channel = channel_to(policy_mesh, "verifier-0", "client")
    raw = verifier_stub(channel)

    def ask(path: Path, *, policy: str = "", audit: bool = False) -> verifier_pb2.VerifyPathResponse:
        mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
        request = verifier_pb2.VerifyPathRequest(path=path.to_bytes(), output=ANSWER, mode=mode, policy=policy)
        return raw.VerifyPath(request, timeout=10)

    yield ask
    channel.close()


def researcher_path(mesh: LocalMesh) -> Path:
    """deployer-a's planner delegates to deployer-b's researcher, who emits ``ANSWER`` (a receipt)."""
    planner_runtime, researcher_runtime = mesh.runtime("deployer-a"), mesh.runtime("deployer-b")
    try:
        planner = planner_runtime.root("planner-1", "policy-system")
        researcher = delegate(mesh, planner, "deployer-b", "researcher-1")
        return researcher_runtime.receipt(researcher, sha256(ANSWER), session="research-session")
    finally:
        planner_runtime.close()
        researcher_runtime.close()


def test_each_named_policy_decides_and_a_refusal_consumes_no_nonce(
    policy_mesh: LocalMesh, stub: Callable[..., verifier_pb2.VerifyPathResponse]
) -> None:
    path = researcher_path(policy_mesh)
    keys = {d: k.key_id for d, k in policy_mesh.deployer_keys.items()}

    refused = stub(path, policy="a-and-c-only")
    assert (refused.verdict.verdict, refused.verdict.reason, refused.verdict.index) == (
        REJECT,
        "CONSUMER_POLICY_VIOLATION",
        1,
    )
    assert refused.verdict.detail.startswith("allowed_deployers: ")
    assert refused.HasField("attribution")  # the path was proven; only the policy refused it

    accepted = stub(path, policy="signed-dag")  # the same path, in accept mode: its nonce is still fresh
    assert accepted.verdict.verdict == ACCEPT, accepted.verdict
    emitter = accepted.attribution.emitter
    assert (emitter.deployer, emitter.key_id, emitter.agent_instance, emitter.agent_system) == (
        "deployer-b",
        keys["deployer-b"],
        "researcher-1",
        "policy-system",
    )
    assert (emitter.session, emitter.seq, emitter.binding_scope, emitter.index) == (
        "research-session",
        0,
        "per_turn",
        2,
    )
    assert emitter.output_sha256 == "sha256:" + sha256(ANSWER).hex()
    assert [(e.index, e.parent_deployer, e.deployer, e.cross_deployer) for e in accepted.attribution.edges] == [
        (1, "deployer-a", "deployer-b", True),
        (2, "deployer-b", "deployer-b", False),
    ]
    cross = accepted.attribution.edges[0]
    assert cross.construction == "signed-dag"
    assert [(c.role, c.deployer, c.key_id) for c in cross.cosigners] == [
        ("parent", "deployer-a", keys["deployer-a"]),
        ("child", "deployer-b", keys["deployer-b"]),
    ]
    assert [c.sig for c in cross.cosigners] == [c.sig for c in path.envelopes[1].record.cosigs]
    assert accepted.registry_sequence == 3

    replayed = stub(path, policy="signed-dag")
    assert replayed.verdict.reason == "NONCE_REPLAYED"
    assert replayed.attribution == accepted.attribution


def test_no_policy_verifies_as_before_and_an_unknown_name_is_invalid(
    policy_mesh: LocalMesh, stub: Callable[..., verifier_pb2.VerifyPathResponse]
) -> None:
    path = researcher_path(policy_mesh)
    plain = stub(path, audit=True)
    assert plain.verdict.verdict == ACCEPT
    assert plain.attribution.emitter.deployer == "deployer-b"
    for name in ("strict", "A-AND-C-ONLY", "x" * 500):
        with pytest.raises(grpc.RpcError) as raised:
            stub(path, policy=name)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown policy" in (raised.value.details() or "")
    # a rejected path that proves nothing carries no attribution
    substituted = verifier_pb2.VerifyPathRequest(path=path.to_bytes(), output=b"other", policy="signed-dag")
    channel = channel_to(policy_mesh, "verifier-0", "client")
    try:
        answer = verifier_stub(channel).VerifyPath(substituted, timeout=10)
    finally:
        channel.close()
    assert answer.verdict.reason == "OUTPUT_MISMATCH"
    assert not answer.HasField("attribution")


def test_a_bad_policy_setting_stops_the_verifier_with_one_line(tmp_path: FilePath) -> None:
    from countersign._daemon.config import load_config
    from countersign.canonical import b64url_encode
    from countersign.errors import ConfigError
    from countersign.keys import Ed25519Signer
    from verifier.daemon import VerifierConfig

    operator = b64url_encode(Ed25519Signer.generate().public_key)
    base = (
        f'operator_public_key = "{operator}"\ncoordinator = "127.0.0.1:1"\n'
        f'registry_cache = "{tmp_path / "cache.json"}"\n[tls]\ninsecure_loopback = true\n'
    )
    cases = {
        '[policies]\nstrict = "/nonexistent/policy.json"\n': "policies.strict: cannot read /nonexistent/policy.json",
        '[policies]\nstrict = \'{"v":1,"policy":{"all_of":{}}}\'\n': "policies.strict: policy.all_of must be a list",
        '[policies]\n"Bad Name" = "{}"\n': "must match",
        'policies = "strict"\n': "policies must be a table",
    }
    for body, message in cases.items():
        config = tmp_path / "verifier.toml"
        config.write_text(base.replace("[tls]", body + "[tls]") if body.startswith("policies =") else base + body)
        with pytest.raises(ConfigError) as raised:
            load_config(VerifierConfig, str(config), environ={})
        assert message in str(raised.value)
        assert "\n" not in str(raised.value)
    env = {"COUNTERSIGN_POLICIES": json.dumps({"open": '{"v":1,"policy":{"unsafe_allow_all":true}}'})}
    (tmp_path / "verifier.toml").write_text(base)
    assert load_config(VerifierConfig, str(tmp_path / "verifier.toml"), environ=env).policies.keys() == {"open"}
