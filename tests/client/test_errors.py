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
from countersign.client.errors import DOMAIN, from_rpc_error

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
