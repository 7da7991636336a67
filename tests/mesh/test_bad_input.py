"""Bad input to every RPC of every service: a typed error (or a MALFORMED verdict), never INTERNAL, and
the daemon keeps serving.

Requests go through raw byte-level callables, so the tests can send what no generated stub would:
messages over the 24 MiB limit, bytes that are not protobuf, wrong wire types, bad UTF-8 in string
fields. After each case the daemon must still answer a health check and a valid call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from countersign._proto.v1 import common_pb2, coordinator_pb2, signer_pb2, verifier_pb2
from countersign.client.tls import MAX_MESSAGE_BYTES
from countersign.records import MAX_INPUT_BYTES, Path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import big_channel_to, channel_to, grant_count, hand_built_edge, service_error, sha256

pytestmark = pytest.mark.daemons
INVALID = grpc.StatusCode.INVALID_ARGUMENT
REJECT = common_pb2.Verdict.REJECT
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@dataclass(frozen=True)
class Rpc:
    daemon: str
    identity: str
    method: str
    streaming: bool = False
    bad_utf8: bytes | None = None  # a request with invalid UTF-8 in one of its string fields
    lane: bool = False  # a stream of requests (a lane): the request is sent as its first message


RPCS = {
    "VerifyPath": Rpc("verifier-0", "client", "/countersign.v1.Verifier/VerifyPath"),
    "Submit": Rpc("coordinator", "operator", "/countersign.v1.Coordinator/Submit"),
    "GetLog": Rpc("coordinator", "client", "/countersign.v1.Coordinator/GetLog"),
    "Watch": Rpc("coordinator", "client", "/countersign.v1.Coordinator/Watch", streaming=True),
    "IssueRoot": Rpc(
        "deployer-a", "deployer-a-runtime", "/countersign.v1.Signer/IssueRoot", False, b"\x0a\x04\x0a\x02\xff\xfe"
    ),
    "IssueLocalChild": Rpc(
        "deployer-a", "deployer-a-runtime", "/countersign.v1.Signer/IssueLocalChild", False, b"\x12\x04\x0a\x02\xff\xfe"
    ),
    "IssueReceipt": Rpc(
        "deployer-a", "deployer-a-runtime", "/countersign.v1.Signer/IssueReceipt", False, b"\x1a\x02\xff\xfe"
    ),
    "OpenGrant": Rpc(
        "deployer-a", "deployer-a-runtime", "/countersign.v1.Signer/OpenGrant", False, b"\x12\x02\xff\xfe"
    ),
    "AcceptDelegation": Rpc(
        "deployer-a", "deployer-a-runtime", "/countersign.v1.Signer/AcceptDelegation", False, b"\x12\x02\xff\xfe"
    ),
    "CoSignEdge": Rpc(
        "deployer-a", "deployer-b-signer", "/countersign.v1.Signer/CoSignEdge", False, b"\x0a\x02\xff\xfe"
    ),
    "CoSignEdges": Rpc(
        "deployer-a", "deployer-b-signer", "/countersign.v1.Signer/CoSignEdges", bad_utf8=b"\x0a\x02\xff\xfe", lane=True
    ),
    "RuntimeCalls": Rpc(
        "deployer-a",
        "deployer-a-runtime",
        "/countersign.v1.Signer/RuntimeCalls",
        bad_utf8=b"\x0a\x06\x0a\x04\x0a\x02\xff\xfe",
        lane=True,
    ),
    "VerifyPaths": Rpc("verifier-0", "client", "/countersign.v1.Verifier/VerifyPaths", lane=True),
    "Health.coordinator": Rpc("coordinator", "client", "/grpc.health.v1.Health/Check", False, b"\x0a\x02\xff\xfe"),
    "Health.signer": Rpc("deployer-a", "client", "/grpc.health.v1.Health/Check", False, b"\x0a\x02\xff\xfe"),
    "Health.verifier": Rpc("verifier-0", "client", "/grpc.health.v1.Health/Check", False, b"\x0a\x02\xff\xfe"),
}
SERVICE_OF = {"verifier": "countersign.v1.Verifier", "coordinator": "countersign.v1.Coordinator"}


class Raw:
    """Byte-level callers of every RPC over channels kept for the module."""

    def __init__(self, mesh: LocalMesh) -> None:
        self.mesh = mesh
        self._channels: dict[tuple[str, str], grpc.Channel] = {}

    def channel(self, daemon: str, identity: str) -> grpc.Channel:
        key = (daemon, identity)
        if key not in self._channels:
            self._channels[key] = channel_to(self.mesh, daemon, identity)
        return self._channels[key]

    def call(self, rpc: Rpc, request: bytes, *, channel: grpc.Channel | None = None) -> bytes:
        """The raw response (for a stream: its first message)."""
        channel = channel or self.channel(rpc.daemon, rpc.identity)
        if rpc.lane:
            answers = channel.stream_stream(rpc.method)(iter([request]), timeout=10)
            try:
                return next(iter(answers))  # type: ignore[no-any-return]
            finally:
                answers.cancel()
        if rpc.streaming:
            stream = channel.unary_stream(rpc.method)(request, timeout=10)
            try:
                return next(iter(stream))  # type: ignore[no-any-return]
            finally:
                stream.cancel()
        return channel.unary_unary(rpc.method)(request, timeout=30)  # type: ignore[no-any-return]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


@pytest.fixture(scope="module")
def raw(mesh: LocalMesh) -> Iterator[Raw]:
    callers = Raw(mesh)
    yield callers
    callers.close()


@dataclass(frozen=True)
class Known:
    """Valid material to check that a daemon still serves."""

    root: Path
    receipt: Path
    output: bytes


@pytest.fixture(scope="module")
def known(mesh: LocalMesh) -> Known:
    runtime = mesh.runtime("deployer-a")
    try:
        root = runtime.root("input-tests", "bad-input")
        output = b"a valid output\n"
        return Known(root, runtime.receipt(root, sha256(output)), output)
    finally:
        runtime.close()


@pytest.fixture(scope="module")
def still_serving(mesh: LocalMesh, raw: Raw, known: Known) -> Callable[[str], None]:
    def check(daemon: str) -> None:
        kind = mesh.daemons[daemon].kind
        service = SERVICE_OF.get(kind, "countersign.v1.Signer")
        channel = raw.channel(daemon, "client")
        for name in ("", service):
            answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        if kind == "verifier":
            request = verifier_pb2.VerifyPathRequest(
                path=known.receipt.to_bytes(), output=known.output, mode=verifier_pb2.VerifyPathRequest.AUDIT
            )
            response = verifier_pb2.VerifyPathResponse.FromString(
                raw.call(RPCS["VerifyPath"], request.SerializeToString())
            )
            assert response.verdict.verdict == response.verdict.ACCEPT, response
        elif kind == "coordinator":
            response = coordinator_pb2.GetLogResponse.FromString(raw.call(RPCS["GetLog"], b""))
            assert response.head_sequence == 3
        else:
            agent = signer_pb2.AgentFields(instance="still-serving", system="bad-input", ttl_ms=60_000)
            request = signer_pb2.IssueRootRequest(agent=agent).SerializeToString()
            assert Path.from_bytes(signer_pb2.IssueResponse.FromString(raw.call(RPCS["IssueRoot"], request)).path)

    return check


def verdict_of(data: bytes) -> tuple[int, str]:
    verdict = verifier_pb2.VerifyPathResponse.FromString(data).verdict
    return verdict.verdict, verdict.reason


# --- transport-level garbage, for every RPC ------------------------------------------------------


@pytest.mark.parametrize("name", list(RPCS))
def test_oversized_message(mesh: LocalMesh, raw: Raw, still_serving: Callable[[str], None], name: str) -> None:
    rpc = RPCS[name]
    size = MAX_MESSAGE_BYTES + (1 << 20)
    payload = b"\x0a" + _varint(size) + b"x" * size  # field 1, length-delimited
    channel = big_channel_to(mesh, rpc.daemon, rpc.identity, max_send=2 * size)
    try:
        error = service_error(lambda: raw.call(rpc, payload, channel=channel))
    finally:
        channel.close()
    assert error.status is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    still_serving(rpc.daemon)


@pytest.mark.parametrize(
    "garbage",
    [b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x0a\xff\xff\xff\xff\x0f"],
    ids=["bytes", "truncated", "huge-length"],
)
@pytest.mark.parametrize("name", list(RPCS))
def test_undecodable_request(raw: Raw, still_serving: Callable[[str], None], name: str, garbage: bytes) -> None:
    rpc = RPCS[name]
    error = service_error(lambda: raw.call(rpc, garbage))
    assert (error.code, error.status) == ("INVALID_ARGUMENT", INVALID), error
    assert "not a valid message" in str(error)
    still_serving(rpc.daemon)


@pytest.mark.parametrize("name", [n for n, r in RPCS.items() if r.bad_utf8 is not None])
def test_bad_utf8_in_a_string_field(raw: Raw, still_serving: Callable[[str], None], name: str) -> None:
    rpc = RPCS[name]
    assert rpc.bad_utf8 is not None
    error = service_error(lambda: raw.call(rpc, rpc.bad_utf8))  # type: ignore[arg-type]
    assert (error.code, error.status) == ("INVALID_ARGUMENT", INVALID), error
    still_serving(rpc.daemon)


# Field 1 with the fixed32 wire type: no field 1 of these messages is fixed32, so protobuf keeps it
# as an unknown field and the request reads as empty.
@pytest.mark.parametrize("request_bytes", [b"", b"\x0d\x00\x00\x00\x00"], ids=["empty", "wrong-wire-type"])
def test_empty_request_everywhere(
    mesh: LocalMesh, raw: Raw, still_serving: Callable[[str], None], request_bytes: bytes
) -> None:
    assert verdict_of(raw.call(RPCS["VerifyPath"], request_bytes)) == (REJECT, "MALFORMED")
    error = service_error(lambda: raw.call(RPCS["Submit"], request_bytes))
    assert (error.code, error.status) == ("INVALID_STATEMENT", INVALID)
    assert coordinator_pb2.GetLogResponse.FromString(raw.call(RPCS["GetLog"], request_bytes)).head_sequence == 3
    first = coordinator_pb2.WatchEvent.FromString(raw.call(RPCS["Watch"], request_bytes))
    assert first.HasField("statement")  # the backlog from sequence 0
    for name in ("IssueRoot", "IssueLocalChild", "IssueReceipt", "OpenGrant", "AcceptDelegation", "CoSignEdge"):
        error = service_error(lambda name=name: raw.call(RPCS[name], request_bytes))
        assert (error.code, error.status) == ("INVALID_ARGUMENT", INVALID), (name, error)
    for daemon in ("verifier-0", "coordinator", "deployer-a"):
        still_serving(daemon)


# --- malformed JSON in the evidence fields --------------------------------------------------------

MALFORMED_JSON = {
    "not-utf8": b"\xff\xfe{}",
    "truncated": b'{"envelopes":[',
    "array": b"[]",
    "null": b"null",
    "string": b'"path"',
    "number": b"12",
    "float": b'{"v":1.0,"envelopes":[]}',
    "nan": b'{"v":NaN}',
    "duplicate-key": b'{"v":1,"v":1,"envelopes":[]}',
    "missing-fields": b'{"v":1}',
    "wrong-type-v": b'{"v":"1","envelopes":[]}',
    "wrong-type-envelopes": b'{"v":1,"envelopes":"x"}',
    "empty-envelopes": b'{"v":1,"envelopes":[]}',
    "envelope-not-object": b'{"v":1,"envelopes":[7]}',
    "deep-nesting": b"[" * 200_000,
    "over-1-MiB": b'{"v":1,"envelopes":[' + b" " * MAX_INPUT_BYTES + b"]}",
}


@pytest.fixture(scope="module")
def cosign_parts(mesh: LocalMesh, known: Known) -> signer_pb2.CoSignEdgeRequest:
    return hand_built_edge(mesh, known.root, "0" * 32, "deployer-b")


@pytest.mark.parametrize("case", list(MALFORMED_JSON))
def test_malformed_evidence_fields(
    raw: Raw,
    known: Known,
    cosign_parts: signer_pb2.CoSignEdgeRequest,
    still_serving: Callable[[str], None],
    case: str,
) -> None:
    bad = MALFORMED_JSON[case]
    request = verifier_pb2.VerifyPathRequest(path=bad, output=b"x")
    for mode in (verifier_pb2.VerifyPathRequest.ACCEPT, verifier_pb2.VerifyPathRequest.AUDIT):
        request.mode = mode
        assert verdict_of(raw.call(RPCS["VerifyPath"], request.SerializeToString())) == (REJECT, "MALFORMED")

    error = service_error(
        lambda: raw.call(RPCS["Submit"], coordinator_pb2.SubmitRequest(statement=bad).SerializeToString())
    )
    assert (error.code, error.status) == ("INVALID_STATEMENT", INVALID), error

    agent = signer_pb2.AgentFields(instance="x", ttl_ms=60_000)
    signer_requests = {
        "IssueLocalChild": signer_pb2.IssueLocalChildRequest(parent_path=bad, agent=agent),
        "IssueReceipt": signer_pb2.IssueReceiptRequest(parent_path=bad, output_sha256=sha256(b"")),
        "OpenGrant": signer_pb2.OpenGrantRequest(parent_path=bad, child_deployer="deployer-b"),
        "AcceptDelegation": signer_pb2.AcceptDelegationRequest(
            parent_path=bad, grant_id="0" * 32, parent_key_id="k", parent_signer="127.0.0.1:1", agent=agent
        ),
        "CoSignEdge": _cosign(cosign_parts, parent_path=bad),
        "CoSignEdge.child_record": _cosign(cosign_parts, child_record=bad),
        "CoSignEdge.child_cosignature": _cosign(cosign_parts, child_cosignature=bad.decode("utf-8", "replace")),
    }
    for name, message in signer_requests.items():
        error = service_error(
            lambda name=name, message=message: raw.call(RPCS[name.split(".")[0]], message.SerializeToString())
        )
        assert (error.code, error.status) == ("INVALID_ARGUMENT", INVALID), (name, error)
    for daemon in ("verifier-0", "coordinator", "deployer-a"):
        still_serving(daemon)


def _cosign(base: signer_pb2.CoSignEdgeRequest, **changes: object) -> signer_pb2.CoSignEdgeRequest:
    copy = signer_pb2.CoSignEdgeRequest()
    copy.CopyFrom(base)
    for field, value in changes.items():
        setattr(copy, field, value)
    return copy


# --- values of the right type but out of range ----------------------------------------------------


def _root_request(**agent: object) -> signer_pb2.IssueRootRequest:
    fields: dict[str, object] = {"instance": "x", "system": "s", "ttl_ms": 60_000, **agent}
    return signer_pb2.IssueRootRequest(agent=signer_pb2.AgentFields(**fields))


def test_out_of_range_fields(mesh: LocalMesh, raw: Raw, known: Known, still_serving: Callable[[str], None]) -> None:
    root, path, output = known.root.to_bytes(), known.receipt.to_bytes(), known.output
    short_ttl = signer_pb2.AgentFields(instance="x", ttl_ms=0)
    cases: list[tuple[str, object]] = [
        ("VerifyPath", verifier_pb2.VerifyPathRequest(path=path, output=output, mode=7)),
        ("VerifyPath", verifier_pb2.VerifyPathRequest(path=path, output=output, mode=-1)),
        ("VerifyPath", verifier_pb2.VerifyPathRequest(path=path, output=b"x" * ((1 << 20) + 1))),
        ("VerifyPath", verifier_pb2.VerifyPathRequest(path=path, output=b"x", output_sha256=bytes(32))),
        ("VerifyPath", verifier_pb2.VerifyPathRequest(path=path, output_sha256=bytes(31))),
        ("IssueRoot", _root_request(ttl_ms=-5)),
        ("IssueRoot", _root_request(max_children=1 << 20)),
        ("IssueRoot", _root_request(event="bogus")),
        ("IssueRoot", _root_request(instance="")),
        ("IssueRoot", _root_request(max_depth=-1)),
        ("IssueReceipt", signer_pb2.IssueReceiptRequest(parent_path=root, output_sha256=b"\x00" * 31)),
        ("IssueReceipt", signer_pb2.IssueReceiptRequest(parent_path=root, output_sha256=bytes(32), binding_scope="x")),
        ("IssueLocalChild", signer_pb2.IssueLocalChildRequest(parent_path=root, agent=short_ttl)),
        ("OpenGrant", signer_pb2.OpenGrantRequest(parent_path=root, child_deployer="deployer-b", ttl_ms=-1)),
    ]
    foreign_root, parent_key = _foreign_root(mesh), mesh.deployer_keys["deployer-b"].key_id
    delegation = {"grant_id": "0" * 32, "parent_key_id": parent_key, "parent_signer": "127.0.0.1:1"}
    for change in ({"parent_signer": "no-port"}, {"parent_key_id": ""}, {"grant_id": ""}, {"grant_id": "g" * 65}):
        fields = delegation | change
        cases.append(
            (
                "AcceptDelegation",
                signer_pb2.AcceptDelegationRequest(
                    parent_path=foreign_root, agent=signer_pb2.AgentFields(instance="x", ttl_ms=60_000), **fields
                ),
            )
        )
    grants = grant_count(mesh, "deployer-a")
    for name, message in cases:
        request = message.SerializeToString()  # type: ignore[attr-defined]
        error = service_error(lambda name=name, request=request: raw.call(RPCS[name], request))
        assert (error.code, error.status) == ("INVALID_ARGUMENT", INVALID), (name, message, error)
    assert grant_count(mesh, "deployer-a") == grants
    for daemon in ("verifier-0", "deployer-a"):
        still_serving(daemon)


def _foreign_root(mesh: LocalMesh) -> bytes:
    """A root of deployer-b: a valid parent for a delegation into deployer-a."""
    runtime = mesh.runtime("deployer-b")
    try:
        return runtime.root("foreign", "bad-input").to_bytes()
    finally:
        runtime.close()


# --- random input ---------------------------------------------------------------------------------
# Each test sends its own random input and then checks that the daemon it hit still answers, so that
# survival is checked whichever tests run, in whatever order, on whichever worker.


def test_random_bytes_as_a_path_are_malformed(raw: Raw, still_serving: Callable[[str], None]) -> None:
    @FEW
    @given(path=st.binary(max_size=2048), output=st.binary(max_size=64), mode=st.sampled_from([0, 1, 2]))
    def malformed(path: bytes, output: bytes, mode: int) -> None:
        request = verifier_pb2.VerifyPathRequest(path=path, output=output, mode=mode)
        assert verdict_of(raw.call(RPCS["VerifyPath"], request.SerializeToString())) == (REJECT, "MALFORMED")

    malformed()
    still_serving("verifier-0")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
PATHISH = st.fixed_dictionaries({"v": JSON | st.just(1), "envelopes": st.lists(JSON, max_size=3) | JSON})


def test_random_json_as_a_path_is_malformed(raw: Raw, still_serving: Callable[[str], None]) -> None:
    @FEW
    @given(value=JSON | PATHISH)
    def malformed(value: object) -> None:
        request = verifier_pb2.VerifyPathRequest(path=json.dumps(value).encode(), output=b"x")
        verdict, reason = verdict_of(raw.call(RPCS["VerifyPath"], request.SerializeToString()))
        assert verdict == REJECT
        assert reason in ("MALFORMED", "UNSUPPORTED_VERSION")  # an integer "v" other than 1 is a version

    malformed()
    still_serving("verifier-0")


def test_random_statements_are_refused(raw: Raw, still_serving: Callable[[str], None]) -> None:
    @FEW
    @given(statement=st.binary(max_size=2048) | JSON.map(lambda v: json.dumps(v).encode()))
    def refused(statement: bytes) -> None:
        request = coordinator_pb2.SubmitRequest(statement=statement).SerializeToString()
        error = service_error(lambda: raw.call(RPCS["Submit"], request))
        assert (error.code, error.status) == ("INVALID_STATEMENT", INVALID), error

    refused()
    still_serving("coordinator")


def test_random_protobuf_to_verify_path(raw: Raw, still_serving: Callable[[str], None]) -> None:
    """Whatever the bytes: a verdict, or INVALID_ARGUMENT; never INTERNAL, never a dropped connection."""

    @FEW
    @given(request=st.binary(max_size=512))
    def answered(request: bytes) -> None:
        try:
            verdict, status = verdict_of(raw.call(RPCS["VerifyPath"], request))[0], grpc.StatusCode.OK
        except grpc.RpcError as exc:
            verdict, status = REJECT, exc.code()
        assert (verdict, status) in ((REJECT, grpc.StatusCode.OK), (REJECT, INVALID)), status

    answered()
    still_serving("verifier-0")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
