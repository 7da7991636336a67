"""Typed errors of the services, as a client sees them.

A server ends a refused call with a gRPC status carrying ``google.rpc.ErrorInfo`` whose ``reason`` is
a code of :class:`countersign.errors.ErrorCode`; :func:`from_rpc_error` turns it back into a
:class:`ServiceError` (a transport failure becomes ``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``).
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from countersign.errors import CountersignError, ErrorCode

DOMAIN = "countersign.dev"


class ServiceError(CountersignError):
    """An error with a code from the API's error list (proto/countersign/v1/common.proto)."""

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        status: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION,
        *,
        retryable: bool = False,
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)  # a name outside the closed list is a bug: ValueError
        self.status = status
        self.retryable = retryable
        self.details = dict(details or {})

    def __repr__(self) -> str:
        return f"ServiceError({self.code}: {self})"


def from_rpc_error(exc: grpc.RpcError) -> ServiceError:
    """Rebuild the typed error a server sent (or a transport error as UNAVAILABLE).

    ``exc`` is a sync call's error or a ``grpc.aio.AioRpcError``: both answer ``code()``,
    ``details()`` and ``trailing_metadata()`` synchronously (an aio error is a snapshot of the
    finished call), and both iterate their trailing metadata as (key, value) pairs."""
    status = rpc_status.from_call(exc)
    code = exc.code()
    if status is not None:
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == DOMAIN:
                details = {k: v for k, v in info.metadata.items() if k != "retryable"}
                return ServiceError(
                    ErrorCode.of(info.reason), status.message, code, retryable=info.metadata.get("retryable") == "true",
                    details=details,
                )  # fmt: skip
    transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return ServiceError(ErrorCode.of(code.name), exc.details() or code.name, code, retryable=transient)
