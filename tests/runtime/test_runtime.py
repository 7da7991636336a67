"""The runtime SDK against a real mesh (loopback, mTLS): sign outputs, delegate through a handoff
string, accept it, and verify online and offline; every refusal typed."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from countersign.client import (
    AsyncVerifierClient,
    Delegation,
    ErrorCode,
    HandoffError,
    Runtime,
    ServiceError,
    TlsConfig,
    averify_path,
    verify_path,
)
from countersign.errors import ConfigError
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import async_runtime, mesh_registry, runtime_env

pytestmark = pytest.mark.daemons

Make = Callable[[str], Runtime]


def consumer_env(mesh: LocalMesh) -> dict[str, str]:
    return runtime_env(mesh, None)


def test_a_signed_output_verifies_and_names_its_emitter(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    agent = producer.root("writer-7", "research")
    output = b"exact bytes, \x00 included\n"
    receipt = producer.receipt(agent, output, session="chat-1")
    second = producer.receipt(agent, b"second turn", session="chat-1")
    verdict = verify_path(receipt.to_bytes(), output, environ=consumer_env(runtime_mesh))
    assert verdict and verdict.reason is None
    assert verdict.emitter is not None
    who = verdict.emitter
    assert (who.deployer, who.agent, who.system, who.session, who.seq) == (
        "deployer-a", "writer-7", "research", "chat-1", 0,
    )  # fmt: skip
    assert who.key_id == runtime_mesh.deployer_keys["deployer-a"].key_id
    assert who.lineage == ("deployer-a", "deployer-a")
    assert verdict.registry_sequence >= 3
    again = verify_path(receipt, output, environ=consumer_env(runtime_mesh))
    assert not again and again.reason is Reason.NONCE_REPLAYED and again.emitter is None
    assert verify_path(second, b"second turn", environ=consumer_env(runtime_mesh)).emitter.seq == 1  # type: ignore[union-attr]


def test_another_output_is_rejected_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-8", "research"), b"what was said")
    env = consumer_env(runtime_mesh)
    for verdict in (
        verify_path(receipt, b"what was not said", environ=env, audit=True),
        verify_path(receipt, b"what was not said", registry=registry_file),
        verify_path(receipt, b"what was not said", registry=mesh_registry(runtime_mesh)),
    ):
        assert not verdict and verdict.reason is Reason.OUTPUT_MISMATCH and verdict.emitter is None
    offline = verify_path(receipt, b"what was said", environ={"COUNTERSIGN_REGISTRY": registry_file})
    assert offline and offline.emitter is not None and offline.emitter.deployer == "deployer-a"
    assert offline.registry_sequence == 3
    assert verify_path(b"{not a path", b"x", registry=registry_file).reason is Reason.MALFORMED


def test_a_consumer_policy_gives_one_verdict_online_and_offline_and_consumes_nothing(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-9", "research"), b"gated")
    only_b = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-b"]}}')
    env = consumer_env(runtime_mesh)
    online = verify_path(receipt, b"gated", environ=env, consumer_policy=only_b)
    offline = verify_path(receipt, b"gated", registry=registry_file, consumer_policy=only_b)
    for verdict in (online, offline):
        assert (verdict.reason, verdict.result.index, verdict.emitter) == (Reason.CONSUMER_POLICY_VIOLATION, 0, None)
        assert verdict.result.detail == "allowed_deployers: record 0 is issued by deployer-a, not allowed"
    assert verify_path(receipt, b"gated", environ=env), "the refusal consumed the leaf nonce"
    only_a = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-a"]}}')
    fresh = producer.receipt(producer.root("writer-10", "research"), b"allowed")
    assert verify_path(fresh, b"allowed", environ=env, consumer_policy=only_a)
    assert verify_path(fresh, b"allowed", environ=env, consumer_policy=only_a).reason is Reason.NONCE_REPLAYED

    async def asynchronously() -> tuple[Reason | None, bool]:
        refused = await averify_path(fresh, b"allowed", environ=env, consumer_policy=only_b)
        offline = await averify_path(fresh, b"allowed", registry=registry_file, consumer_policy=only_a)
        return refused.reason, bool(offline)

    assert asyncio.run(asynchronously()) == (Reason.CONSUMER_POLICY_VIOLATION, True)


def test_a_delegation_travels_as_a_string_and_is_co_signed(runtime: Make, runtime_mesh: LocalMesh) -> None:
    parent, child = runtime("deployer-a"), runtime("deployer-b")
    planner = parent.root("planner", "research")
    handoff = parent.delegate(planner, "deployer-b")
    assert handoff.parent_signer == runtime_mesh.daemons["deployer-a"].address
    researcher = child.accept(str(handoff), "researcher")
    edge = researcher.leaf.record
    assert edge.deployer == "deployer-b" and [c.deployer for c in edge.cosigs] == ["deployer-a", "deployer-b"]
    receipt = child.receipt(researcher, b"notes")
    verdict = verify_path(receipt, b"notes", environ=consumer_env(runtime_mesh))
    assert verdict.emitter is not None and verdict.emitter.lineage == ("deployer-a", "deployer-b", "deployer-b")


def test_public_signer_is_what_the_handoff_names(runtime_mesh: LocalMesh) -> None:
    env = runtime_env(runtime_mesh, "deployer-a") | {"COUNTERSIGN_PUBLIC_SIGNER": "signer-a.example:7401"}
    with Runtime.from_env(env) as parent:
        handoff = parent.delegate(parent.root("planner", "research"), "deployer-b")
    assert Delegation.from_string(str(handoff)).parent_signer == "signer-a.example:7401"


def test_a_handoff_for_another_child_is_refused_before_any_call(runtime: Make, nowhere: str) -> None:
    parent = runtime("deployer-a")
    handoff = parent.delegate(parent.root("planner", "research"), "deployer-b")
    stranger = Runtime(nowhere, parent.tls, "deployer-c")  # any call would fail UNAVAILABLE
    with pytest.raises(HandoffError) as caught:
        stranger.accept(handoff, "writer")
    stranger.close()
    assert caught.value.code is ErrorCode.GRANT_WRONG_CHILD


def test_the_parent_signer_refuses_a_handoff_rewritten_for_another_child(runtime: Make) -> None:
    parent, other = runtime("deployer-b"), runtime("deployer-a")  # deployer-b delegates to either
    handoff = parent.delegate(parent.root("planner", "research"), "deployer-c")
    # deployer-a names itself in the grant; its own check passes, deployer-b's signer does not.
    rewritten = dataclasses.replace(handoff, grant=dataclasses.replace(handoff.grant, child_deployer="deployer-a"))
    with pytest.raises(ServiceError) as caught:
        other.accept(str(rewritten), "writer")
    assert caught.value.code is ErrorCode.PARENT_REFUSED
    assert caught.value.details.get("parent_code") == "GRANT_WRONG_CHILD"


def test_an_expired_handoff_is_refused_before_any_call(runtime: Make, nowhere: str) -> None:
    parent = runtime("deployer-a")
    handoff = parent.delegate(parent.root("planner", "research"), "deployer-b", ttl_ms=1_000)
    offline_child = Runtime(nowhere, parent.tls, "deployer-b")
    with pytest.raises(HandoffError) as caught:
        offline_child.accept(str(handoff), "researcher", now_ms=handoff.expires_ms)
    offline_child.close()
    assert caught.value.code is ErrorCode.GRANT_EXPIRED


def test_a_parent_that_does_not_delegate_there_refuses(runtime: Make) -> None:
    parent = runtime("deployer-a")  # may delegate to deployer-b only
    with pytest.raises(ServiceError) as caught:
        parent.delegate(parent.root("planner", "research"), "deployer-c")
    assert caught.value.code is ErrorCode.POLICY_REFUSED


def test_configuration_errors_say_what_is_missing(runtime_mesh: LocalMesh) -> None:
    with pytest.raises(ConfigError, match="COUNTERSIGN_SIGNER"):
        Runtime.from_env({})
    env = runtime_env(runtime_mesh, "deployer-a")
    with pytest.raises(ConfigError, match=r"tls\.cert"):
        Runtime.from_env({k: v for k, v in env.items() if k != "COUNTERSIGN_CLIENT_CERT"})
    with pytest.raises(ConfigError, match="COUNTERSIGN_VERIFIER or COUNTERSIGN_REGISTRY"):
        verify_path(b"{}", b"", environ={})
    with pytest.raises(ConfigError, match="not both"):
        verify_path(b"{}", b"", verifier="127.0.0.1:1", registry="r.json")
    with pytest.raises(ConfigError, match="cannot read the registry"):
        verify_path(b"{}", b"", registry="/nonexistent/registry.json")


def test_an_unreachable_verifier_is_a_typed_error(nowhere: str, runtime_mesh: LocalMesh) -> None:
    with pytest.raises(ServiceError) as caught:
        verify_path(b"{}", b"", verifier=nowhere, tls=TlsConfig(insecure_loopback=True))
    assert caught.value.code is ErrorCode.UNAVAILABLE


def test_the_asyncio_runtime_does_the_same(runtime_mesh: LocalMesh) -> None:
    async def scenario() -> None:
        parent, child = async_runtime(runtime_mesh, "deployer-a"), async_runtime(runtime_mesh, "deployer-b")
        async with parent, child:
            planner = await parent.root("planner", "research")
            handoff = await parent.delegate(planner, "deployer-b")
            researcher = await child.accept(handoff.to_string(), "researcher")
            receipt = await child.receipt(researcher, b"async notes")
            with pytest.raises(HandoffError) as wrong:
                await parent.accept(handoff, "planner-again")
            assert wrong.value.code is ErrorCode.GRANT_WRONG_CHILD
            with pytest.raises(ServiceError) as refused:
                await parent.delegate(planner, "deployer-c")
            assert refused.value.code is ErrorCode.POLICY_REFUSED
        env = consumer_env(runtime_mesh)
        verdict = await averify_path(receipt, b"async notes", environ=env)
        assert verdict.emitter is not None and verdict.emitter.deployer == "deployer-b"
        tls = TlsConfig(env["COUNTERSIGN_CLIENT_CA"], env["COUNTERSIGN_CLIENT_CERT"], env["COUNTERSIGN_CLIENT_KEY"])
        async with AsyncVerifierClient(env["COUNTERSIGN_VERIFIER"], tls) as verifier:
            replayed = await averify_path(receipt, b"async notes", verifier=verifier)
        assert replayed.reason is Reason.NONCE_REPLAYED

    asyncio.run(scenario())
