"""Typed errors across gRPC: a status code plus ``google.rpc.ErrorInfo`` naming the reason.

An error is a code and a message (:class:`countersign.errors.ServiceError`); the gRPC status it ends a
call with is chosen here, at the servicer edge, and only here, from one table (:data:`STATUS_OF_CODE`,
the "status" column of docs/api.md "Errors"). Clients turn the status back into a ServiceError with
:func:`countersign.client.errors.from_rpc_error`. An unexpected exception is a bug: it is logged with
its traceback and answered with INTERNAL, never dressed up as a verdict.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from countersign.client.errors import DOMAIN, bounded_text
from countersign.cosigning import Refusal
from countersign.errors import CountersignError, ErrorCode, MalformedError, ServiceError, SignerError, StateUnavailable

log = logging.getLogger("countersign.service")

_REFUSED = grpc.StatusCode.FAILED_PRECONDITION
# The one table: the gRPC status of every code (docs/api.md "Errors"; tests/core/test_error_codes.py
# checks the two agree and that every code has one).
STATUS_OF_CODE: Final[Mapping[ErrorCode, grpc.StatusCode]] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_AUTHORISED: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.STATE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.LANES_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.REGISTRY_STALE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.SIGNER_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.PARENT_UNKNOWN: _REFUSED,
    ErrorCode.POLICY_REFUSED: _REFUSED,
    ErrorCode.DEPTH_LIMIT: _REFUSED,
    ErrorCode.FANOUT_EXCEEDED: _REFUSED,
    ErrorCode.EXPIRY_EXCEEDS_PARENT: _REFUSED,
    ErrorCode.GRANT_NOT_FOUND: _REFUSED,
    ErrorCode.GRANT_WRONG_CHILD: _REFUSED,
    ErrorCode.GRANT_USED: _REFUSED,
    ErrorCode.GRANT_EXPIRED: _REFUSED,
    ErrorCode.BAD_COSIGNATURE: _REFUSED,
    ErrorCode.PARENT_REFUSED: _REFUSED,
    ErrorCode.PARENT_UNREACHABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.SESSION_CLOSED: _REFUSED,
    ErrorCode.STATE_CONFLICT: grpc.StatusCode.ABORTED,  # replicas raced past decide_attempts: retry
    ErrorCode.BAD_STATEMENT_SIGNATURE: grpc.StatusCode.PERMISSION_DENIED,
    ErrorCode.SEQUENCE_CONFLICT: _REFUSED,
    ErrorCode.CHAIN_MISMATCH: _REFUSED,
    ErrorCode.INVALID_STATEMENT: grpc.StatusCode.INVALID_ARGUMENT,  # malformed, or cannot apply (spec 7.3)
    ErrorCode.ROLLBACK: _REFUSED,  # found by clients, never sent
    ErrorCode.NOT_SERVED: _REFUSED,  # found by the operator's client, never sent
    ErrorCode.WRONG_SERVER: grpc.StatusCode.UNAVAILABLE,  # found by clients in the TLS handshake, never sent
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
}


def refusal_error(refusal: Refusal, details: Mapping[str, str] | None = None) -> ServiceError:
    """The typed error that ends a call with a signer's ``refusal`` (retryable as its code is)."""
    return ServiceError(refusal.code, refusal.message, details=details)


class Aborted(Exception):
    """The call was ended with a typed status; nothing above converts it again."""


# Trailers are bounded (gRPC's default header list is 16 KiB, and a client refuses more with
# RESOURCE_EXHAUSTED, losing the typed error): whatever a message or detail echoes of a request is cut
# to this. The message travels twice (status line and rich status).
MAX_STATUS_MESSAGE_CHARS = 1_024
MAX_DETAIL_VALUE_CHARS = 256


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    metadata = {
        bounded_text(k, MAX_DETAIL_VALUE_CHARS): bounded_text(v, MAX_DETAIL_VALUE_CHARS)
        for k, v in error.details.items()
    }
    metadata["retryable"] = "true" if error.retryable else "false"
    info = error_details_pb2.ErrorInfo(reason=error.code, domain=DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    message = bounded_text(str(error), MAX_STATUS_MESSAGE_CHARS)
    status = status_pb2.Status(code=STATUS_OF_CODE[error.code].value[0], message=message, details=[detail])
    try:
        context.abort_with_status(rpc_status.to_status(status))
    except Exception:  # gRPC marks the call aborted, then raises a bare Exception to unwind the handler
        raise Aborted(error.code) from None
    raise AssertionError("abort_with_status returned")  # pragma: no cover


def to_service_error(exc: Exception) -> ServiceError | None:
    """The typed error for a known exception; None for an unexpected one (a bug)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, StateUnavailable):
        return ServiceError("STATE_UNAVAILABLE", str(exc), retryable=True)
    if isinstance(exc, SignerError):
        return ServiceError("SIGNER_UNAVAILABLE", str(exc), retryable=bool(getattr(exc, "retryable", False)))
    if isinstance(exc, MalformedError):
        return ServiceError("INVALID_ARGUMENT", str(exc))
    return None


F = TypeVar("F", bound=Callable[..., Any])


def servicer_edge(method: F) -> F:
    """Wrap a servicer method: typed errors become statuses; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Aborted:
            raise
        except Exception as exc:
            _end_with_status(exc, context, method.__name__)

    return wrapper  # type: ignore[return-value]


def stream_edge(method: F) -> F:
    """:func:`servicer_edge` for a method that answers with a stream (a generator): an error raised
    while streaming ends the stream with its typed status."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from method(self, request, context)
        except Aborted:
            raise
        except Exception as exc:
            _end_with_status(exc, context, method.__name__)

    return wrapper  # type: ignore[return-value]


def _end_with_status(exc: Exception, context: grpc.ServicerContext, method: str) -> NoReturn:
    """End the call with ``exc``'s typed status; an unexpected exception is logged and INTERNAL."""
    if isinstance(exc, grpc.RpcError) and not isinstance(exc, CountersignError):
        raise exc
    error = to_service_error(exc)
    if error is None:
        log.exception("internal error in %s", method)
        error = ServiceError("INTERNAL", "internal error")
    abort(context, error)
