"""``from_rpc_error`` rebuilds the server's typed error from a sync or an asyncio (grpc.aio) failure."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from hypothesis import given
from hypothesis import strategies as st

from countersign.client import ErrorCode, ServiceError
from countersign.client.errors import DOMAIN, ReceivedError, from_rpc_error

pytestmark = pytest.mark.offline

STATUSES = [grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE]


def aio_error(code: ErrorCode, message: str, status: grpc.StatusCode, metadata: dict[str, str]) -> grpc.aio.AioRpcError:
    """The failure a grpc.aio call raises when a servicer ends it as the servicer edge does."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason=code, domain=DOMAIN, metadata=metadata))
    rich = rpc_status.to_status(status_pb2.Status(code=status.value[0], message=message, details=[detail]))
    trailing = grpc.aio.Metadata.from_tuple(rich.trailing_metadata)
    return grpc.aio.AioRpcError(rich.code, grpc.aio.Metadata(), trailing, details=rich.details)


@given(
    code=st.sampled_from(ErrorCode),
    message=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=80),
    status=st.sampled_from(STATUSES),
    retryable=st.booleans(),
    details=st.dictionaries(st.sampled_from(["parent_code", "deployer"]), st.text(max_size=10), max_size=2),
)
def test_an_aio_refusal_becomes_the_same_typed_error(
    code: ErrorCode, message: str, status: grpc.StatusCode, retryable: bool, details: dict[str, str]
) -> None:
    metadata = {**details, "retryable": "true" if retryable else "false"}
    error = from_rpc_error(aio_error(code, message, status, metadata))
    assert isinstance(error, ServiceError)
    assert (error.code, str(error), error.status, error.retryable, error.details) == (
        code, message, status, retryable, details,
    )  # fmt: skip
    assert isinstance(error.code, ErrorCode)


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(grpc.StatusCode.UNAVAILABLE, True), (grpc.StatusCode.DEADLINE_EXCEEDED, True), (grpc.StatusCode.INTERNAL, False)],
)
def test_an_aio_transport_failure_is_typed_by_its_status(status: grpc.StatusCode, retryable: bool) -> None:
    error = from_rpc_error(grpc.aio.AioRpcError(status, grpc.aio.Metadata(), grpc.aio.Metadata(), details="gone"))
    assert (error.code, error.retryable, str(error)) == (ErrorCode(status.name), retryable, "gone")


# --- whatever a server sends (issue 29): nothing but a bounded ServiceError comes out ---------------


class HostileError(grpc.RpcError):
    """A finished call as a hostile or broken server can leave it: any status, text and trailers."""

    def __init__(self, code: object, details: object, trailing: list[tuple[str, object]]) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> object:
        return self._code

    def details(self) -> object:
        return self._details

    def trailing_metadata(self) -> list[tuple[str, object]]:
        return self._trailing


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40) | st.builds(
    lambda n: "x" * n, st.integers(0, 40_000)
)


@st.composite
def status_details(draw: st.DrawFn) -> bytes:
    """A ``grpc-status-details-bin`` value: random bytes, or a Status whose code, message and details
    may contradict the call's status line, with ErrorInfo of any domain, reason and metadata."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    details = []
    for _ in range(draw(st.integers(0, 3))):
        detail = any_pb2.Any()
        if draw(st.booleans()):
            detail.Pack(
                error_details_pb2.ErrorInfo(
                    reason=draw(st.sampled_from([*ErrorCode, "NOT_A_CODE", ""]) | TEXT),
                    domain=draw(st.sampled_from([DOMAIN, "other.example"])),
                    metadata=draw(st.dictionaries(TEXT, TEXT, max_size=40)),
                )
            )
        else:
            detail.type_url = draw(TEXT)
            detail.value = draw(st.binary(max_size=50))
        details.append(detail)
    status = status_pb2.Status(code=draw(st.integers(-5, 20)), message=draw(TEXT), details=details)
    return status.SerializeToString()


@given(
    code=st.sampled_from([*grpc.StatusCode, None, "UNAVAILABLE", 14]),
    details=st.one_of(st.none(), TEXT, st.binary(max_size=40)),
    trailing=st.lists(
        st.tuples(
            st.sampled_from(["grpc-status-details-bin", "retryable", "x-other"]) | TEXT,
            st.one_of(TEXT, st.binary(max_size=60), status_details()),
        ),
        max_size=4,
    ),
)
def test_whatever_a_server_sends_becomes_a_bounded_service_error(
    code: object, details: object, trailing: list[tuple[str, object]]
) -> None:
    error = from_rpc_error(HostileError(code, details, trailing))
    assert type(error) is ReceivedError
    assert isinstance(error.code, ErrorCode)
    assert isinstance(error.status, grpc.StatusCode)
    assert len(str(error)) <= 2_048
    assert len(error.details) <= 16
    assert all(len(k) <= 256 and len(v) <= 256 for k, v in error.details.items())


def test_a_status_message_too_long_for_a_client_is_cut_not_raised() -> None:
    """The 10,000-character query echoed into Impact's error: the typed error survives, bounded."""
    metadata = {"retryable": "false", "deployer": "d" * 10_000}
    error = from_rpc_error(
        aio_error(ErrorCode.INVALID_ARGUMENT, "m" * 20_000, grpc.StatusCode.INVALID_ARGUMENT, metadata)
    )
    assert error.code is ErrorCode.INVALID_ARGUMENT
    assert len(str(error)) <= 2_048 and str(error).endswith("more characters)")
    assert len(error.details["deployer"]) <= 256


def test_a_status_that_contradicts_its_trailers_is_typed_by_its_status_line() -> None:
    """grpc_status raises ValueError when the rich status's code differs from the call's: before
    issue 29 that ValueError escaped from_rpc_error."""
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.ErrorInfo(reason="NOT_AUTHORISED", domain=DOMAIN))
    rich = status_pb2.Status(code=grpc.StatusCode.PERMISSION_DENIED.value[0], message="no", details=[detail])
    trailing = [("grpc-status-details-bin", rich.SerializeToString())]
    error = from_rpc_error(HostileError(grpc.StatusCode.RESOURCE_EXHAUSTED, "too big", trailing))
    assert (error.code, str(error), error.retryable) == (ErrorCode.RESOURCE_EXHAUSTED, "too big", False)
