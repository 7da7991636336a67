"""Typed errors across gRPC: a status code plus ``google.rpc.ErrorInfo`` naming the reason.

Domain exceptions become statuses only here, at the servicer edge; clients turn them back into
:class:`ServiceError` with :func:`from_rpc_error`. An unexpected exception is a bug: it is logged with
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

from countersign.client.errors import DOMAIN, ServiceError
from countersign.cosigning import Refusal
from countersign.errors import CountersignError, ErrorCode, MalformedError, SignerError, StateUnavailable

log = logging.getLogger("countersign.service")

_REFUSED = (grpc.StatusCode.FAILED_PRECONDITION, False)
# The gRPC status (and whether to retry) of each code a signer refuses with (docs/api.md "Errors").
# A refusal whose code is missing here is a bug: KeyError, answered INTERNAL by the edge below.
STATUS_OF_CODE: Final[Mapping[ErrorCode, tuple[grpc.StatusCode, bool]]] = {
    ErrorCode.INVALID_ARGUMENT: (grpc.StatusCode.INVALID_ARGUMENT, False),
    ErrorCode.NOT_AUTHORISED: (grpc.StatusCode.PERMISSION_DENIED, False),
    ErrorCode.REGISTRY_STALE: (grpc.StatusCode.UNAVAILABLE, True),
    ErrorCode.PARENT_UNREACHABLE: (grpc.StatusCode.UNAVAILABLE, True),
    ErrorCode.CANCELLED: (grpc.StatusCode.CANCELLED, False),
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
    ErrorCode.SESSION_CLOSED: _REFUSED,
    ErrorCode.STATE_CONFLICT: (grpc.StatusCode.ABORTED, True),
    ErrorCode.RESOURCE_EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED, False),  # a stream's own bounds
}


def refusal_error(refusal: Refusal, details: Mapping[str, str] | None = None) -> ServiceError:
    """The typed error that ends a call with ``refusal``, its status from :data:`STATUS_OF_CODE`."""
    status, retryable = STATUS_OF_CODE[refusal.code]
    return ServiceError(refusal.code, refusal.message, status, retryable=retryable, details=details)


class Aborted(Exception):
    """The call was ended with a typed status; nothing above converts it again."""


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    metadata = {**error.details, "retryable": "true" if error.retryable else "false"}
    info = error_details_pb2.ErrorInfo(reason=error.code, domain=DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=error.status.value[0], message=str(error), details=[detail])
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
        return ServiceError("STATE_UNAVAILABLE", str(exc), grpc.StatusCode.UNAVAILABLE, retryable=True)
    if isinstance(exc, SignerError):
        retryable = bool(getattr(exc, "retryable", False))
        status = grpc.StatusCode.UNAVAILABLE if retryable else grpc.StatusCode.FAILED_PRECONDITION
        return ServiceError("SIGNER_UNAVAILABLE", str(exc), status, retryable=retryable)
    if isinstance(exc, MalformedError):
        return ServiceError("INVALID_ARGUMENT", str(exc), grpc.StatusCode.INVALID_ARGUMENT)
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
        error = ServiceError("INTERNAL", "internal error", grpc.StatusCode.INTERNAL)
    abort(context, error)
