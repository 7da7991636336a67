"""The runtime SDK's shape: exported, no wire type in its API, asyncio twins that mirror the sync ones."""

from __future__ import annotations

import inspect
import typing

import pytest

import countersign.client
from countersign.client import AsyncRuntime, Runtime, averify_path, verify_path
from tests.client.test_api_shape import public_callables, test_async_client_mirrors_its_sync_twin, wire_types

pytestmark = pytest.mark.offline

RUNTIME_SDK = ("Runtime", "AsyncRuntime", "Delegation", "HandoffError", "PathVerdict", "OutputEmitter", "verify_path",
               "averify_path", "verify_offline", "load_registry", "tls_from_env", "ClosedSession",
               "ChunkReceipt")  # fmt: skip


def test_the_runtime_sdk_is_exported() -> None:
    assert set(RUNTIME_SDK) <= set(countersign.client.__all__)


def test_no_wire_type_in_the_runtime_sdk() -> None:
    walked = {name: function for name, function in public_callables() if name.split(".")[0] in RUNTIME_SDK}
    assert {"Runtime.accept", "AsyncRuntime.delegate", "Delegation.to_string", "verify_path"} <= set(walked)
    assert {name: found for name, function in walked.items() if (found := wire_types(function))} == {}


def test_the_asyncio_runtime_mirrors_the_sync_one() -> None:
    test_async_client_mirrors_its_sync_twin(Runtime, AsyncRuntime)
    assert {"close_session", "stream"} <= set(vars(Runtime)) & set(vars(AsyncRuntime))


def test_the_asyncio_check_takes_what_the_sync_one_takes() -> None:
    sync, aio = inspect.signature(verify_path), inspect.signature(averify_path)
    assert list(sync.parameters) == list(aio.parameters)
    assert inspect.iscoroutinefunction(averify_path)
    hints = typing.get_type_hints(verify_path), typing.get_type_hints(averify_path)
    assert hints[0]["return"] is hints[1]["return"]
