"""Typed errors of the services, as a client sees them.

A server ends a refused call with a gRPC status carrying ``google.rpc.ErrorInfo`` whose ``reason`` is
a code of :class:`countersign.errors.ErrorCode`; :func:`from_rpc_error` turns it back into a
:class:`countersign.errors.ServiceError` (a transport failure becomes ``UNAVAILABLE`` or
``DEADLINE_EXCEEDED``), a :class:`ReceivedError` that also keeps the status the call ended with.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.protobuf import message as protobuf_message
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


# What a client keeps of whatever a server sends: a hostile or broken server may send any status,
# any text and any trailers, and none of it may become anything but a bounded ServiceError.
MAX_MESSAGE_CHARS = 2_048
MAX_DETAILS = 16
MAX_DETAIL_CHARS = 256
# gRPC's words when the server's certificate (of a trusted CA) does not name the pinned server.
HOSTNAME_MISMATCH = "Hostname Verification Check failed"
# What parsing a server's rich status may raise: a code or message that contradicts the status line
# (ValueError), bytes that are no Status or Any (protobuf's DecodeError), metadata of the wrong type.
_MALFORMED_STATUS = (ValueError, TypeError, AttributeError, protobuf_message.Error)


def bounded_text(value: object, limit: int) -> str:
    """``value`` as text of at most ``limit`` characters (longer text is cut and says by how much)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters)"


def _status_code(exc: grpc.RpcError) -> grpc.StatusCode:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def _typed_detail(exc: grpc.RpcError, code: grpc.StatusCode) -> ReceivedError | None:
    """The ErrorInfo of our domain in the call's rich status, or None when there is none. Raises
    whatever a malformed status makes the parser raise: the caller treats that as no ErrorInfo."""
    status = rpc_status.from_call(exc)
    if status is None:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == DOMAIN:
            details = {
                bounded_text(k, MAX_DETAIL_CHARS): bounded_text(v, MAX_DETAIL_CHARS)
                for k, v in sorted(info.metadata.items())
                if k != "retryable"
            }
            return ReceivedError(
                ErrorCode.of(info.reason),
                bounded_text(status.message, MAX_MESSAGE_CHARS),
                code,
                retryable=info.metadata.get("retryable") == "true",
                details=dict(list(details.items())[:MAX_DETAILS]),
            )
    return None


def from_rpc_error(exc: grpc.RpcError) -> ReceivedError:
    """Rebuild the typed error a server sent (or a transport error as UNAVAILABLE).

    ``exc`` is a sync call's error or a ``grpc.aio.AioRpcError``: both answer ``code()``,
    ``details()`` and ``trailing_metadata()`` synchronously (an aio error is a snapshot of the
    finished call), and both iterate their trailing metadata as (key, value) pairs.

    A connection refused because the server's certificate names another service or deployer than the
    one pinned is ``WRONG_SERVER`` (not retryable), saying what the server is and what was expected
    (:func:`countersign.client.tls.wrong_server_message`, which reads the server's certificate).

    Never raises: whatever a server sends (a status that contradicts its trailers, trailers that do
    not parse, a code outside the list, text of any length) becomes a :class:`ReceivedError` with a
    code of :class:`ErrorCode` and a bounded message (:data:`MAX_MESSAGE_CHARS`)."""
    code = _status_code(exc)
    try:
        typed = _typed_detail(exc, code)
    except _MALFORMED_STATUS:  # a status that contradicts itself or does not parse: no typed error
        typed = None
    if typed is not None:
        return typed
    text = exc.details() if callable(getattr(exc, "details", None)) else None
    if code is grpc.StatusCode.UNAVAILABLE and isinstance(text, str) and HOSTNAME_MISMATCH in text:
        from countersign.client.tls import wrong_server_message

        # A server of this CA for another service or deployer: no retry reaches a different one.
        message = bounded_text(wrong_server_message(text), MAX_MESSAGE_CHARS)
        return ReceivedError(ErrorCode.WRONG_SERVER, message, code, retryable=False)
    transient = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    message = bounded_text(text, MAX_MESSAGE_CHARS) if text else code.name
    return ReceivedError(ErrorCode.of(code.name), message, code, retryable=transient)
