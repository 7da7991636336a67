"""The public client package's shape: what it exports, that no protobuf or gRPC type crosses its API,
and that each asyncio client mirrors its sync twin."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf import message

import countersign.client
from countersign._proto.v1 import signer_pb2
from countersign.client import EvidenceVerdict, Grant
from countersign.reasons import Reason, Verdict, VerificationResult
from countersign.records import Path

pytestmark = pytest.mark.offline

# Modules whose types an application must never meet in the client API.
WIRE_MODULES = ("grpc", "grpc_status", "google.protobuf", "google.rpc", "google._upb", "countersign._proto")
# ServiceError is a code and a message (ADR 0034): no gRPC status crosses it, not even its constructor.
BUILT_BY_SERVERS: set[str] = set()
TWINS = [
    (countersign.client.SignerClient, countersign.client.AsyncSignerClient),
    (countersign.client.VerifierClient, countersign.client.AsyncVerifierClient),
    (countersign.client.OperatorClient, countersign.client.AsyncOperatorClient),
]


def named_types(annotation: object) -> Iterator[object]:
    """Every class an annotation names, through unions, generics and callables."""
    yield annotation
    for argument in typing.get_args(annotation):
        if isinstance(argument, list):  # Callable[[A, B], C]
            for item in argument:
                yield from named_types(item)
        else:
            yield from named_types(argument)


def is_wire_type(named: object) -> bool:
    # Generated messages report the proto package as their module (countersign.v1.signer_pb2), so
    # they are recognised by their base class; gRPC's and the stubs' types by their module.
    if isinstance(named, type) and issubclass(named, message.Message):
        return True
    module = getattr(named, "__module__", "") or ""
    return module == "grpc" or module.startswith(tuple(f"{m}." for m in WIRE_MODULES))


def wire_types(function: Callable[..., object]) -> list[str]:
    """The annotations of ``function`` that name a protobuf or gRPC type."""
    return [
        f"{name}: {named!r}"
        for name, annotation in typing.get_type_hints(function).items()
        for named in named_types(annotation)
        if is_wire_type(named)
    ]


def public_callables() -> Iterator[tuple[str, Callable[..., object]]]:
    """Every public function of the package, every public method (and constructor, context manager
    and property) of its public classes, defined in Countersign's own code."""
    for export in countersign.client.__all__:
        value = getattr(countersign.client, export)
        if isinstance(value, types.FunctionType):
            yield export, value
            continue
        if not inspect.isclass(value):
            continue
        for name, member in inspect.getmembers(value):
            if name.startswith("_") and name not in ("__init__", "__enter__", "__aenter__", "__call__"):
                continue
            function = member.fget if isinstance(member, property) else member
            if inspect.isfunction(function) and function.__module__.startswith("countersign"):
                yield f"{export}.{name}", function


def public_fields() -> Iterator[tuple[str, object]]:
    for export in countersign.client.__all__:
        value = getattr(countersign.client, export)
        if dataclasses.is_dataclass(value) and isinstance(value, type):
            for name, annotation in typing.get_type_hints(value).items():
                yield f"{export}.{name}", annotation


def test_exports_are_explicit_and_present() -> None:
    assert len(set(countersign.client.__all__)) == len(countersign.client.__all__)
    missing = [name for name in countersign.client.__all__ if not hasattr(countersign.client, name)]
    assert missing == []
    for needed in ("SignerClient", "AsyncVerifierClient", "TlsConfig", "ServiceError", "ErrorCode", "Grant",
                   "EvidenceVerdict", "RetryPolicy", "verify_with_failover", "delegate_with_retry"):  # fmt: skip
        assert needed in countersign.client.__all__
    assert countersign.client.ErrorCode is countersign.errors.ErrorCode


def test_the_walk_sees_the_api() -> None:
    walked = dict(public_callables())
    expected = {
        "SignerClient.open_grant", "SignerClient.accept", "AsyncSignerClient.accept", "VerifierClient.verify",
        "AsyncOperatorClient.submit", "EvidenceVerdict.reason", "verify_with_failover", "TlsConfig.material",
    }  # fmt: skip
    assert expected <= set(walked)


def test_no_protobuf_or_grpc_type_in_the_public_api() -> None:
    leaks = {name: found for name, function in public_callables() if (found := wire_types(function))}
    assert set(leaks) == BUILT_BY_SERVERS, leaks
    fields = [f"{name}: {annotation!r}" for name, annotation in public_fields()
              if any(is_wire_type(named) for named in named_types(annotation))]  # fmt: skip
    assert fields == []


def test_the_check_catches_a_protobuf_annotation() -> None:
    def leaky(grant: Grant) -> signer_pb2.OpenGrantResponse:
        raise NotImplementedError

    def also_leaky(grants: list[signer_pb2.OpenGrantResponse] | None) -> None:
        raise NotImplementedError

    def channel_leak(channel: grpc.aio.Channel, status: grpc.StatusCode) -> None:
        raise NotImplementedError

    def clean(grant: Grant, path: Path | bytes) -> EvidenceVerdict | None:
        raise NotImplementedError

    assert [found.split(":")[0] for found in wire_types(leaky)] == ["return"]
    assert [found.split(":")[0] for found in wire_types(also_leaky)] == ["grants"]
    assert [found.split(":")[0] for found in wire_types(channel_leak)] == ["channel", "status"]
    assert wire_types(clean) == []


@pytest.mark.parametrize(("sync", "aio"), TWINS, ids=lambda c: c.__name__)
def test_async_client_mirrors_its_sync_twin(sync: type, aio: type) -> None:
    def methods(cls: type) -> dict[str, Callable[..., object]]:
        return {
            name: member for name, member in vars(cls).items()
            if inspect.isfunction(member) and not name.startswith("_")
        }  # fmt: skip

    sync_methods, aio_methods = methods(sync), methods(aio)
    assert set(sync_methods) == set(aio_methods)
    for name, aio_method in aio_methods.items():
        assert inspect.iscoroutinefunction(aio_method), f"{aio.__name__}.{name} is not a coroutine"
        sync_signature, aio_signature = inspect.signature(sync_methods[name]), inspect.signature(aio_method)
        assert list(aio_signature.parameters) == list(sync_signature.parameters), name
        for parameter in aio_signature.parameters.values():
            assert parameter.default == sync_signature.parameters[parameter.name].default, f"{name}({parameter.name})"
        hints = typing.get_type_hints(aio_method), typing.get_type_hints(sync_methods[name])
        assert hints[0] == hints[1], name
    assert all(inspect.iscoroutinefunction(getattr(aio, name)) for name in ("__aenter__", "__aexit__", "close"))
    assert all(inspect.isfunction(getattr(sync, name)) for name in ("__enter__", "__exit__", "close"))


def test_verdict_is_truthy_exactly_on_accept() -> None:
    accepted = EvidenceVerdict(VerificationResult.accept(), 3)
    replayed = EvidenceVerdict(VerificationResult(Verdict.REJECT, Reason.NONCE_REPLAYED, 1), 3)
    assert accepted and accepted.reason is None
    assert not replayed and replayed.reason is Reason.NONCE_REPLAYED
    with pytest.raises(dataclasses.FrozenInstanceError):
        replayed.registry_sequence = 4  # type: ignore[misc]
