"""The runtime SDK's consumer call for sessions, ``verify_session`` / ``averify_session``, against a real
mesh (loopback, mTLS) and offline: the receipt paths a producer got back, checked as one session; the
verdict names who emitted (deployer, key, agent, session, seq) and what the session is."""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable

import pytest

import countersign.client
from countersign.client import (
    AsyncVerifierClient,
    Runtime,
    SessionVerdict,
    TlsConfig,
    averify_session,
    verify_session,
)
from countersign.errors import ConfigError, PathRejected
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh
from tests.client.test_api_shape import public_callables, wire_types
from tests.runtime.conftest import mesh_registry, runtime_env

Make = Callable[[str], Runtime]


def a_session(
    producer: Runtime, name: str, turns: int = 3, *, closed: bool = False
) -> tuple[list[Path], list[bytes | None]]:
    agent = producer.root(f"writer-{name}", "chat")
    outputs: list[bytes | None] = [f"{name}: answer {i}".encode() for i in range(turns)]
    receipts = [producer.receipt(agent, output or b"", session=name) for output in outputs]
    if closed:  # the signer's CloseSession (Runtime.close_session is another change's)
        receipts.append(producer.client.close_session(agent, session=name))
        outputs.append(None)
    return receipts, outputs


@pytest.mark.daemons
def test_a_session_verifies_online_once_and_names_its_emitter(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    receipts, outputs = a_session(producer, "online-1", closed=True)
    env = runtime_env(runtime_mesh, None)
    verdict = verify_session(receipts, outputs, require_closed=True, environ=env)
    assert verdict, verdict.result
    who, what = verdict.emitter, verdict.session
    assert who is not None and what is not None
    assert (who.deployer, who.agent, who.system, who.session, who.seq) == (
        "deployer-a", "writer-online-1", "chat", "online-1", 3,
    )  # fmt: skip
    assert who.key_id == runtime_mesh.deployer_keys["deployer-a"].key_id
    assert (what.session, what.receipts, what.closed) == ("online-1", 4, True)
    again = verify_session(receipts, outputs, environ=env)
    assert (again.reason, again.result.index, again.emitter) == (Reason.NONCE_REPLAYED, 0, None)
    with pytest.raises(PathRejected):
        again.raise_for_reject()
    assert verify_session(receipts, outputs, environ=env, audit=True)  # audit consumes nothing


@pytest.mark.daemons
def test_rearranged_sessions_are_rejected_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipts, outputs = a_session(producer, "rearranged", 3, closed=True)
    env = runtime_env(runtime_mesh, None)
    swapped = [receipts[1], receipts[0], *receipts[2:]]
    for where in ({"environ": env}, {"registry": registry_file}, {"registry": mesh_registry(runtime_mesh)}):
        assert verify_session(swapped, **where).reason is Reason.SESSION_REORDERED  # type: ignore[arg-type]
        truncated = verify_session(receipts[:3], outputs[:3], require_closed=True, **where)  # type: ignore[arg-type]
        assert truncated.reason is Reason.SESSION_TRUNCATED
        wrong = verify_session(receipts, [b"not said", *outputs[1:]], audit=True, **where)  # type: ignore[arg-type]
        assert (wrong.reason, wrong.result.index) == (Reason.SESSION_OUTPUT_MISMATCH, 0)
    offline = verify_session(receipts, outputs, require_closed=True, environ={"COUNTERSIGN_REGISTRY": registry_file})
    assert offline and offline.emitter is not None and offline.emitter.seq == 3
    assert offline.registry_sequence == 3
    # Evidence as bytes works the same way, and bytes that do not parse are a MALFORMED verdict.
    evidence = SessionEvidence(Path(receipts[0].envelopes[:-1]), tuple(r.leaf for r in receipts))
    assert verify_session(evidence.to_bytes(), registry=registry_file, audit=True)
    assert verify_session(b"{not a session", registry=registry_file).reason is Reason.MALFORMED


@pytest.mark.daemons
def test_a_consumer_policy_gates_the_session_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipts, outputs = a_session(producer, "gated", 2)
    closed_only = parse_policy(b'{"v": 1, "policy": {"require_closed_session": true}}')
    env = runtime_env(runtime_mesh, None)
    online = verify_session(receipts, outputs, environ=env, consumer_policy=closed_only)
    offline = verify_session(receipts, outputs, registry=registry_file, consumer_policy=closed_only)
    for verdict in (online, offline):
        assert (verdict.reason, verdict.result.index, verdict.emitter) == (Reason.CONSUMER_POLICY_VIOLATION, 0, None)
    assert online.result.detail == offline.result.detail
    assert verify_session(receipts, outputs, environ=env), "the refusal consumed a receipt's nonce"
    closed, closed_outputs = a_session(producer, "gated-closed", 2, closed=True)
    assert verify_session(closed, closed_outputs, environ=env, consumer_policy=closed_only)

    async def asynchronously() -> Reason | None:
        return (await averify_session(closed, closed_outputs, environ=env, consumer_policy=closed_only)).reason

    assert asyncio.run(asynchronously()) is Reason.NONCE_REPLAYED  # allowed, so asked in accept mode


@pytest.mark.daemons
def test_the_asyncio_call_does_the_same(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-b")
    receipts, outputs = a_session(producer, "async-1", 2)
    env = runtime_env(runtime_mesh, None)

    async def scenario() -> tuple[SessionVerdict, SessionVerdict]:
        first = await averify_session(receipts, outputs, environ=env)
        tls = TlsConfig(env["COUNTERSIGN_CLIENT_CA"], env["COUNTERSIGN_CLIENT_CERT"], env["COUNTERSIGN_CLIENT_KEY"])
        async with AsyncVerifierClient(env["COUNTERSIGN_VERIFIER"], tls) as verifier:
            second = await averify_session(receipts, outputs, verifier=verifier)
        return first, second

    first, second = asyncio.run(scenario())
    assert first and first.emitter is not None and first.emitter.deployer == "deployer-b"
    assert first.emitter.seq == 1
    assert second.reason is Reason.NONCE_REPLAYED


@pytest.mark.offline
def test_configuration_errors_say_what_is_missing() -> None:
    with pytest.raises(ConfigError, match="needs a verifier or a registry"):
        verify_session(b"{}", environ={})
    with pytest.raises(ConfigError, match="not both"):
        verify_session(b"{}", verifier="127.0.0.1:1", registry="r.json")
    with pytest.raises(ValueError, match="at least one receipt"):
        verify_session([], registry=countersign.registry.Registry({}))


@pytest.mark.offline
def test_the_session_calls_are_exported_typed_and_twinned() -> None:
    names = {"verify_session", "averify_session", "verify_session_offline", "SessionVerdict", "SessionVerifierVerdict"}
    assert names <= set(countersign.client.__all__)
    walked = {n: f for n, f in public_callables() if n.split(".")[0] in names or n.endswith("verify_session")}
    assert {"verify_session", "averify_session", "VerifierClient.verify_session"} <= set(walked)
    assert {name: found for name, function in walked.items() if (found := wire_types(function))} == {}
    sync, aio = inspect.signature(verify_session), inspect.signature(averify_session)
    assert list(sync.parameters) == list(aio.parameters)
    assert inspect.iscoroutinefunction(averify_session)
    assert typing.get_type_hints(verify_session)["return"] is typing.get_type_hints(averify_session)["return"]
