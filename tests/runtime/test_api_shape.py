"""The runtime SDK's shape: exported, no wire type in its API, asyncio twins that mirror the sync ones."""

from __future__ import annotations

import pytest

import countersign.client
from countersign.client import AsyncRuntime, Runtime
from tests.client.test_api_shape import public_callables, test_async_client_mirrors_its_sync_twin, wire_types

pytestmark = pytest.mark.offline

RUNTIME_SDK = ("Runtime", "AsyncRuntime", "Delegation", "HandoffError", "Consumer", "EvidenceVerdict", "OutputEmitter",
               "load_registry", "tls_from_env", "ClosedSession", "ChunkReceipt")  # fmt: skip


def test_the_runtime_sdk_is_exported() -> None:
    assert set(RUNTIME_SDK) <= set(countersign.client.__all__)


def test_no_wire_type_in_the_runtime_sdk() -> None:
    walked = {name: function for name, function in public_callables() if name.split(".")[0] in RUNTIME_SDK}
    assert {"Runtime.accept", "AsyncRuntime.delegate", "Delegation.to_string", "Consumer.path"} <= set(walked)
    assert {name: found for name, function in walked.items() if (found := wire_types(function))} == {}


def test_the_asyncio_runtime_mirrors_the_sync_one() -> None:
    test_async_client_mirrors_its_sync_twin(Runtime, AsyncRuntime)
    assert {"close_session", "stream"} <= set(vars(Runtime)) & set(vars(AsyncRuntime))
