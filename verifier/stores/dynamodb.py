"""DynamoDB verifier state: one table shared by verifier replicas in any availability zone.

URL: ``dynamodb://TABLE?region=REGION[&endpoint_url=http://HOST:PORT][&PARAMS]``. Credentials come
from boto3's default chain (task role, environment, profile). ``endpoint_url`` is the only thing that
differs between AWS and an emulator; every request goes through the same code. Other parameters:

* ``connect_timeout`` / ``read_timeout``: seconds per HTTP attempt (default 2 / 5);
* ``max_attempts``: botocore attempts per call, standard retry mode (default 3);
* ``collect``: ``scan`` (default) makes :meth:`DynamoDbState.collect_expired` delete expired items
  found by a bounded, resumable consistent Scan (needs ``dynamodb:Scan``); ``ttl`` makes it a no-op
  that returns 0 and leaves expiry to DynamoDB's native TTL alone.

Table (created by Terraform in production, by :func:`ensure_table` in tests): hash key ``pk`` (S),
range key ``sk`` (S), TTL on ``expires_at`` (epoch seconds). Items:

============================  ==========  =================================================
pk                            sk          attributes
============================  ==========  =================================================
``nonce#<nonce>``             ``nonce``   ``retain_until_ms``, ``expires_at``
``parent#<parent digest>``    ``count``   ``n`` (children recorded), ``retain_until_ms``, ``expires_at``
``parent#<parent digest>``    ``child#<child nonce>``  ``retain_until_ms``, ``expires_at``
============================  ==========  =================================================

Atomicity: a consume is a PutItem conditioned on ``attribute_not_exists(pk)``, alone when the path
has no edge, inside the same TransactWriteItems as the new children otherwise; DynamoDB applies a
conditional write to one item serially, so exactly one consumer succeeds. A new child is a Put of its
item (``attribute_not_exists``) plus ``ADD n :k`` on the parent's counter item conditioned on
``n < :max`` in one transaction: the counter can never pass ``max_children``, and a child item
already present is a known child (it passes without touching the counter).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from countersign.errors import StateUnavailable
from countersign.reasons import Reason
from countersign.state import ChildEdge, LeafNonce, StateRejection

NONCE_SK = "nonce"
COUNT_SK = "count"
CHILD_SK_PREFIX = "child#"
NONCE_PK_PREFIX = "nonce#"
PARENT_PK_PREFIX = "parent#"
TTL_ATTRIBUTE = "expires_at"
TRANSACT_LIMIT = 100  # items per TransactWriteItems / TransactGetItems
_ATTEMPTS = 8  # optimistic rounds of an admit under contention before giving up (StateUnavailable)
_OWN_PARAMS = frozenset({"region", "endpoint_url", "connect_timeout", "read_timeout", "max_attempts", "collect"})


@dataclass(frozen=True, slots=True)
class DynamoDbSettings:
    table: str
    region: str
    endpoint_url: str | None = None
    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    max_attempts: int = 3
    collect: str = "scan"


def parse_url(url: str) -> DynamoDbSettings:
    from verifier.stores import StoreConfigError

    parts = urlsplit(url)
    table = parts.netloc
    if parts.scheme != "dynamodb" or not table or parts.path not in ("", "/"):
        raise StoreConfigError(f"DynamoDB URL must look like dynamodb://TABLE?region=REGION, got {url!r}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _OWN_PARAMS)
    if unknown:
        raise StoreConfigError(f"unknown DynamoDB URL parameters {unknown} in {url!r}")
    region = query.get("region")
    if not region:
        raise StoreConfigError(f"DynamoDB URL needs ?region=REGION: {url!r}")
    collect = query.get("collect", "scan")
    if collect not in ("scan", "ttl"):
        raise StoreConfigError(f"DynamoDB URL parameter collect must be 'scan' or 'ttl', got {collect!r}")
    try:
        settings = DynamoDbSettings(
            table=table,
            region=region,
            endpoint_url=query.get("endpoint_url") or None,
            connect_timeout=float(query.get("connect_timeout", "2")),
            read_timeout=float(query.get("read_timeout", "5")),
            max_attempts=int(query.get("max_attempts", "3")),
            collect=collect,
        )
    except ValueError as exc:
        raise StoreConfigError(f"invalid number in DynamoDB URL {url!r}: {exc}") from exc
    if settings.connect_timeout <= 0 or settings.read_timeout <= 0 or settings.max_attempts < 1:
        raise StoreConfigError(f"DynamoDB URL timeouts must be positive and max_attempts >= 1: {url!r}")
    return settings


def make_client(settings: DynamoDbSettings) -> Any:
    """The boto3 DynamoDB client a store uses (bounded timeouts, standard retries)."""
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        retries={"mode": "standard", "total_max_attempts": settings.max_attempts},
    )
    return boto3.session.Session().client("dynamodb", endpoint_url=settings.endpoint_url, config=config)


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error.get('Code', '?')} (HTTP {status}): {error.get('Message', '')}"
    return f"{type(exc).__name__}: {exc}"


def ensure_table(url: str, *, wait_s: float = 60.0) -> None:
    """Create the table a store URL names, as Terraform does in production (hash key ``pk`` S,
    range key ``sk`` S, on-demand, TTL on ``expires_at``); no-op if it exists. For tests and local runs."""
    settings = parse_url(url)
    client = make_client(settings)
    try:
        try:
            client.create_table(
                TableName=settings.table,
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise
        client.get_waiter("table_exists").wait(
            TableName=settings.table, WaiterConfig={"Delay": 1, "MaxAttempts": max(1, int(wait_s))}
        )
        ttl = client.describe_time_to_live(TableName=settings.table)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            client.update_time_to_live(
                TableName=settings.table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
    except (ClientError, BotoCoreError) as exc:
        raise StateUnavailable(f"DynamoDB table {settings.table}: cannot create: {_error_text(exc)}") from exc


def _expires_at(retain_until_ms: int) -> str:
    """TTL value: epoch seconds, rounded up, so DynamoDB never deletes an entry before its retention."""
    return str(max(0, math.ceil(retain_until_ms / 1000)))


def _nonce_key(nonce: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": NONCE_PK_PREFIX + nonce}, "sk": {"S": NONCE_SK}}


def _child_key(parent: str, child: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": CHILD_SK_PREFIX + child}}


def _count_key(parent: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": COUNT_SK}}


class _Contended(Exception):
    """A transaction was cancelled (a condition raced with another writer, or a conflict): re-read."""


class DynamoDbState:
    """:class:`countersign.state.VerifierState` in one DynamoDB table."""

    def __init__(self, url: str, *, client: Any | None = None) -> None:
        self.settings = parse_url(url)
        self.table = self.settings.table
        self._client = client if client is not None else make_client(self.settings)
        self._scan_cursor: dict[str, Any] | None = None
        self._check_table()

    @contextmanager
    def _calls(self, what: str) -> Iterator[None]:
        try:
            yield
        except ClientError as exc:
            raise StateUnavailable(f"DynamoDB table {self.table} ({what}): {_error_text(exc)}") from exc
        except BotoCoreError as exc:
            raise StateUnavailable(f"DynamoDB table {self.table} ({what}): {_error_text(exc)}") from exc

    def _check_table(self) -> None:
        with self._calls("describe table"):
            table = self._client.describe_table(TableName=self.table)["Table"]
        keys = {k["AttributeName"]: k["KeyType"] for k in table.get("KeySchema", [])}
        types = {a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", [])}
        if keys != {"pk": "HASH", "sk": "RANGE"} or types.get("pk") != "S" or types.get("sk") != "S":
            raise StateUnavailable(
                f"DynamoDB table {self.table} must have hash key pk (S) and range key sk (S); has {keys} {types}"
            )

    # -- admit ---------------------------------------------------------------------------------

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | None:
        if not edges:
            if not consume:
                return None
            return self._consume_alone(leaf)
        with self._calls("admit"):
            for attempt in range(_ATTEMPTS):
                try:
                    return self._admit_round(edges, leaf, consume)
                except _Contended:
                    if attempt + 1 < _ATTEMPTS:
                        time.sleep(min(0.2, 0.005 * 2**attempt))
        raise StateUnavailable(
            f"DynamoDB table {self.table} (admit): still contended after {_ATTEMPTS} optimistic attempts"
        )

    def _consume_alone(self, leaf: LeafNonce) -> StateRejection | None:
        with self._calls("consume"):
            try:
                self._client.put_item(**self._nonce_put(leaf))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                    return StateRejection(Reason.NONCE_REPLAYED, leaf.index)
                raise
        return None

    def _nonce_put(self, leaf: LeafNonce) -> dict[str, Any]:
        put: dict[str, Any] = {
            "TableName": self.table,
            "Item": {
                **_nonce_key(leaf.nonce),
                "retain_until_ms": {"N": str(leaf.retain_until_ms)},
                TTL_ATTRIBUTE: {"N": _expires_at(leaf.retain_until_ms)},
            },
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        if leaf.request_id:
            # The same request retried rewrites its own item; anything else is a replay.
            put["Item"]["request_id"] = {"S": leaf.request_id}
            put["ConditionExpression"] = "attribute_not_exists(pk) OR request_id = :rid"
            put["ExpressionAttributeValues"] = {":rid": {"S": leaf.request_id}}
        return put

    def _read(self, keys: list[dict[str, dict[str, str]]]) -> list[Mapping[str, Any] | None]:
        """Strongly consistent, serialisable read (TransactGetItems) of ``keys``, in order (a key
        asked twice is read once: DynamoDB refuses two operations on one item in a transaction)."""
        unique = list({(k["pk"]["S"], k["sk"]["S"]): k for k in keys}.values())
        found: list[Mapping[str, Any] | None] = []
        for start in range(0, len(unique), TRANSACT_LIMIT):
            chunk = unique[start : start + TRANSACT_LIMIT]
            try:
                answer = self._client.transact_get_items(
                    TransactItems=[{"Get": {"TableName": self.table, "Key": key}} for key in chunk]
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                    raise _Contended from exc
                raise
            found.extend(response.get("Item") for response in answer["Responses"])
        by_key = {(k["pk"]["S"], k["sk"]["S"]): item for k, item in zip(unique, found, strict=True)}
        return [by_key[k["pk"]["S"], k["sk"]["S"]] for k in keys]

    def _admit_round(self, edges: Sequence[ChildEdge], leaf: LeafNonce, consume: bool) -> StateRejection | None:
        # One TransactGetItems, i.e. one snapshot, for paths of up to 49 edges; a longer path is read
        # in several (the writes below stay conditional, so a stale read can only cost a retry).
        keys: list[dict[str, dict[str, str]]] = []
        for edge in edges:
            keys.append(_child_key(edge.parent_digest, edge.child_nonce))
            keys.append(_count_key(edge.parent_digest))
        if consume:
            keys.append(_nonce_key(leaf.nonce))
        items = self._read(keys)
        known: list[bool] = []
        for position, edge in enumerate(edges):
            child, counter = items[2 * position], items[2 * position + 1]
            held = int(counter["n"]["N"]) if counter is not None and "n" in counter else 0
            if child is None and held >= edge.max_children:
                return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            known.append(child is not None)
        if not consume:
            return None
        consumed = items[-1]
        replayed = consumed is not None and not (
            leaf.request_id and consumed.get("request_id", {}).get("S") == leaf.request_id
        )

        writes: list[dict[str, Any]] = []
        new_per_parent: dict[str, list[ChildEdge]] = {}
        seen: set[tuple[str, str]] = set()
        for edge, is_known in zip(edges, known, strict=True):
            key = (edge.parent_digest, edge.child_nonce)
            if is_known or key in seen:
                continue
            seen.add(key)
            new_per_parent.setdefault(edge.parent_digest, []).append(edge)
            writes.append(
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": {
                            **_child_key(edge.parent_digest, edge.child_nonce),
                            "retain_until_ms": {"N": str(edge.retain_until_ms)},
                            TTL_ATTRIBUTE: {"N": _expires_at(edge.retain_until_ms)},
                        },
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                }
            )
        for parent, new in new_per_parent.items():
            retain = max(e.retain_until_ms for e in new)
            writes.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": _count_key(parent),
                        # The checks above ran against the state before this path (as the reference
                        # does), so the condition is on the count before these k children join.
                        "UpdateExpression": "ADD n :k SET retain_until_ms = :r, #ttl = :ttl",
                        "ConditionExpression": "attribute_not_exists(n) OR n < :max",
                        "ExpressionAttributeNames": {"#ttl": TTL_ATTRIBUTE},
                        "ExpressionAttributeValues": {
                            ":k": {"N": str(len(new))},
                            ":max": {"N": str(min(e.max_children for e in new))},
                            ":r": {"N": str(retain)},
                            ":ttl": {"N": _expires_at(retain)},
                        },
                    }
                }
            )
        if not replayed:
            writes.append({"Put": self._nonce_put(leaf)})
        if writes:
            self._write(writes)
        return StateRejection(Reason.NONCE_REPLAYED, leaf.index) if replayed else None

    def _write(self, writes: list[dict[str, Any]]) -> None:
        """One TransactWriteItems; a path with more than ~50 NEW children needs several, committed in
        order with the nonce in the last one (each still conditional, so no limit can be passed)."""
        for start in range(0, len(writes), TRANSACT_LIMIT):
            try:
                self._client.transact_write_items(TransactItems=writes[start : start + TRANSACT_LIMIT])
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                    raise _Contended from exc
                raise

    # -- collection ----------------------------------------------------------------------------

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Delete at most ``limit`` entries whose retention ended before ``now_ms``; return how many.

        With ``collect=ttl`` this does nothing and returns 0: DynamoDB's TTL deletes items some time
        (typically within days) after ``expires_at``; expired items still present are harmless, since
        a path through an expired record is rejected before the store is consulted.

        With ``collect=scan`` (default) it walks the table with a consistent, paginated Scan that
        resumes where the previous call stopped, reads at most ``max(4 * limit, 1000)`` items per call
        and deletes what it finds expired: nonce items with a conditional DeleteItem, child items
        together with the decrement of their parent's counter in one transaction (so the counter
        stays equal to the children held). Counter items left at zero are removed too (not counted:
        they are not entries).
        """
        if self.settings.collect == "ttl" or limit <= 0:
            return 0
        budget = max(4 * limit, 1000)
        removed = 0
        scanned = 0
        wrapped = self._scan_cursor is None
        with self._calls("collect"):
            while removed < limit and scanned < budget:
                request: dict[str, Any] = {
                    "TableName": self.table,
                    "ConsistentRead": True,
                    "Limit": min(500, budget - scanned),
                    "FilterExpression": "retain_until_ms < :now",
                    "ExpressionAttributeValues": {":now": {"N": str(now_ms)}},
                }
                if self._scan_cursor is not None:
                    request["ExclusiveStartKey"] = self._scan_cursor
                page = self._client.scan(**request)
                scanned += int(page.get("ScannedCount", 0))
                stopped_early = False
                for item in page.get("Items", []):
                    if removed >= limit:
                        stopped_early = True
                        break
                    removed += self._collect_item(item, now_ms)
                if stopped_early:
                    break  # keep the cursor: this page is looked at again next time
                self._scan_cursor = page.get("LastEvaluatedKey")
                if self._scan_cursor is None:
                    if wrapped:
                        break  # one whole pass over the table
                    wrapped = True  # started mid-table: go round once to cover the start
        return removed

    def _collect_item(self, item: Mapping[str, Any], now_ms: int) -> int:
        sk = item["sk"]["S"]
        key = {"pk": item["pk"], "sk": item["sk"]}
        expired = {":now": {"N": str(now_ms)}}
        try:
            if sk == NONCE_SK:
                self._client.delete_item(
                    TableName=self.table,
                    Key=key,
                    ConditionExpression="retain_until_ms < :now",
                    ExpressionAttributeValues=expired,
                )
                return 1
            if sk.startswith(CHILD_SK_PREFIX):
                self._client.transact_write_items(
                    TransactItems=[
                        {
                            "Delete": {
                                "TableName": self.table,
                                "Key": key,
                                "ConditionExpression": "retain_until_ms < :now",
                                "ExpressionAttributeValues": expired,
                            }
                        },
                        {
                            "Update": {
                                "TableName": self.table,
                                "Key": {"pk": item["pk"], "sk": {"S": COUNT_SK}},
                                "UpdateExpression": "ADD n :minus",
                                "ConditionExpression": "n > :zero",
                                "ExpressionAttributeValues": {":minus": {"N": "-1"}, ":zero": {"N": "0"}},
                            }
                        },
                    ]
                )
                return 1
            if sk == COUNT_SK:
                self._client.delete_item(
                    TableName=self.table,
                    Key=key,
                    ConditionExpression="n = :zero AND retain_until_ms < :now",
                    ExpressionAttributeValues={**expired, ":zero": {"N": "0"}},
                )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                return 0  # gone already, retention extended, or raced with an admit: next pass
            raise
        return 0

    def entry_count(self) -> int:
        """Consumed nonces plus child-set members, by a consistent paginated Scan (reads the whole
        table: for tests and occasional operations, not for a per-request metric)."""
        count = 0
        request: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "Select": "COUNT",
            "FilterExpression": "sk = :nonce OR begins_with(sk, :child)",
            "ExpressionAttributeValues": {":nonce": {"S": NONCE_SK}, ":child": {"S": CHILD_SK_PREFIX}},
        }
        with self._calls("entry count"):
            while True:
                page = self._client.scan(**request)
                count += int(page.get("Count", 0))
                cursor = page.get("LastEvaluatedKey")
                if cursor is None:
                    return count
                request["ExclusiveStartKey"] = cursor

    def close(self) -> None:
        self._client.close()
