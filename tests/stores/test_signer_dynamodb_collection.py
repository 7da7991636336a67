"""How the signer's DynamoDB state forgets expired items (signer/stores/dynamodb.py, URL ``collect``):
a sweep reads a bounded number of items a call however large the table (a pass costs bounded read
capacity), resumes where it stopped and still reaches every expired item; ``collect=ttl`` leaves them
all to DynamoDB's TTL. Against the DynamoDB emulator (moto): its TTL does not run, which is what lets
the test see the items ``ttl`` leaves behind."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from countersign._daemon.dynamodb import ensure_table, expires_at
from countersign.errors import ConfigError
from countersign.signer_state import COLLECTED_TABLES, StateReads, StateWrite, StoredGrant
from signer.stores import open_signer_state
from signer.stores.dynamodb import DynamoDbState
from tests.stores.conftest import dynamodb_url

pytestmark = pytest.mark.dynamodb_emulator

NOW = 1_000_000
LIVE = 2 * NOW
BUDGET = 1_000  # max(4 * limit, 1000) items read a call, for the limit of 10 below


@pytest.fixture
def table(dynamodb_emulator: str) -> str:
    url = dynamodb_url(dynamodb_emulator, f"cs-signer-collect-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    return url


class ScanCounter:
    """The store's client, adding up the items each Scan read."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.scanned = 0

    def scan(self, **request: Any) -> Any:
        page = self._client.scan(**request)
        self.scanned += int(page["ScannedCount"])
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def put_live_grants(store: DynamoDbState, count: int) -> None:
    """``count`` unexpired grant items, written 25 at a time (faster than one signing write each)."""
    items = [
        {"pk": {"S": f"grant#live-{n:05d}"}, "sk": {"S": "-"}, "parent": {"S": "sha256:p"},
         "child_deployer": {"S": "deployer-b"}, "expires_ms": {"N": str(LIVE)}, "expires_at": {"S": expires_at(LIVE)}}
        for n in range(count)
    ]  # fmt: skip
    for start in range(0, count, 25):
        requests = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        assert not store._client.batch_write_item(RequestItems={store.table: requests}).get("UnprocessedItems")


def test_a_sweep_reads_a_bounded_number_of_items_a_call_and_still_reaches_every_expired_one(table: str) -> None:
    store = open_signer_state(table)
    assert isinstance(store, DynamoDbState)
    put_live_grants(store, 1_500)
    expired = [f"old-{n}" for n in range(3)]
    store.apply([StateWrite(new_grant=StoredGrant(grant, "sha256:p", "deployer-b", NOW)) for grant in expired])
    counter = ScanCounter(store._client)
    store._client = counter
    removed = 0
    for _ in range(3):  # 1,503 items, at most 1,000 read a call: every item is read within two calls
        counter.scanned = 0
        removed += store.collect_expired(NOW + 1, 10)["grants"]
        assert counter.scanned <= BUDGET
    assert removed == len(expired)
    assert all(store.read(StateReads(grant=grant)).grant is None for grant in expired)
    assert store.read(StateReads(grant="live-00000")).grant is not None


def test_collect_ttl_leaves_expired_items_to_dynamodb_and_reads_nothing(table: str) -> None:
    store = open_signer_state(f"{table}&collect=ttl")
    assert isinstance(store, DynamoDbState)
    store.apply([StateWrite(new_grant=StoredGrant("old", "sha256:p", "deployer-b", NOW))])
    counter = ScanCounter(store._client)
    store._client = counter
    assert store.collect_expired(NOW + 1, 10) == dict.fromkeys(COLLECTED_TABLES, 0)
    assert counter.scanned == 0
    assert store.read(StateReads(grant="old")).grant is not None  # still there, for TTL to delete


def test_an_unknown_collect_mode_is_refused(table: str) -> None:
    with pytest.raises(ConfigError, match="collect must be 'scan' or 'ttl'"):
        open_signer_state(f"{table}&collect=never")
