"""The consumer object (ADR 0034) against a real mesh (loopback, mTLS) and offline: one Consumer holds
where and how to check, ``path``/``session`` and their asyncio twins answer with the one verdict shape,
the same verdict online and offline, every refusal typed."""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable

import pytest

import countersign.client
from countersign.client import (
    Consumer,
    ErrorCode,
    EvidenceVerdict,
    Runtime,
    ServiceError,
    TlsConfig,
    VerifierClient,
    load_registry,
)
from countersign.errors import ConfigError, PathRejected
from countersign.policy import parse_policy
from countersign.reasons import Reason
from countersign.records import MAX_INPUT_BYTES, Path
from countersign.registry import Registry
from countersign.sessions import SessionEvidence
from countersign.state import InMemoryState
from countersign_cli.localmesh import LocalMesh
from tests.client.test_api_shape import public_callables, wire_types
from tests.runtime.conftest import mesh_registry, runtime_env

Make = Callable[[str], Runtime]


def online(mesh: LocalMesh) -> Consumer:
    return Consumer.from_env(runtime_env(mesh, None))


def a_session(
    producer: Runtime, name: str, turns: int = 3, *, closed: bool = False
) -> tuple[list[Path], list[bytes | None]]:
    agent = producer.root(f"writer-{name}", "chat")
    outputs: list[bytes | None] = [f"{name}: answer {i}".encode() for i in range(turns)]
    receipts = [producer.receipt(agent, output or b"", session=name) for output in outputs]
    if closed:
        receipts.append(producer.close_session(agent, session=name).path)
        outputs.append(None)
    return receipts, outputs


# --- paths --------------------------------------------------------------------------------------


@pytest.mark.daemons
def test_a_signed_output_verifies_online_once_and_names_its_emitter(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    agent = producer.root("writer-7", "research")
    output = b"exact bytes, \x00 included\n"
    receipt = producer.receipt(agent, output, session="chat-1")
    second = producer.receipt(agent, b"second turn", session="chat-1")
    with online(runtime_mesh) as consumer:
        verdict = consumer.path(receipt.to_bytes(), output)
        again = consumer.path(receipt, output)
        assert consumer.path(second, b"second turn").emitter.seq == 1  # type: ignore[union-attr]
    assert isinstance(verdict, EvidenceVerdict) and verdict and verdict.reason is None
    who = verdict.emitter
    assert who is not None
    assert (who.deployer, who.agent, who.system, who.session, who.seq) == (
        "deployer-a", "writer-7", "research", "chat-1", 0,
    )  # fmt: skip
    assert who.key_id == runtime_mesh.deployer_keys["deployer-a"].key_id
    assert who.lineage == ("deployer-a", "deployer-a")
    assert verdict.registry_sequence >= 3 and len(verdict.request_id) == 32
    assert not again and again.reason is Reason.NONCE_REPLAYED and again.emitter is None
    with pytest.raises(PathRejected):
        again.raise_for_reject()


@pytest.mark.daemons
def test_another_output_is_rejected_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-8", "research"), b"what was said")
    for consumer in (
        online(runtime_mesh),
        Consumer.offline(registry_file),
        Consumer.offline(mesh_registry(runtime_mesh)),
        Consumer.from_env({"COUNTERSIGN_REGISTRY": registry_file}),
    ):
        with consumer:
            verdict = consumer.path(receipt, b"what was not said", audit=True)
        assert not verdict and verdict.reason is Reason.OUTPUT_MISMATCH and verdict.emitter is None
        assert verdict.index == 1
    offline = Consumer.offline(registry_file).path(receipt, b"what was said")
    assert offline and offline.emitter is not None and offline.emitter.deployer == "deployer-a"
    assert offline.emitter.lineage == ("deployer-a", "deployer-a")
    assert offline.registry_sequence == 3
    assert Consumer.offline(registry_file).path(b"{not a path", b"x").reason is Reason.MALFORMED


@pytest.mark.daemons
def test_an_offline_consumer_remembers_what_it_accepted(runtime: Make, registry_file: str) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-11", "research"), b"once")
    consumer = Consumer.offline(registry_file)
    assert consumer.path(receipt, b"once", audit=True)  # audit consumes nothing
    assert consumer.path(receipt, b"once")
    assert consumer.path(receipt, b"once").reason is Reason.NONCE_REPLAYED  # as a verifier answers
    assert Consumer.offline(registry_file).path(receipt, b"once"), "another consumer has its own state"
    shared = InMemoryState()  # a state passed in outlives the consumer (a durable one: across processes)
    assert Consumer.offline(registry_file, state=shared).path(receipt, b"once")
    assert Consumer.offline(registry_file, state=shared).path(receipt, b"once").reason is Reason.NONCE_REPLAYED


@pytest.mark.daemons
def test_the_offline_clock_decides_expiry(runtime: Make, registry_file: str) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-12", "research", ttl_ms=60_000), b"brief")
    late = receipt.leaf.record.expires_ms + 3_600_000
    assert Consumer.offline(registry_file, clock_ms=lambda: late).path(receipt, b"brief").reason is Reason.EXPIRED


@pytest.mark.daemons
def test_a_consumer_policy_gives_one_verdict_online_and_offline_and_consumes_nothing(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-9", "research"), b"gated")
    only_b = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-b"]}}')
    env = runtime_env(runtime_mesh, None)
    gated_online = Consumer.from_env(env, consumer_policy=only_b)
    gated_offline = Consumer.offline(registry_file, consumer_policy=only_b)
    for verdict in (gated_online.path(receipt, b"gated"), gated_offline.path(receipt, b"gated")):
        assert (verdict.reason, verdict.index, verdict.emitter) == (Reason.CONSUMER_POLICY_VIOLATION, 0, None)
        assert verdict.detail == "allowed_deployers: record 0 is issued by deployer-a, not allowed"
    with online(runtime_mesh) as plain:
        assert plain.path(receipt, b"gated"), "the refusal consumed the leaf nonce"
    only_a = parse_policy(b'{"v": 1, "policy": {"allowed_deployers": ["deployer-a"]}}')
    fresh = producer.receipt(producer.root("writer-10", "research"), b"allowed")
    allowed = Consumer.from_env(env, consumer_policy=only_a)
    assert allowed.path(fresh, b"allowed")
    assert allowed.path(fresh, b"allowed").reason is Reason.NONCE_REPLAYED

    async def asynchronously() -> tuple[Reason | None, bool]:
        refused = await gated_online.apath(fresh, b"allowed")
        offline = await Consumer.offline(registry_file, consumer_policy=only_a).apath(fresh, b"allowed")
        await gated_online.aclose()
        return refused.reason, bool(offline)

    assert asyncio.run(asynchronously()) == (Reason.CONSUMER_POLICY_VIOLATION, True)
    for each in (gated_online, allowed):
        each.close()


@pytest.mark.daemons
def test_a_named_policy_of_the_verifier_is_sent(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-a")
    receipt = producer.receipt(producer.root("writer-13", "research"), b"named")
    address, tls = runtime_mesh.daemons["verifier-0"].address, runtime_mesh.tls_for("client")
    with Consumer.online(address, tls, policy="no-such-policy") as consumer, pytest.raises(ServiceError) as caught:
        consumer.path(receipt, b"named")
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT and "no-such-policy" in str(caught.value)


# --- sessions -----------------------------------------------------------------------------------


@pytest.mark.daemons
def test_a_session_verifies_online_once_and_names_its_emitter(runtime: Make, runtime_mesh: LocalMesh) -> None:
    receipts, outputs = a_session(runtime("deployer-a"), "online-1", closed=True)
    with online(runtime_mesh) as consumer:
        verdict = consumer.session(receipts, outputs, require_closed=True)
        again = consumer.session(receipts, outputs)
        audited = consumer.session(receipts, outputs, audit=True)
    assert isinstance(verdict, EvidenceVerdict) and verdict, verdict.result
    who, what = verdict.emitter, verdict.session
    assert who is not None and what is not None
    assert (who.deployer, who.agent, who.system, who.session, who.seq) == (
        "deployer-a", "writer-online-1", "chat", "online-1", 3,
    )  # fmt: skip
    assert (what.session, what.receipts, what.closed) == ("online-1", 4, True)
    assert (again.reason, again.index, again.emitter) == (Reason.NONCE_REPLAYED, 0, None)
    assert audited  # audit consumes nothing, and a replay does not stop an audit


@pytest.mark.daemons
def test_rearranged_sessions_are_rejected_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    receipts, outputs = a_session(runtime("deployer-a"), "rearranged", 3, closed=True)
    swapped = [receipts[1], receipts[0], *receipts[2:]]
    for consumer in (online(runtime_mesh), Consumer.offline(registry_file)):
        with consumer:
            assert consumer.session(swapped).reason is Reason.SESSION_REORDERED
            truncated = consumer.session(receipts[:3], outputs[:3], require_closed=True)
            assert truncated.reason is Reason.SESSION_TRUNCATED
            wrong = consumer.session(receipts, [b"not said", *outputs[1:]], audit=True)
            assert (wrong.reason, wrong.index) == (Reason.SESSION_OUTPUT_MISMATCH, 0)
    offline = Consumer.offline(registry_file).session(receipts, outputs, require_closed=True)
    assert offline and offline.emitter is not None and offline.emitter.seq == 3
    assert offline.session is not None and offline.session.closed
    assert offline.registry_sequence == 3
    # Evidence as bytes works the same way, and bytes that do not parse are a MALFORMED verdict.
    evidence = SessionEvidence(Path(receipts[0].envelopes[:-1]), tuple(r.leaf for r in receipts))
    assert Consumer.offline(registry_file).session(evidence.to_bytes(), audit=True)
    assert Consumer.offline(registry_file).session(b"{not a session").reason is Reason.MALFORMED


@pytest.mark.daemons
def test_a_consumer_policy_gates_the_session_online_and_offline(
    runtime: Make, runtime_mesh: LocalMesh, registry_file: str
) -> None:
    producer = runtime("deployer-a")
    receipts, outputs = a_session(producer, "gated", 2)
    closed_only = parse_policy(b'{"v": 1, "policy": {"require_closed_session": true}}')
    env = runtime_env(runtime_mesh, None)
    with Consumer.from_env(env, consumer_policy=closed_only) as gated:
        refused_online = gated.session(receipts, outputs)
        refused_offline = Consumer.offline(registry_file, consumer_policy=closed_only).session(receipts, outputs)
        for verdict in (refused_online, refused_offline):
            assert (verdict.reason, verdict.index, verdict.emitter) == (Reason.CONSUMER_POLICY_VIOLATION, 0, None)
        assert refused_online.detail == refused_offline.detail
        with online(runtime_mesh) as plain:
            assert plain.session(receipts, outputs), "the refusal consumed a receipt's nonce"
        closed, closed_outputs = a_session(producer, "gated-closed", 2, closed=True)
        assert gated.session(closed, closed_outputs)

    async def asynchronously() -> Reason | None:
        async with Consumer.from_env(env, consumer_policy=closed_only) as consumer:
            return (await consumer.asession(closed, closed_outputs)).reason

    assert asyncio.run(asynchronously()) is Reason.NONCE_REPLAYED  # allowed, so asked in accept mode


# --- asyncio ------------------------------------------------------------------------------------


@pytest.mark.daemons
def test_the_asyncio_twins_do_the_same_and_follow_the_event_loop(runtime: Make, runtime_mesh: LocalMesh) -> None:
    producer = runtime("deployer-b")
    receipts, outputs = a_session(producer, "async-1", 2)
    single = producer.receipt(producer.root("writer-async", "chat"), b"async notes")
    consumer = online(runtime_mesh)

    async def first() -> tuple[EvidenceVerdict, EvidenceVerdict]:
        return await consumer.asession(receipts, outputs), await consumer.apath(single, b"async notes")

    async def second() -> tuple[EvidenceVerdict, EvidenceVerdict]:  # another loop: another channel
        return await consumer.asession(receipts, outputs), await consumer.apath(single, b"async notes")

    session, path = asyncio.run(first())
    replayed_session, replayed_path = asyncio.run(second())
    asyncio.run(consumer.aclose())
    assert session and session.emitter is not None and session.emitter.deployer == "deployer-b"
    assert session.emitter.seq == 1 and path and path.emitter is not None
    assert replayed_session.reason is Reason.NONCE_REPLAYED
    assert replayed_path.reason is Reason.NONCE_REPLAYED


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.offline
def test_configuration_errors_say_what_is_missing() -> None:
    with pytest.raises(ConfigError, match=r"COUNTERSIGN_VERIFIER .* or COUNTERSIGN_REGISTRY"):
        Consumer.from_env({})
    with pytest.raises(ConfigError, match="not both"):
        Consumer.from_env({"COUNTERSIGN_VERIFIER": "127.0.0.1:1", "COUNTERSIGN_REGISTRY": "r.json"})
    with pytest.raises(ConfigError, match="cannot read the registry"):
        Consumer.offline("/nonexistent/registry.json")
    with pytest.raises(ConfigError, match="exactly one"):
        Consumer()
    with pytest.raises(ConfigError, match="exactly one"):
        Consumer(verifier="127.0.0.1:1", tls=TlsConfig(insecure_loopback=True), registry=Registry({}))
    with pytest.raises(ConfigError, match="needs tls"):
        Consumer(verifier="127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"tls\.ca"):
        Consumer.from_env({"COUNTERSIGN_VERIFIER": "127.0.0.1:1"})
    with pytest.raises(ValueError, match="at least one receipt"):
        Consumer.offline(Registry({})).session([])


@pytest.mark.offline
def test_a_registry_that_is_not_one_is_a_config_error(tmp_path: typing.Any) -> None:
    bad = tmp_path / "registry.json"
    bad.write_text('{"deployers": 3}')
    with pytest.raises(ConfigError, match="is not a registry"):
        Consumer.offline(str(bad))


@pytest.mark.offline
def test_a_registry_file_is_read_to_the_input_limit_and_no_further(tmp_path: typing.Any) -> None:
    """A registry file is bounded as the command line bounds it (spec 10): a larger file is refused
    without being read whole (it was read whole and parsed before)."""
    big = tmp_path / "registry.json"
    big.write_bytes(b" " * MAX_INPUT_BYTES + b"{}")
    with pytest.raises(ConfigError, match=f"exceeds {MAX_INPUT_BYTES} bytes"):
        load_registry(str(big))


@pytest.mark.daemons
def test_an_unreachable_verifier_is_a_typed_error(nowhere: str) -> None:
    with Consumer.online(nowhere, TlsConfig(insecure_loopback=True)) as consumer, pytest.raises(ServiceError) as caught:
        consumer.path(b"{}", b"")
    assert caught.value.code is ErrorCode.UNAVAILABLE


# --- shape --------------------------------------------------------------------------------------


@pytest.mark.offline
def test_one_verdict_shape_answers_every_check() -> None:
    for gone in ("VerifierVerdict", "SessionVerifierVerdict", "PathVerdict", "SessionVerdict", "verify_path",
                 "averify_path", "verify_session", "averify_session"):  # fmt: skip
        assert not hasattr(countersign.client, gone), gone
    checks = [Consumer.path, Consumer.session, Consumer.apath, Consumer.asession, VerifierClient.verify,
              VerifierClient.verify_session, countersign.client.AsyncVerifierClient.verify,
              countersign.client.AsyncVerifierClient.verify_session]  # fmt: skip
    for check in checks:
        assert typing.get_type_hints(check)["return"] is EvidenceVerdict, check.__qualname__


@pytest.mark.offline
def test_the_consumer_is_exported_typed_and_twinned() -> None:
    assert {"Consumer", "EvidenceVerdict", "OutputEmitter"} <= set(countersign.client.__all__)
    walked = {n: f for n, f in public_callables() if n.split(".")[0] == "Consumer"}
    assert {"Consumer.path", "Consumer.asession", "Consumer.session", "Consumer.apath"} <= set(walked)
    assert {name: found for name, function in walked.items() if (found := wire_types(function))} == {}
    for sync, aio in ((Consumer.path, Consumer.apath), (Consumer.session, Consumer.asession)):
        assert inspect.signature(sync).parameters.keys() == inspect.signature(aio).parameters.keys()
        assert inspect.iscoroutinefunction(aio) and not inspect.iscoroutinefunction(sync)
