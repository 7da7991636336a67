"""Typed errors of the services, as a client sees them.

A server ends a refused call with a gRPC status carrying ``google.rpc.ErrorInfo`` whose ``reason`` is
a code of :class:`countersign.errors.ErrorCode`; :func:`from_rpc_error` turns it back into a
:class:`countersign.errors.ServiceError` (a transport failure becomes ``UNAVAILABLE`` or
``DEADLINE_EXCEEDED``), a :class:`ReceivedError` that also keeps the status the call ended with.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from countersign.errors import ErrorCode, ServiceError

DOMAIN = "countersign.dev"

__all__ = ["DOMAIN", "ReceivedError", "ServiceError", "from_rpc_error"]


class ReceivedError(ServiceError):
    """A :class:`ServiceError` read from a finished call: ``status`` is the gRPC status the call ended
    with, as received (a Countersign server picks it from the code at its edge; a transport failure
    has its own). Catch :class:`ServiceError` and read ``code``; ``status`` is for diagnostics."""

    def __init__(
        self,
        code: ErrorCode | str,
        message: str,
        status: grpc.StatusCode,
        *,
        retryable: bool | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, message, retryable=retryable, details=details)
        self.status = status


def from_rpc_error(exc: grpc.RpcError) -> ReceivedError:
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
                return ReceivedError(
                    ErrorCode.of(info.reason), status.message, code, retryable=info.metadata.get("retryable") == "true",
                    details=details,
                )  # fmt: skip
    transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return ReceivedError(ErrorCode.of(code.name), exc.details() or code.name, code, retryable=transient)
