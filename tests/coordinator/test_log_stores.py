"""The registry log stores coordinator replicas share (SQLite, PostgreSQL, the DynamoDB emulator): a
sequence is taken once, the checkpoint is replaced only by one that is not older, and a statement with
its checkpoint is stored whole or not at all."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coordinator.log_stores import open_log_store
from coordinator.store import LogConflict, LogStore, StoredCheckpoint
from tests.stores.conftest import PostgresSchemas, dynamodb_url

BACKENDS = [
    pytest.param("sqlite", id="sqlite", marks=pytest.mark.offline),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
    pytest.param("dynamodb_emulator", id="dynamodb_emulator", marks=pytest.mark.dynamodb_emulator),
]


@pytest.fixture(params=BACKENDS)
def open_handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], LogStore]]:
    """Opens another handle on one fresh log store of the parameter's backend."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'registry.db'}"
    elif request.param == "postgresql":
        schemas: PostgresSchemas = request.getfixturevalue("pg_schemas")
        url = schemas.url(schemas.new())
    else:
        from countersign._daemon.dynamodb import ensure_table

        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(name, "testing")
        url = dynamodb_url(request.getfixturevalue("dynamodb_emulator"), f"cs-log-{uuid.uuid4().hex[:12]}")
        ensure_table(url)
    handles: list[LogStore] = []

    def handle() -> LogStore:
        handles.append(store := open_log_store(url))
        return store

    yield handle
    for store in handles:
        store.close()


def checkpoint(sequence: int, issued_ms: int) -> StoredCheckpoint:
    return StoredCheckpoint(f"checkpoint {sequence} {issued_ms}".encode(), sequence, issued_ms)


def test_a_sequence_is_taken_once_and_read_in_order(open_handle: Callable[[], LogStore]) -> None:
    store, other = open_handle(), open_handle()
    store.append(0, "sha256:a", b"statement 0")
    with pytest.raises(LogConflict):
        other.append(0, "sha256:b", b"another statement 0")
    other.append(1, "sha256:c", b"statement 1", checkpoint(2, 100))
    assert store.load() == [b"statement 0", b"statement 1"]
    assert store.load(1) == [b"statement 1"]
    assert store.load(2) == []
    assert store.load_checkpoint() == checkpoint(2, 100).data


def test_the_checkpoint_is_only_replaced_by_one_not_older(open_handle: Callable[[], LogStore]) -> None:
    store, other = open_handle(), open_handle()
    assert store.load_checkpoint() is None
    assert store.store_checkpoint(checkpoint(3, 100))
    assert not other.store_checkpoint(checkpoint(2, 200)), "names a shorter log"
    assert not other.store_checkpoint(checkpoint(3, 99)), "issued earlier"
    assert other.store_checkpoint(checkpoint(3, 100)), "the same again"
    assert other.store_checkpoint(checkpoint(4, 150))
    assert store.load_checkpoint() == checkpoint(4, 150).data
    # A statement whose checkpoint is older than the stored one is not stored either (one transaction).
    with pytest.raises(LogConflict):
        store.append(0, "sha256:a", b"statement 0", checkpoint(1, 120))
    assert store.load() == []


def test_racing_appends_fork_nothing(open_handle: Callable[[], LogStore]) -> None:
    handles = [open_handle() for _ in range(6)]
    barrier = threading.Barrier(len(handles))

    def append(index: int) -> bool:
        barrier.wait()
        try:
            handles[index].append(0, f"sha256:{index}", b"statement from %d" % index)
        except LogConflict:
            return False
        return True

    with ThreadPoolExecutor(len(handles)) as pool:
        outcomes = list(pool.map(append, range(len(handles))))
    assert outcomes.count(True) == 1
    assert handles[0].load() == [b"statement from %d" % outcomes.index(True)]
