"""DynamoDB-specific behaviour, against moto in server mode: an EMULATOR, not AWS.

What these tests show: the requests the store sends (conditional PutItem, TransactGetItems,
TransactWriteItems with condition expressions, Scan) are well formed and have the intended effect
under DynamoDB's documented semantics as moto implements them; the table layout is the one Terraform
creates; throttling, server errors and lost connections become StateUnavailable. What they cannot
show: AWS's own isolation under contention, TTL deletion timing, latency, IAM. See docs/stores.md.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from countersign.errors import StateUnavailable
from countersign.state import ChildEdge, LeafNonce
from tests.stores.conftest import dynamodb_url
from verifier.stores import StoreConfigError, open_store
from verifier.stores.dynamodb import (
    TTL_ATTRIBUTE,
    DynamoDbState,
    ensure_table,
    make_client,
    parse_url,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_TABLE = REPO_ROOT / "infra" / "terraform" / "modules" / "nonce_store" / "main.tf"
RETAIN = 1_700_000_000_123


@pytest.fixture
def emulated_table(dynamodb_emulator: str) -> Iterator[str]:
    url = dynamodb_url(dynamodb_emulator, f"cs-test-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    yield url
    make_client(parse_url(url)).delete_table(TableName=parse_url(url).table)


@pytest.mark.offline
def test_url_parsing() -> None:
    settings = parse_url("dynamodb://countersign-nonces?region=eu-west-1&connect_timeout=1.5&max_attempts=5")
    assert (settings.table, settings.region, settings.endpoint_url) == ("countersign-nonces", "eu-west-1", None)
    assert settings.connect_timeout == 1.5 and settings.max_attempts == 5 and settings.collect == "scan"
    for bad in (
        "dynamodb://t",  # no region
        "dynamodb://?region=x",
        "dynamodb://t?region=x&colour=blue",
        "dynamodb://t?region=x&collect=never",
        "dynamodb://t?region=x&max_attempts=0",
    ):
        with pytest.raises(StoreConfigError):
            parse_url(bad)


@pytest.mark.dynamodb_emulator
def test_table_layout_matches_terraform_dynamodb_emulator(emulated_table: str) -> None:
    terraform = TERRAFORM_TABLE.read_text()
    assert re.search(r'hash_key\s*=\s*"pk"', terraform)
    assert re.search(r'range_key\s*=\s*"sk"', terraform)
    ttl_block = re.search(r"ttl\s*\{[^}]*\}", terraform)
    assert ttl_block is not None and f'attribute_name = "{TTL_ATTRIBUTE}"' in ttl_block.group(0)
    for attribute in ("pk", "sk"):
        assert re.search(rf'name\s*=\s*"{attribute}"\s*\n\s*type\s*=\s*"S"', terraform), attribute

    settings = parse_url(emulated_table)
    client = make_client(settings)
    table = client.describe_table(TableName=settings.table)["Table"]
    assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {"pk": "HASH", "sk": "RANGE"}
    ttl = client.describe_time_to_live(TableName=settings.table)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED" and ttl["AttributeName"] == TTL_ATTRIBUTE
    ensure_table(emulated_table)  # idempotent


@pytest.mark.dynamodb_emulator
def test_items_carry_ttl_in_epoch_seconds_dynamodb_emulator(emulated_table: str) -> None:
    store = DynamoDbState(emulated_table)
    edge = ChildEdge("sha256:p", "c", 3, RETAIN + 5_000, 1)
    assert store.admit([edge], LeafNonce("n", RETAIN, 1), consume=True, now_ms=0) is None
    client = make_client(parse_url(emulated_table))
    items = client.scan(TableName=store.table, ConsistentRead=True)["Items"]
    by_key = {(i["pk"]["S"], i["sk"]["S"]): i for i in items}
    assert set(by_key) == {
        ("nonce#n", "nonce"), ("parent#sha256:p", "count"), ("parent#sha256:p", "child#c"),
        ("schema#verdict-log", "version"),  # the verdict log's layout, written when the store opened
    }  # fmt: skip
    # Seconds, rounded UP: DynamoDB's TTL may delete an item only after its retention ended.
    assert by_key["nonce#n", "nonce"][TTL_ATTRIBUTE] == {"N": "1700000001"}
    assert by_key["parent#sha256:p", "child#c"][TTL_ATTRIBUTE] == {"N": "1700000006"}
    assert by_key["parent#sha256:p", "count"]["n"] == {"N": "1"}


@pytest.mark.dynamodb_emulator
def test_concurrent_admits_dynamodb_emulator(emulated_table: str) -> None:
    """Threads with their own clients: one nonce accepted once; one parent's children stop at the limit."""
    stores = [DynamoDbState(emulated_table) for _ in range(12)]
    barrier = threading.Barrier(len(stores))

    def admit(i: int, same_nonce: bool) -> str:
        edge = ChildEdge("sha256:parent", "leaf" if same_nonce else f"kid{i}", 4, RETAIN, 1)
        nonce = LeafNonce("the-nonce" if same_nonce else f"n{i}", RETAIN, 1)
        barrier.wait()
        result = stores[i].admit([edge], nonce, consume=True, now_ms=0)
        return "accept" if result is None else f"{result.reason.value}@{result.index}"

    with ThreadPoolExecutor(len(stores)) as pool:
        same = list(pool.map(lambda i: admit(i, True), range(len(stores))))
        kids = list(pool.map(lambda i: admit(i, False), range(len(stores))))
    assert Counter(same) == {"accept": 1, "NONCE_REPLAYED@1": 11}, same
    # "leaf" took one of the 4 places: 3 of the 12 distinct children get in.
    assert Counter(kids) == {"accept": 3, "FANOUT_EXCEEDED@1": 9}, kids
    assert stores[0].entry_count() == (1 + 3) + (1 + 3)


@pytest.mark.dynamodb_emulator
def test_missing_or_misshapen_table_is_unavailable_dynamodb_emulator(dynamodb_emulator: str) -> None:
    missing = dynamodb_url(dynamodb_emulator, f"cs-missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(StateUnavailable, match="ResourceNotFoundException"):
        open_store(missing)
    wrong = dynamodb_url(dynamodb_emulator, f"cs-wrong-{uuid.uuid4().hex[:8]}")
    settings = parse_url(wrong)
    client = make_client(settings)
    client.create_table(
        TableName=settings.table,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    try:
        with pytest.raises(StateUnavailable, match="hash key pk"):
            open_store(wrong)
    finally:
        client.delete_table(TableName=settings.table)


@pytest.mark.dynamodb_emulator
def test_ttl_only_collection_mode_dynamodb_emulator(emulated_table: str) -> None:
    store = DynamoDbState(emulated_table + "&collect=ttl")
    assert store.admit([], LeafNonce("n", 1_000, 0), consume=True, now_ms=0) is None
    assert store.collect_expired(10**9) == 0  # left to DynamoDB's TTL, which moto does not run
    assert store.entry_count() == 1


class _Answer:
    """What the fake endpoint answers to everything but opening a store (DescribeTable, and the
    GetItem that finds the verdict log's layout current)."""

    status = 400
    error_type = "com.amazonaws.dynamodb.v20120810#ThrottlingException"
    calls: Counter[str] = Counter()  # noqa: RUF012 - shared by the handler class on purpose


class _FakeDynamoDb(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        target = self.headers.get("X-Amz-Target", "").split(".")[-1]
        _Answer.calls[target] += 1
        if target == "GetItem" and request.get("Key", {}).get("pk") == {"S": "schema#verdict-log"}:
            body: dict[str, Any] = {"Item": {**request["Key"], "v": {"N": "2"}}}
            status = 200
        elif target == "DescribeTable":
            body = {
                "Table": {
                    "TableName": "t",
                    "TableStatus": "ACTIVE",
                    "KeySchema": [
                        {"AttributeName": "pk", "KeyType": "HASH"},
                        {"AttributeName": "sk", "KeyType": "RANGE"},
                    ],
                    "AttributeDefinitions": [
                        {"AttributeName": "pk", "AttributeType": "S"},
                        {"AttributeName": "sk", "AttributeType": "S"},
                    ],
                }
            }
            status = 200
        else:
            body = {"__type": _Answer.error_type, "message": "injected by the test endpoint"}
            status = _Answer.status
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def failing_endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeDynamoDb)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Answer.calls.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.daemons  # a fake DynamoDB on loopback
@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (400, "com.amazonaws.dynamodb.v20120810#ThrottlingException", "ThrottlingException"),
        (400, "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException", "ProvisionedThroughput"),
        (500, "com.amazonaws.dynamodb.v20120810#InternalServerError", "InternalServerError"),
        (503, "com.amazonaws.dynamodb.v20120810#ServiceUnavailable", "ServiceUnavailable"),
    ],
)
def test_throttling_and_server_errors_become_state_unavailable(
    failing_endpoint: str, status: int, error_type: str, code: str
) -> None:
    """A real HTTP endpoint answering like DynamoDB under throttling or failure (botocore parses the
    responses and retries them as it would against AWS), for consume, fan-out, collection and count."""
    _Answer.status, _Answer.error_type = status, error_type
    store = DynamoDbState(f"dynamodb://t?region=us-east-1&endpoint_url={failing_endpoint}&max_attempts=2")
    with pytest.raises(StateUnavailable, match=code):
        store.admit([], LeafNonce("n", RETAIN, 0), consume=True, now_ms=0)
    with pytest.raises(StateUnavailable, match=code):
        store.admit([ChildEdge("p", "c", 1, RETAIN, 1)], LeafNonce("n", RETAIN, 1), consume=True, now_ms=0)
    with pytest.raises(StateUnavailable, match=code):
        store.collect_expired(RETAIN)
    with pytest.raises(StateUnavailable, match=code):
        store.entry_count()
    assert _Answer.calls["PutItem"] == 2  # botocore retried once (max_attempts=2), then gave up


@pytest.mark.daemons  # connects to a closed loopback port
def test_unreachable_endpoint_is_unavailable() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"dynamodb://t?region=us-east-1&endpoint_url=http://127.0.0.1:{sock.getsockname()[1]}&max_attempts=1"
        with pytest.raises(StateUnavailable, match="describe table"):
            DynamoDbState(url)
