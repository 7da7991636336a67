"""The runtime SDK against a real mesh (loopback, mTLS): sign outputs, delegate through a handoff
string and accept it; every refusal typed. (The consumer's side: tests/runtime/test_consumer.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from countersign.client import Consumer, Delegation, ErrorCode, HandoffError, Runtime, ServiceError
from countersign.errors import ConfigError
from countersign.reasons import Reason
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import async_runtime, runtime_env

pytestmark = pytest.mark.daemons

Make = Callable[[str], Runtime]


def consumer(mesh: LocalMesh) -> Consumer:
    return Consumer.from_env(runtime_env(mesh, None))


def test_a_delegation_travels_as_a_string_and_is_co_signed(runtime: Make, runtime_mesh: LocalMesh) -> None:
    parent, child = runtime("deployer-a"), runtime("deployer-b")
    planner = parent.root("planner", "research")
    handoff = parent.delegate(planner, "deployer-b")
    assert handoff.parent_signer == runtime_mesh.daemons["deployer-a"].address
    researcher = child.accept(str(handoff), "researcher")
    edge = researcher.leaf.record
    assert edge.deployer == "deployer-b" and [c.deployer for c in edge.cosigs] == ["deployer-a", "deployer-b"]
    receipt = child.receipt(researcher, b"notes")
    with consumer(runtime_mesh) as checking:
        verdict = checking.path(receipt, b"notes")
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
        async with consumer(runtime_mesh) as checking:
            verdict = await checking.apath(receipt, b"async notes")
            replayed = await checking.apath(receipt, b"async notes")
        assert verdict.emitter is not None and verdict.emitter.deployer == "deployer-b"
        assert replayed.reason is Reason.NONCE_REPLAYED

    asyncio.run(scenario())
