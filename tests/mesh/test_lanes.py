"""Co-signing lanes (``CoSignEdges``): the same decisions as ``CoSignEdge``, on a long-lived stream.

Each edge on a lane is answered in order with what the unary call would answer; a refusal ends the
lane with the same typed status; a peer may hold at most ``lanes_per_peer`` lanes; bad messages and
bad peers are refused as on every other RPC; and a child's idle lanes are closed so they hold no
thread of the parent's server.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from countersign._proto.v1 import common_pb2, signer_pb2, verifier_pb2
from countersign.client import SignerClient, VerifierClient
from countersign.client.errors import ServiceError, from_rpc_error
from countersign.constructions import EdgeProposal, verify_cosignature
from countersign.keys import PublicKey
from countersign.reasons import Reason
from countersign.records import CoSignature, CoSignerRole, NodeRecord, Path, parse_json
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import (
    channel_to,
    delegate,
    grant_row,
    hand_built_edge,
    poll,
    scrape,
    signer_stub,
    verifier_stub,
)

pytestmark = pytest.mark.daemons
LANES = 2  # the mesh below allows two lanes per peer


class RawLane:
    """A raw lane (a stream-stream RPC) driven one call at a time, as a client drives it."""

    def __init__(self, open_stream: Callable[..., Any]) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.call = open_stream(iter(self._requests.get, None), timeout=30)

    def ask(self, request: Any) -> Any:
        self._requests.put(request)
        return next(self.call)

    def refusal(self, request: Any) -> ServiceError:
        self._requests.put(request)
        with pytest.raises(grpc.RpcError) as raised:
            next(self.call)
        return from_rpc_error(raised.value)

    def close(self) -> None:
        self._requests.put(None)
        self.call.cancel()


class Lane(RawLane):
    """A raw CoSignEdges stream, as a child's signer drives it."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(signer_stub(channel).CoSignEdges)


@pytest.fixture(scope="module")
def lane_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    from tests.mesh.conftest import start_mesh

    mesh = start_mesh(
        tmp_path_factory.mktemp("lanes"),
        signer_options={"lanes_per_peer": LANES},
        verifier_options={"lanes_per_client": LANES},
    )
    yield mesh
    mesh.stop_all()


@pytest.fixture
def runtime_a(lane_mesh: LocalMesh) -> Iterator[SignerClient]:
    client = lane_mesh.runtime("deployer-a")
    yield client
    client.close()


def lanes_open(mesh: LocalMesh, daemon: str, kind: str = "cosign") -> float:
    samples = scrape(mesh, daemon).get("countersign_lanes_open", [])
    return sum(value for labels, value in samples if labels["kind"] == kind)


def parent_cosig_verifies(mesh: LocalMesh, parent: Path, request: signer_pb2.CoSignEdgeRequest, answer: str) -> bool:
    child = NodeRecord.from_json(parse_json(request.child_record))
    key = mesh.deployer_keys["deployer-a"]
    cosig = CoSignature.from_json(parse_json(answer.encode()))
    proposal = EdgeProposal(parent.leaf, child, key.key_id)
    return cosig.role is CoSignerRole.PARENT and verify_cosignature(proposal, cosig, PublicKey(key.public_key))


def test_edges_on_one_lane_are_answered_in_order_and_a_retry_gets_the_same_answer(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    root = runtime_a.root("planner", "lanes", max_children=8)
    grants = [runtime_a.open_grant(root, "deployer-b") for _ in range(3)]
    edges = [hand_built_edge(lane_mesh, root, g.grant_id, "deployer-b", instance=f"e{i}") for i, g in enumerate(grants)]
    channel = channel_to(lane_mesh, "deployer-a", "deployer-b-signer")
    lane = Lane(channel)
    try:
        answers = [lane.ask(edge).parent_cosignature for edge in edges]
        again = lane.ask(edges[0]).parent_cosignature  # the same edge under the same grant: a safe retry
    finally:
        lane.close()
        channel.close()
    assert len(set(answers)) == 3
    for edge, answer in zip(edges, answers, strict=True):
        assert parent_cosig_verifies(lane_mesh, root, edge, answer)
        row = grant_row(lane_mesh, "deployer-a", edge.grant_id)
        assert row is not None and row[4] == answer  # spent on exactly this edge, durably
    assert again == answers[0]


def test_a_refusal_ends_the_lane_with_the_typed_code_and_spends_nothing(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    root = runtime_a.root("planner", "lanes-refusal", max_children=8)
    good = runtime_a.open_grant(root, "deployer-b")
    for_c = runtime_a.open_grant(root, "deployer-c")
    channel = channel_to(lane_mesh, "deployer-a", "deployer-b-signer")
    lane = Lane(channel)
    try:
        error = lane.refusal(hand_built_edge(lane_mesh, root, for_c.grant_id, "deployer-b"))
        assert (error.code, error.status) == ("GRANT_WRONG_CHILD", grpc.StatusCode.FAILED_PRECONDITION)
        with pytest.raises(grpc.RpcError):  # the lane is over
            lane.ask(hand_built_edge(lane_mesh, root, good.grant_id, "deployer-b"))
    finally:
        lane.close()
    row = grant_row(lane_mesh, "deployer-a", for_c.grant_id)
    assert row is not None and row[3] is None  # the refused grant is unspent
    fresh = Lane(channel)  # a new lane decides the next edge normally
    try:
        edge = hand_built_edge(lane_mesh, root, good.grant_id, "deployer-b", instance="after")
        assert parent_cosig_verifies(lane_mesh, root, edge, fresh.ask(edge).parent_cosignature)
    finally:
        fresh.close()
        channel.close()


def test_a_peer_holds_at_most_lanes_per_peer_lanes(lane_mesh: LocalMesh, runtime_a: SignerClient) -> None:
    poll(lambda: lanes_open(lane_mesh, "deployer-a") == 0 or None, what="idle lanes closed")
    root = runtime_a.root("planner", "lanes-cap", max_children=8)
    channel = channel_to(lane_mesh, "deployer-a", "deployer-b-signer")
    held = [Lane(channel) for _ in range(LANES)]
    try:
        for lane in held:  # each lane is open once it has answered an edge
            grant = runtime_a.open_grant(root, "deployer-b")
            lane.ask(hand_built_edge(lane_mesh, root, grant.grant_id, "deployer-b", instance=grant.grant_id[:8]))
        assert lanes_open(lane_mesh, "deployer-a") == LANES
        grant = runtime_a.open_grant(root, "deployer-b")
        extra = Lane(channel)
        error = extra.refusal(hand_built_edge(lane_mesh, root, grant.grant_id, "deployer-b", instance="extra"))
        assert (error.code, error.status, error.retryable) == (
            "LANES_EXHAUSTED",
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            True,
        )
        row = grant_row(lane_mesh, "deployer-a", grant.grant_id)
        assert row is not None and row[3] is None
        # Another peer is not limited by deployer-b's lanes.
        other = channel_to(lane_mesh, "deployer-a", "deployer-c-signer")
        grant_c = runtime_a.open_grant(root, "deployer-c")
        lane_c = Lane(other)
        try:
            assert lane_c.ask(hand_built_edge(lane_mesh, root, grant_c.grant_id, "deployer-c")).parent_cosignature
        finally:
            lane_c.close()
            other.close()
        held.pop().close()  # one lane closed: deployer-b may open another
        poll(lambda: lanes_open(lane_mesh, "deployer-a") == LANES - 1 or None, what="lane released")
        again = Lane(channel)
        held.append(again)
        assert again.ask(hand_built_edge(lane_mesh, root, grant.grant_id, "deployer-b", instance="extra"))
    finally:
        for lane in held:
            lane.close()
        channel.close()


def test_a_child_signer_without_a_free_lane_co_signs_with_the_unary_call(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    poll(lambda: lanes_open(lane_mesh, "deployer-a") == 0 or None, what="idle lanes closed")
    root = runtime_a.root("planner", "lanes-fallback", max_children=8)
    channel = channel_to(lane_mesh, "deployer-a", "deployer-b-signer")
    held = [Lane(channel) for _ in range(LANES)]  # every lane deployer-b may hold at deployer-a
    try:
        for lane in held:
            grant = runtime_a.open_grant(root, "deployer-b")
            lane.ask(hand_built_edge(lane_mesh, root, grant.grant_id, "deployer-b", instance=grant.grant_id[:8]))
        before = unary_cosigns(lane_mesh)
        path = delegate(lane_mesh, root, "deployer-b", "researcher")  # deployer-b's own signer asks now
        assert path.leaf.record.deployer == "deployer-b"
        assert unary_cosigns(lane_mesh) == before + 1
        assert lanes_open(lane_mesh, "deployer-a") == LANES
    finally:
        for lane in held:
            lane.close()
        channel.close()


def unary_cosigns(mesh: LocalMesh) -> float:
    """Edges deployer-a co-signed on unary CoSignEdge calls (lanes count as CoSignEdges)."""
    samples = scrape(mesh, "deployer-a").get("countersign_signer_requests_total", [])
    return sum(value for labels, value in samples if labels == {"method": "CoSignEdge", "code": "OK"})


def test_a_lane_from_a_peer_that_is_not_the_childs_signer_is_refused(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    root = runtime_a.root("planner", "lanes-auth")
    grant = runtime_a.open_grant(root, "deployer-b")
    edge = hand_built_edge(lane_mesh, root, grant.grant_id, "deployer-b")
    for identity in ("deployer-c-signer", "deployer-b-runtime", "client"):
        channel = channel_to(lane_mesh, "deployer-a", identity)
        lane = Lane(channel)
        try:
            error = lane.refusal(edge)
        finally:
            lane.close()
            channel.close()
        assert (error.code, error.status) == ("NOT_AUTHORISED", grpc.StatusCode.PERMISSION_DENIED), identity
    row = grant_row(lane_mesh, "deployer-a", grant.grant_id)
    assert row is not None and row[3] is None


def test_an_undecodable_message_on_a_lane_is_invalid_argument_and_the_signer_keeps_serving(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    channel = channel_to(lane_mesh, "deployer-a", "deployer-b-signer")
    raw = channel.stream_stream(
        "/countersign.v1.Signer/CoSignEdges", request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    for garbage in (b"\x0a\x02\xff\xfe", b"\xff\xff\xff", b"\x12"):
        with pytest.raises(grpc.RpcError) as raised:
            list(raw(iter([garbage]), timeout=10))
        error = from_rpc_error(raised.value)
        assert (error.code, error.status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT), garbage
    channel.close()
    root = runtime_a.root("planner", "lanes-garbage")
    assert delegate(lane_mesh, root, "deployer-b", "after-garbage").leaf.record.deployer == "deployer-b"
    assert "internal error" not in lane_mesh.daemons["deployer-a"].log_file.read_text()


def test_delegations_use_lanes_and_idle_lanes_are_closed(lane_mesh: LocalMesh, runtime_a: SignerClient) -> None:
    root = runtime_a.root("planner", "lanes-idle", max_children=8)
    for i in range(3):
        delegate(lane_mesh, root, "deployer-b", f"r{i}")
    streams = [labels for labels, _ in scrape(lane_mesh, "deployer-a").get("countersign_signer_requests_total", [])]
    assert {"method": "CoSignEdges", "code": "OK"} in streams
    # The child closes a lane idle for lane_idle_ms (1 s here): the parent's gauge returns to 0.
    poll(lambda: lanes_open(lane_mesh, "deployer-a") == 0 or None, timeout_s=5, what="idle lane closed")
    assert delegate(lane_mesh, root, "deployer-b", "after-idle").leaf.record.deployer == "deployer-b"


# --- runtime lanes ----------------------------------------------------------------------------


class RuntimeLane(RawLane):
    """A raw RuntimeCalls stream; ``ask(issue_root=...)`` sends the RuntimeCall with that field."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(signer_stub(channel).RuntimeCalls)

    def ask(self, **call: Any) -> signer_pb2.RuntimeAnswer:  # type: ignore[override]
        return super().ask(signer_pb2.RuntimeCall(**call))  # type: ignore[no-any-return]

    def refusal(self, **call: Any) -> ServiceError:  # type: ignore[override]
        return super().refusal(signer_pb2.RuntimeCall(**call))


def test_every_runtime_call_on_one_lane_gives_what_its_unary_form_gives(lane_mesh: LocalMesh) -> None:
    """Root, local child, receipt, grant and an accepted delegation on two runtime lanes; the
    resulting path verifies offline, as the unary calls' paths do."""
    from countersign.canonical import sha256_digest
    from countersign.registry import KeyEntry, Registry
    from countersign.state import InMemoryState
    from countersign.verify import Mode, verify_path
    from tests.mesh.helpers import now_ms, sha256

    channel_a = channel_to(lane_mesh, "deployer-a", "deployer-a-runtime")
    channel_b = channel_to(lane_mesh, "deployer-b", "deployer-b-runtime")
    lane_a, lane_b = RuntimeLane(channel_a), RuntimeLane(channel_b)
    try:
        agent = signer_pb2.AgentFields(instance="planner", system="runtime-lane", ttl_ms=600_000, max_children=4)
        root = lane_a.ask(issue_root=signer_pb2.IssueRootRequest(agent=agent)).issued
        local = lane_a.ask(
            issue_local_child=signer_pb2.IssueLocalChildRequest(
                parent_path=root.path, agent=signer_pb2.AgentFields(instance="helper", ttl_ms=600_000, max_children=2)
            )
        ).issued
        grant = lane_a.ask(
            open_grant=signer_pb2.OpenGrantRequest(parent_path=local.path, child_deployer="deployer-b")
        ).grant
        accepted = lane_b.ask(
            accept_delegation=signer_pb2.AcceptDelegationRequest(
                parent_path=local.path, grant_id=grant.grant_id, parent_key_id=grant.parent_key_id,
                parent_signer=lane_mesh.daemons["deployer-a"].address,
                agent=signer_pb2.AgentFields(instance="researcher", ttl_ms=600_000, max_children=2),
            )
        ).issued  # fmt: skip
        output = b"bytes the researcher emitted\n"
        receipt = lane_b.ask(
            issue_receipt=signer_pb2.IssueReceiptRequest(parent_path=accepted.path, output_sha256=sha256(output))
        ).issued
    finally:
        lane_a.close()
        lane_b.close()
        channel_a.close()
        channel_b.close()
    path = Path.from_bytes(receipt.path)
    assert [e.record.deployer for e in path.envelopes] == ["deployer-a", "deployer-a", "deployer-b", "deployer-b"]
    assert receipt.record_digest == path.leaf.digest()
    assert path.leaf.record.output is not None and path.leaf.record.output.sha256 == sha256_digest(output)
    registry = Registry(
        {d: {k.key_id: KeyEntry(PublicKey(k.public_key), 0)} for d, k in lane_mesh.deployer_keys.items()}
    )
    result = verify_path(path, output, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=now_ms())
    assert result, result


def test_runtime_lane_refusals_are_typed_and_end_only_that_lane(lane_mesh: LocalMesh) -> None:
    channel = channel_to(lane_mesh, "deployer-a", "deployer-a-runtime")
    try:
        lane = RuntimeLane(channel)
        error = lane.refusal()  # names no call
        assert (error.code, error.status) == ("INVALID_ARGUMENT", grpc.StatusCode.INVALID_ARGUMENT)
        lane.close()
        lane = RuntimeLane(channel)
        unknown = signer_pb2.IssueLocalChildRequest(
            parent_path=hand_built_root(lane_mesh).to_bytes(), agent=signer_pb2.AgentFields(instance="x", ttl_ms=1000)
        )
        error = lane.refusal(issue_local_child=unknown)
        assert (error.code, error.status) == ("PARENT_UNKNOWN", grpc.StatusCode.FAILED_PRECONDITION)
        lane.close()
        lane = RuntimeLane(channel)  # a new lane on the same connection works
        agent = signer_pb2.AgentFields(instance="p", system="s", ttl_ms=600_000)
        assert lane.ask(issue_root=signer_pb2.IssueRootRequest(agent=agent)).issued.path
        lane.close()
    finally:
        channel.close()


def hand_built_root(mesh: LocalMesh) -> Path:
    """A valid root record of deployer-a that deployer-a's signer never issued."""
    from countersign.records import Construction
    from countersign.samples import SampleMesh
    from tests.mesh.helpers import now_ms

    sample = SampleMesh({"deployer-a": mesh.deployer_keys["deployer-a"]})
    return sample.issue_path(Construction.SIGNED_DAG, ["deployer-a"], b"", now_ms=now_ms())


def test_only_this_deployers_runtime_may_open_a_runtime_lane(lane_mesh: LocalMesh) -> None:
    agent = signer_pb2.AgentFields(instance="p", system="s", ttl_ms=600_000)
    for identity in ("deployer-b-runtime", "deployer-b-signer", "client"):
        channel = channel_to(lane_mesh, "deployer-a", identity)
        lane = RuntimeLane(channel)
        try:
            error = lane.refusal(issue_root=signer_pb2.IssueRootRequest(agent=agent))
        finally:
            lane.close()
            channel.close()
        assert (error.code, error.status) == ("NOT_AUTHORISED", grpc.StatusCode.PERMISSION_DENIED), identity


def test_a_runtime_connection_holds_at_most_lanes_per_peer_lanes(lane_mesh: LocalMesh) -> None:
    channel = channel_to(lane_mesh, "deployer-a", "deployer-a-runtime")
    agent = signer_pb2.AgentFields(instance="p", system="s", ttl_ms=600_000)
    held = [RuntimeLane(channel) for _ in range(LANES)]
    try:
        for lane in held:
            assert lane.ask(issue_root=signer_pb2.IssueRootRequest(agent=agent)).issued.path
        assert lanes_open(lane_mesh, "deployer-a", "runtime") >= LANES
        error = RuntimeLane(channel).refusal(issue_root=signer_pb2.IssueRootRequest(agent=agent))
        assert (error.code, error.status) == ("LANES_EXHAUSTED", grpc.StatusCode.RESOURCE_EXHAUSTED)
    finally:
        for lane in held:
            lane.close()
        channel.close()


def test_the_runtime_client_uses_lanes_by_default_and_unary_calls_on_request(lane_mesh: LocalMesh) -> None:
    for lanes in (0, 2):
        parent = SignerClient(
            lane_mesh.daemons["deployer-a"].address, lane_mesh.tls_for("deployer-a-runtime"), "deployer-a", lanes=lanes
        )
        child = SignerClient(
            lane_mesh.daemons["deployer-b"].address, lane_mesh.tls_for("deployer-b-runtime"), "deployer-b", lanes=lanes
        )
        try:
            root = parent.root("planner", f"client-{lanes}")
            grant = parent.open_grant(root, "deployer-b")
            path = child.accept(root, grant, lane_mesh.daemons["deployer-a"].address, "researcher")
            assert path.envelopes[:1] == root.envelopes
            assert lanes_open(lane_mesh, "deployer-b", "runtime") == (1 if lanes else 0)
            again = child.accept(root, grant, lane_mesh.daemons["deployer-a"].address, "researcher")
            assert again == path  # asked again under the same grant: the same record
            for_c = parent.open_grant(root, "deployer-c")
            with pytest.raises(ServiceError) as raised:  # a grant for another child: refused, typed
                child.accept(root, for_c, lane_mesh.daemons["deployer-a"].address, "wrong")
            assert raised.value.code == "PARENT_REFUSED"
            assert raised.value.details.get("parent_code") == "GRANT_WRONG_CHILD"
        finally:
            parent.close()
            child.close()


# --- verification lanes -----------------------------------------------------------------------


class VerifyLane(RawLane):
    """A raw VerifyPaths stream; ``verdict`` answers (verdict, reason)."""

    def __init__(self, channel: grpc.Channel) -> None:
        super().__init__(verifier_stub(channel).VerifyPaths)

    def verdict(self, path: Path, output: bytes, *, audit: bool = False) -> tuple[int, str]:
        mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
        answer = self.ask(verifier_pb2.VerifyPathRequest(path=path.to_bytes(), output=output, mode=mode)).verdict
        return answer.verdict, answer.reason


ACCEPT, REJECT = common_pb2.Verdict.ACCEPT, common_pb2.Verdict.REJECT


def emitted(mesh: LocalMesh, runtime: SignerClient, name: str) -> tuple[Path, bytes]:
    from tests.mesh.helpers import sha256

    root = runtime.root("planner", name, max_children=4)
    child = delegate(mesh, root, "deployer-b", "researcher")
    output = f"output of {name}\n".encode()
    researcher = mesh.runtime("deployer-b")
    try:
        return researcher.receipt(child, sha256(output)), output
    finally:
        researcher.close()


def test_a_verification_lane_answers_verdicts_in_order_and_keeps_going_after_a_reject(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    path, output = emitted(lane_mesh, runtime_a, "verify-lane")
    channel = channel_to(lane_mesh, "verifier-0", "client")
    lane = VerifyLane(channel)
    try:
        assert lane.verdict(path, output, audit=True) == (ACCEPT, "")  # audit consumes nothing
        assert lane.verdict(path, b"substituted output\n") == (REJECT, "OUTPUT_MISMATCH")
        assert lane.verdict(path, output) == (ACCEPT, "")
        assert lane.verdict(path, output) == (REJECT, "NONCE_REPLAYED")
        assert lane.verdict(path, output, audit=True) == (ACCEPT, "")
    finally:
        lane.close()
        channel.close()


@pytest.fixture(scope="module")
def verifier_clients(lane_mesh: LocalMesh) -> Iterator[tuple[VerifierClient, VerifierClient]]:
    address, tls = lane_mesh.daemons["verifier-0"].address, lane_mesh.tls_for("client")
    on_lanes, unary = VerifierClient(address, tls), VerifierClient(address, tls, lanes=0)
    yield on_lanes, unary
    on_lanes.close()
    unary.close()


@pytest.fixture(scope="module")
def presented(lane_mesh: LocalMesh) -> tuple[Path, bytes]:
    runtime = lane_mesh.runtime("deployer-a")
    try:
        return emitted(lane_mesh, runtime, "verify-same")
    finally:
        runtime.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.integers(min_value=0), value=st.integers(min_value=0, max_value=255), in_output=st.booleans())
def test_a_lane_gives_the_verdict_a_unary_call_gives_for_any_byte_change(
    verifier_clients: tuple[VerifierClient, VerifierClient],
    presented: tuple[Path, bytes],
    position: int,
    value: int,
    in_output: bool,
) -> None:
    on_lanes, unary = verifier_clients
    path, output = presented
    data, out = bytearray(path.to_bytes()), bytearray(output)
    target = out if in_output else data
    target[position % len(target)] = value
    laned = on_lanes.verify(bytes(data), bytes(out), audit=True).result
    called = unary.verify(bytes(data), bytes(out), audit=True).result
    assert (laned.verdict, laned.reason, laned.index) == (called.verdict, called.reason, called.index)


def test_a_verifier_client_lane_accepts_once_and_a_bad_request_ends_only_its_lane(
    lane_mesh: LocalMesh, verifier_clients: tuple[VerifierClient, VerifierClient], runtime_a: SignerClient
) -> None:
    on_lanes, unary = verifier_clients
    path, output = emitted(lane_mesh, runtime_a, "verify-once")
    data = path.to_bytes()
    assert on_lanes.verify(data, output).result  # accepted on a lane; the unary call then sees the replay
    assert unary.verify(data, output).result.reason is Reason.NONCE_REPLAYED
    assert lanes_open(lane_mesh, "verifier-0", "verify") >= 1
    with pytest.raises(ServiceError) as raised:  # a policy the verifier does not know: refused; the lane ends
        on_lanes.verify(data, output, audit=True, policy="no-such-policy")
    assert raised.value.code == "INVALID_ARGUMENT"
    assert on_lanes.verify(data, output, audit=True).result  # the next call opens a new lane


def test_a_verifier_connection_holds_at_most_lanes_per_client_lanes(
    lane_mesh: LocalMesh, runtime_a: SignerClient
) -> None:
    path, output = emitted(lane_mesh, runtime_a, "verify-cap")
    channel = channel_to(lane_mesh, "verifier-0", "client")
    held = [VerifyLane(channel) for _ in range(LANES)]
    try:
        for lane in held:
            assert lane.verdict(path, output, audit=True) == (ACCEPT, "")
        request = verifier_pb2.VerifyPathRequest(
            path=path.to_bytes(), output=output, mode=verifier_pb2.VerifyPathRequest.AUDIT
        )
        error = VerifyLane(channel).refusal(request)
        assert (error.code, error.status) == ("LANES_EXHAUSTED", grpc.StatusCode.RESOURCE_EXHAUSTED)
    finally:
        for lane in held:
            lane.close()
        channel.close()
