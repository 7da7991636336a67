"""What a logged verdict costs the store (issue 29): a depth-5 verdict on a path its client logged
before adds at most 1 KiB, measured on the store itself (SQLite: the file; PostgreSQL: every
relation of the schema, indexes included; DynamoDB emulator: the items by AWS's size rule).
Before issue 29 the same verdict cost 7,287 / 6,275 / 4,435 bytes. ``python -m bench --only
verdict_log`` prints the table for larger runs (docs/benchmarks.md)."""

from __future__ import annotations

from typing import cast

import pytest

from bench.verdict_log import bytes_per_verdict, dynamodb_bytes, postgres_bytes, sqlite_bytes
from countersign.state import VerifierStore
from tests.stores.conftest import BACKENDS, PostgresHarness, SqliteHarness, StoreHarness

TARGET_BYTES = 1_024
VERDICTS = {"sqlite": 2_000, "postgresql": 2_000, "dynamodb_emulator": 300}


ON_DISK = [backend for backend in BACKENDS if backend.id != "memory"]


@pytest.mark.slow
@pytest.mark.parametrize("harness", ON_DISK, indirect=True)
def test_a_verdict_on_a_path_seen_before_costs_at_most_a_kibibyte(harness: StoreHarness) -> None:
    store = cast(VerifierStore, harness.open())
    if isinstance(harness, SqliteHarness):
        held = sqlite_bytes(harness.path)
    elif isinstance(harness, PostgresHarness):
        held = postgres_bytes(harness.schemas.base_url, harness.schema)
    else:
        held = dynamodb_bytes()
    per_verdict = bytes_per_verdict(store, held, VERDICTS[harness.name], fresh_leaf=False)
    print(f"{harness.name}: {per_verdict:,.0f} bytes per verdict of a depth-5 path seen before")
    assert 0 < per_verdict <= TARGET_BYTES
