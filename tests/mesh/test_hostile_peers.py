"""A peer holding a valid certificate of the mesh's CA cannot starve the daemons (docs/operations.md,
"Limits").

Reproduces the attacks an independent run found: idle streams of every streaming method (the
daemons' own, reflection's and health's) held open from one certificate stalled every other caller's
unary calls (72 idle reflection streams made VerifyPath time out at 5 s); idle coordinator watches
pinned the coordinator, so the operator's revocation failed; a cancelled watch kept its thread until
its heartbeat interval ended; and health ``List`` logged a traceback on every call.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2_grpc

from countersign._daemon.limits import LimitsConfig
from countersign._daemon.tls import PeerIdentity, issue_certificate
from countersign._proto.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    signer_pb2,
    signer_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from countersign.admission import StatementKind
from countersign.client.tls import CHANNEL_OPTIONS, TlsConfig
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, poll, scrape, server_name_of

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

IDLE_STREAMS = 500  # of every streaming method, from one certificate
STREAMS_PER_PEER = LimitsConfig().streams_per_peer
SAMPLES = 60


def _victim_tls(mesh: LocalMesh) -> TlsConfig:
    """A second consumer certificate, so that the attacker's limits are not the victim's."""
    pki = mesh.workdir / "pki"
    if not (pki / "victim.pem").exists():
        issue_certificate(pki, pki, "victim", PeerIdentity("client", name="victim"), dns=[])
    return TlsConfig(ca=str(pki / "ca.pem"), cert=str(pki / "victim.pem"), key=str(pki / "victim.key"))


def _p99(timings: list[float]) -> float:
    return statistics.quantiles(timings, n=100)[98]


def _timed(call: Callable[[], object], samples: int = SAMPLES) -> list[float]:
    timings = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        timings.append(time.perf_counter() - started)
    return timings


class IdleStreams:
    """``count`` idle streams of each given method, held from one certificate on an asyncio loop of
    their own; ``refused`` and ``open`` say how the server answered them."""

    def __init__(self, address: str, tls: TlsConfig, server_name: str) -> None:
        self._address, self._tls, self._server_name = address, tls, server_name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._calls: list[grpc.aio.Call] = []
        self._release: asyncio.Event | None = None
        self._channel: grpc.aio.Channel | None = None

    def _run(self, coroutine: object, timeout_s: float = 60.0) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)  # type: ignore[arg-type]

    def open(self, openers: list[Callable[[grpc.aio.Channel, Callable[[], AsyncIterator[object]]], grpc.aio.Call]],
             count: int) -> None:  # fmt: skip
        async def start() -> None:
            self._release = asyncio.Event()
            credentials = grpc.ssl_channel_credentials(
                self._tls.material("ca"), self._tls.material("key"), self._tls.material("cert")
            )
            options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", self._server_name)]
            self._channel = grpc.aio.secure_channel(self._address, credentials, options=options)
            release = self._release

            async def idle() -> AsyncIterator[object]:
                await release.wait()
                return
                yield  # an async generator that sends nothing until released

            for opener in openers:
                for _ in range(count):
                    self._calls.append(opener(self._channel, idle))

        self._run(start())

    def settle(self, timeout_s: float = 90.0) -> tuple[int, int]:
        """(refused with RESOURCE_EXHAUSTED, still open) once every refusal has arrived."""

        async def count() -> tuple[int, int]:
            deadline = time.monotonic() + timeout_s
            while True:
                done = [c for c in self._calls if c.done()]
                for call in done:
                    assert await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, await call.details()
                still_open = len(self._calls) - len(done)
                if still_open <= STREAMS_PER_PEER or time.monotonic() > deadline:
                    await asyncio.sleep(0.5)  # a little longer: no late refusal changes the count
                    done = [c for c in self._calls if c.done()]
                    return len(done), len(self._calls) - len(done)
                await asyncio.sleep(0.1)

        return self._run(count(), timeout_s + 10)  # type: ignore[return-value]

    def close(self) -> None:
        async def stop() -> None:
            if self._release is not None:
                self._release.set()
            for call in self._calls:
                call.cancel()
            if self._channel is not None:
                await self._channel.close()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _reflection(channel: grpc.aio.Channel, idle: Callable[[], AsyncIterator[object]]) -> grpc.aio.Call:
    return reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(idle())


def _health_watch(channel: grpc.aio.Channel, idle: Callable[[], AsyncIterator[object]]) -> grpc.aio.Call:
    return health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())


def _verify_paths(channel: grpc.aio.Channel, idle: Callable[[], AsyncIterator[object]]) -> grpc.aio.Call:
    return verifier_pb2_grpc.VerifierStub(channel).VerifyPaths(idle())


def _cosign_edges(channel: grpc.aio.Channel, idle: Callable[[], AsyncIterator[object]]) -> grpc.aio.Call:
    return signer_pb2_grpc.SignerStub(channel).CoSignEdges(idle())


def _watch(channel: grpc.aio.Channel, idle: Callable[[], AsyncIterator[object]]) -> grpc.aio.Call:
    return coordinator_pb2_grpc.CoordinatorStub(channel).Watch(coordinator_pb2.WatchRequest(heartbeat_ms=60_000))


STREAMING = {
    "verifier-0": [_reflection, _health_watch, _verify_paths],
    "deployer-a": [_reflection, _health_watch, _cosign_edges],
    "coordinator": [_reflection, _health_watch, _watch],
}


def _victim_call(mesh: LocalMesh, daemon: str) -> tuple[Callable[[], object], grpc.Channel]:
    """One unary call of ``daemon``'s own service, made from another certificate than the attacker's."""
    if daemon == "verifier-0":
        channel = channel_to(mesh, daemon, _victim_tls(mesh))
        stub = verifier_pb2_grpc.VerifierStub(channel)
        request = verifier_pb2.VerifyPathRequest(path=b"{}", output=b"", mode=verifier_pb2.VerifyPathRequest.AUDIT)
        return (lambda: stub.VerifyPath(request, timeout=10)), channel
    if daemon == "deployer-a":
        channel = channel_to(mesh, daemon, "deployer-a-runtime")
        stub_s = signer_pb2_grpc.SignerStub(channel)
        agent = signer_pb2.AgentFields(instance="victim", system="limits", ttl_ms=60_000, max_children=1)
        return (lambda: stub_s.IssueRoot(signer_pb2.IssueRootRequest(agent=agent), timeout=10)), channel
    channel = channel_to(mesh, daemon, _victim_tls(mesh))
    stub_c = coordinator_pb2_grpc.CoordinatorStub(channel)
    return (lambda: stub_c.GetLog(coordinator_pb2.GetLogRequest(), timeout=10)), channel


@pytest.fixture
def hostile_mesh(make_mesh: Callable[..., LocalMesh]) -> LocalMesh:
    return make_mesh()


@pytest.mark.exclusive
@pytest.mark.parametrize("daemon", sorted(STREAMING))
def test_idle_streams_from_one_certificate_leave_unary_calls_answering(hostile_mesh: LocalMesh, daemon: str) -> None:
    mesh = hostile_mesh
    call, channel = _victim_call(mesh, daemon)
    call()  # warm: the victim's channel is connected before anything is timed
    unloaded = _timed(call)

    def streams_open() -> float:
        return sum(value for _, value in scrape(mesh, daemon)["countersign_streams_open"])

    baseline = streams_open()  # the daemon's own followers' and peers' streams
    attacker = IdleStreams(mesh.daemons[daemon].address, mesh.tls_for("client"), server_name_of(mesh, daemon))
    try:
        attacker.open(STREAMING[daemon], IDLE_STREAMS)
        refused, still_open = attacker.settle()
        # Exactly the attacker's share stays open; every other stream is refused, typed.
        assert still_open == STREAMS_PER_PEER
        assert refused == IDLE_STREAMS * len(STREAMING[daemon]) - STREAMS_PER_PEER
        loaded = _timed(call)
    finally:
        attacker.close()
        channel.close()
    # Every slot the attacker held comes back once its streams end.
    poll(lambda: streams_open() == baseline, timeout_s=15, what="the attacker's stream slots to come back")
    # Before the limits these calls timed out at 5 s. Twice the unloaded p99 is the issue's bound; the
    # extra 20 ms absorbs a 2-CPU machine's scheduling noise. The test runs alone (exclusive): with the
    # parallel run beside it the two windows saw different loads, not the attacker's effect.
    assert _p99(loaded) <= max(2 * _p99(unloaded), _p99(unloaded) + 0.020), (_p99(unloaded), _p99(loaded))
    refusals = {labels["limit"]: value for labels, value in scrape(mesh, daemon)["countersign_limit_refusals_total"]}
    # Most refusals are the interceptor's (counted); under a burst gRPC's own bound on queued calls may
    # refuse some first, with the same status and no count of ours.
    assert 0 < sum(refusals.values()) <= refused


def test_revocation_gets_through_while_a_consumer_holds_watch_streams(hostile_mesh: LocalMesh) -> None:
    """The attack that kept a revoked key accepted: 64 idle watches made the operator's Submit time out."""
    mesh = hostile_mesh
    attacker = IdleStreams(mesh.daemons["coordinator"].address, mesh.tls_for("client"), "coordinator.countersign.local")
    operator = mesh.operator_client()
    try:
        attacker.open([_watch], IDLE_STREAMS)
        refused, still_open = attacker.settle()
        assert (refused, still_open) == (IDLE_STREAMS - STREAMS_PER_PEER, STREAMS_PER_PEER)
        started = time.monotonic()
        operator.submit(StatementKind.REVOKE_KEY, "deployer-b", mesh.deployer_keys["deployer-b"].key_id)
        assert time.monotonic() - started < 5
        mesh.wait_for_registry(len(mesh.deployers) + 1)  # every follower, the verifiers included, has it
    finally:
        operator.close()
        attacker.close()


def test_a_cancelled_watch_gives_its_thread_back_at_once(hostile_mesh: LocalMesh) -> None:
    mesh = hostile_mesh

    def watchers() -> float:
        return sum(value for _, value in scrape(mesh, "coordinator")["countersign_coordinator_watchers"])

    baseline = watchers()  # the signers' and the verifier's own followers
    channel = channel_to(mesh, "coordinator", "client")
    calls = [
        coordinator_pb2_grpc.CoordinatorStub(channel).Watch(coordinator_pb2.WatchRequest(heartbeat_ms=60_000))
        for _ in range(8)
    ]
    for call in calls:
        next(call)  # the first heartbeat: the stream is open on the server
    assert watchers() == baseline + 8
    cancelled = time.monotonic()
    for call in calls:
        call.cancel()
    poll(lambda: watchers() == baseline, timeout_s=5, what="the cancelled watches to end")
    assert time.monotonic() - cancelled < 5  # not the 60 s heartbeat the client asked for
    channel.close()


def test_health_list_answers_and_logs_no_traceback(hostile_mesh: LocalMesh) -> None:
    mesh = hostile_mesh
    for daemon in ("coordinator", "deployer-a", "verifier-0"):
        channel = channel_to(mesh, daemon, "client")
        answer = health_pb2_grpc.HealthStub(channel).List(health_pb2.HealthListRequest(), timeout=10)
        channel.close()
        assert answer.statuses[""].status == health_pb2.HealthCheckResponse.SERVING
        assert len(answer.statuses) >= 2  # the server and its own service
        assert "Traceback" not in mesh.log_tail(daemon, 1_000)


def _send_big(channel: grpc.Channel, daemon: str, big: bytes) -> object:
    if daemon == "coordinator":
        return coordinator_pb2_grpc.CoordinatorStub(channel).Submit(
            coordinator_pb2.SubmitRequest(statement=big), timeout=10
        )
    return signer_pb2_grpc.SignerStub(channel).CoSignEdge(signer_pb2.CoSignEdgeRequest(parent_path=big), timeout=10)


@pytest.mark.parametrize(("daemon", "limit"), [("deployer-a", 2 << 20), ("coordinator", 2 << 20)])
def test_signer_and_coordinator_refuse_messages_beyond_what_their_parsers_take(
    hostile_mesh: LocalMesh, daemon: str, limit: int
) -> None:
    """Their inputs are at most 1 MiB by their own parsers: a 3 MiB message is refused before a handler
    ever sees it (it used to be buffered whole, up to 24 MiB)."""
    mesh = hostile_mesh
    tls = mesh.tls_for("client")
    credentials = grpc.ssl_channel_credentials(tls.material("ca"), tls.material("key"), tls.material("cert"))
    options = [
        ("grpc.max_send_message_length", 8 << 20),
        ("grpc.ssl_target_name_override", server_name_of(mesh, daemon)),
    ]
    channel = grpc.secure_channel(mesh.daemons[daemon].address, credentials, options=options)
    big = b"x" * (limit + (1 << 20))
    with pytest.raises(grpc.RpcError) as raised:
        _send_big(channel, daemon, big)
    channel.close()
    assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Traceback" not in mesh.log_tail(daemon, 1_000)
