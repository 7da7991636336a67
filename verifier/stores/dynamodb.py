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
``nonce#<nonce>``             ``nonce``   ``retain_until_ms``, ``accepted_ms``, ``request_id``, ``expires_at``
``parent#<parent digest>``    ``count``   ``n`` (children recorded), ``retain_until_ms``, ``expires_at``
``parent#<parent digest>``    ``child#<child nonce>``  ``retain_until_ms``, ``expires_at``
============================  ==========  =================================================

The verdict log adds item kinds to the same table (no secondary index, so nothing for Terraform to
change, and a previous release sharing the table ignores them). ``<s>`` is the verdict's shard,
0 to ``VERDICT_SHARDS - 1`` from a hash of its id, so no single partition takes every verdict;
``<t>`` its time in ms, 13 digits:

================================  ======================  ===========================================
pk                                sk                      attributes
================================  ======================  ===========================================
``verdict#<s>``                   ``<t>#<verdict id>``    the entry (``records`` as JSON),
                                                          ``needs_revalidation``, retention, TTL
``verdict#<s>``                   ``verdict-count``       ``n``: verdicts in the shard (row bound)
``uses#key#<key id>#<s>``         ``<t>#<verdict id>``    ``retain_until_ms``, ``expires_at``
``uses#record#<digest>#<s>``      ``<t>#<verdict id>``    (same)
``uses#deployer#<deployer>#<s>``  ``<t>#<verdict id>``    (same)
================================  ======================  ===========================================

A ``uses#`` item is the index entry of an accepted verdict under one key, record or deployer: a
Query on its partition with ``sk >= <since>`` lists the verdicts that relied on it since then, and
the verdict's own key follows from the shard and the sort key. An accepted verdict's index entries
are written first (BatchWriteItem) and the verdict item last (PutItem), so a verdict is never held
without its index; a rejected one is a single PutItem with no index.

Atomicity: a consume is a PutItem conditioned on ``attribute_not_exists(pk)``, alone when the path
has no edge, inside the same TransactWriteItems as the new children otherwise; DynamoDB applies a
conditional write to one item serially, so exactly one consumer succeeds. A new child is a Put of its
item (``attribute_not_exists``) plus ``ADD n :k`` on the parent's counter item conditioned on
``n < :max`` in one transaction: the counter can never pass ``max_children``, and a child item
already present is a known child (it passes without touching the counter).
"""

from __future__ import annotations

import hashlib
import json
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
from countersign.state import (
    MAX_LOOKUP_VERDICTS,
    MAX_SESSION_LEAVES,
    ChildEdge,
    CoSigner,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    RecordUse,
    StateRejection,
    VerdictEntry,
    check_session_leaves,
    first_repeated_leaf,
)

NONCE_SK = "nonce"
COUNT_SK = "count"
CHILD_SK_PREFIX = "child#"
NONCE_PK_PREFIX = "nonce#"
PARENT_PK_PREFIX = "parent#"
TTL_ATTRIBUTE = "expires_at"
TRANSACT_LIMIT = 100  # items per TransactWriteItems (and TransactGetItems on AWS)
# Keys per TransactGetItems read here: AWS takes 100, but the emulator (moto) still enforces the older
# limit of 25, and the writes that follow a read are conditional, so reading in smaller snapshots
# can only cost a retry, never an admission.
TRANSACT_GET_CHUNK = 25
BATCH_WRITE_LIMIT = 25  # requests per BatchWriteItem
BATCH_GET_LIMIT = 100  # keys per BatchGetItem
VERDICT_PK_PREFIX = "verdict#"
VERDICT_COUNT_SK = "verdict-count"
USES_PK_PREFIX = "uses#"
VERDICT_SHARDS = 8
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


def _earlier(consumed: Mapping[str, Any] | None, leaf: LeafNonce) -> EarlierAcceptance | None:
    """The acceptance ``leaf`` retries, if the consumed nonce item was written under its request id
    (an item from before acceptance times were kept answers 0)."""
    if consumed is None or not leaf.request_id or consumed.get("request_id", {}).get("S") != leaf.request_id:
        return None
    return EarlierAcceptance(int(consumed.get("accepted_ms", {}).get("N", "0")))


def _nonce_key(nonce: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": NONCE_PK_PREFIX + nonce}, "sk": {"S": NONCE_SK}}


def _child_key(parent: str, child: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": CHILD_SK_PREFIX + child}}


def _count_key(parent: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": COUNT_SK}}


def verdict_shard(verdict_id: str) -> int:
    return hashlib.sha256(verdict_id.encode()).digest()[0] % VERDICT_SHARDS


def _verdict_sk(time_ms: int, verdict_id: str) -> str:
    return f"{time_ms:013d}#{verdict_id}"


def _verdict_key(shard: int, sk: str) -> dict[str, dict[str, str]]:
    return {"pk": {"S": f"{VERDICT_PK_PREFIX}{shard}"}, "sk": {"S": sk}}


def _verdict_count_key(shard: int) -> dict[str, dict[str, str]]:
    return {"pk": {"S": f"{VERDICT_PK_PREFIX}{shard}"}, "sk": {"S": VERDICT_COUNT_SK}}


def _uses_pk(kind: DependencyKind, value: str, shard: int) -> str:
    return f"{USES_PK_PREFIX}{kind.value}#{value}#{shard}"


def _uses_of(entry: VerdictEntry) -> list[tuple[DependencyKind, str]]:
    """Every key, record and deployer an accepted verdict is indexed under (each once)."""
    uses: dict[tuple[DependencyKind, str], None] = {}
    for record in entry.records:
        uses[DependencyKind.RECORD, record.digest] = None
        for _, deployer, key_id in record.signatures():
            uses[DependencyKind.KEY, key_id] = None
            uses[DependencyKind.DEPLOYER, deployer] = None
    return list(uses)


def _records_json(records: Sequence[RecordUse]) -> str:
    return json.dumps(
        [[r.digest, r.deployer, r.key_id, r.created_ms, [[c.role, c.deployer, c.key_id] for c in r.cosigners]]
         for r in records],
        separators=(",", ":"),
    )  # fmt: skip


def _entry_from_item(item: Mapping[str, Any]) -> VerdictEntry:
    records = tuple(
        RecordUse(digest, deployer, key_id, int(created), tuple(CoSigner(*c) for c in cosigners))
        for digest, deployer, key_id, created, cosigners in json.loads(item["records"]["S"])
    )
    return VerdictEntry(
        verdict_id=item["verdict_id"]["S"],
        time_ms=int(item["time_ms"]["N"]),
        mode=item["mode"]["S"],
        client=item["client"]["S"],
        request_id=item["request_id"]["S"],
        registry_sequence=int(item["registry_sequence"]["N"]),
        verdict=item["verdict"]["S"],
        reason=item["reason"]["S"],
        construction=item["construction"]["S"],
        records=records,
        retain_until_ms=int(item["retain_until_ms"]["N"]),
        needs_revalidation=bool(item.get("needs_revalidation", {}).get("BOOL", False)),
        revalidation_cause=item.get("revalidation_cause", {}).get("S", ""),
    )


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
    ) -> StateRejection | EarlierAcceptance | None:
        if not edges:
            if not consume:
                return None
            return self._consume_alone(leaf, now_ms)
        with self._calls("admit"):
            for attempt in range(_ATTEMPTS):
                try:
                    return self._admit_round(edges, leaf, consume, now_ms)
                except _Contended:
                    if attempt + 1 < _ATTEMPTS:
                        time.sleep(min(0.2, 0.005 * 2**attempt))
        raise StateUnavailable(
            f"DynamoDB table {self.table} (admit): still contended after {_ATTEMPTS} optimistic attempts"
        )

    def _consume_alone(self, leaf: LeafNonce, now_ms: int) -> StateRejection | EarlierAcceptance | None:
        with self._calls("consume"):
            try:
                self._client.put_item(**self._nonce_put(leaf, now_ms))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
                consumed = self._client.get_item(
                    TableName=self.table, Key=_nonce_key(leaf.nonce), ConsistentRead=True
                ).get("Item")
                return _earlier(consumed, leaf) or StateRejection(Reason.NONCE_REPLAYED, leaf.index)
        return None

    def _nonce_put(self, leaf: LeafNonce, now_ms: int) -> dict[str, Any]:
        # Only the first consumption writes the item (a retry must not move its acceptance time), so
        # of concurrent retries under one key exactly one is the acceptance, the rest retries of it.
        put: dict[str, Any] = {
            "TableName": self.table,
            "Item": {
                **_nonce_key(leaf.nonce),
                "retain_until_ms": {"N": str(leaf.retain_until_ms)},
                "accepted_ms": {"N": str(now_ms)},
                TTL_ATTRIBUTE: {"N": _expires_at(leaf.retain_until_ms)},
            },
            "ConditionExpression": "attribute_not_exists(pk)",
        }
        if leaf.request_id:
            put["Item"]["request_id"] = {"S": leaf.request_id}
        return put

    def _read(self, keys: list[dict[str, dict[str, str]]]) -> list[Mapping[str, Any] | None]:
        """Strongly consistent, serialisable read (TransactGetItems) of ``keys``, in order (a key
        asked twice is read once: DynamoDB refuses two operations on one item in a transaction)."""
        unique = list({(k["pk"]["S"], k["sk"]["S"]): k for k in keys}.values())
        found: list[Mapping[str, Any] | None] = []
        for start in range(0, len(unique), TRANSACT_GET_CHUNK):
            chunk = unique[start : start + TRANSACT_GET_CHUNK]
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

    def _admit_round(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        # One TransactGetItems, i.e. one snapshot, for paths of up to 12 edges; a longer path is read
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
        earlier = _earlier(consumed, leaf)
        replayed = consumed is not None and earlier is None

        writes = self._edge_writes(edges, known)
        if consumed is None:
            writes.append({"Put": self._nonce_put(leaf, now_ms)})
        if writes:
            self._write(writes)
        if earlier is not None:
            return earlier
        return StateRejection(Reason.NONCE_REPLAYED, leaf.index) if replayed else None

    def _edge_writes(self, edges: Sequence[ChildEdge], known: Sequence[bool]) -> list[dict[str, Any]]:
        """The conditional writes that record a path's new children and their parents' counters."""
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
        return writes

    def admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        """Every receipt's nonce in ONE TransactWriteItems (so at most :attr:`max_session_leaves`, the
        transaction's item limit: ADR 0022), after one consistent read that finds any nonce already
        consumed (then nothing is written). A nonce consumed between the read and the write cancels
        the transaction as a whole, and the next round's read reports it."""
        check_session_leaves(leaves, self.max_session_leaves if consume else MAX_SESSION_LEAVES)
        with self._calls("admit session"):
            for attempt in range(_ATTEMPTS):
                try:
                    return self._admit_session_round(edges, leaves, consume, now_ms)
                except _Contended:
                    if attempt + 1 < _ATTEMPTS:
                        time.sleep(min(0.2, 0.005 * 2**attempt))
        raise StateUnavailable(
            f"DynamoDB table {self.table} (admit session): still contended after {_ATTEMPTS} optimistic attempts"
        )

    @property
    def max_session_leaves(self) -> int:
        return TRANSACT_LIMIT

    def _admit_session_round(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        keys: list[dict[str, dict[str, str]]] = []
        for edge in edges:
            keys.append(_child_key(edge.parent_digest, edge.child_nonce))
            keys.append(_count_key(edge.parent_digest))
        if consume:
            keys.extend(_nonce_key(leaf.nonce) for leaf in leaves)
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
        replayed = first_repeated_leaf(leaves)
        for leaf, consumed in zip(leaves, items[2 * len(edges) :], strict=True):
            if consumed is not None and not (
                leaf.request_id and consumed.get("request_id", {}).get("S") == leaf.request_id
            ):
                replayed = leaf.index if replayed is None else min(replayed, leaf.index)
                break
        if replayed is not None:
            return StateRejection(Reason.NONCE_REPLAYED, replayed)
        edge_writes = self._edge_writes(edges, known)
        # A nonce already consumed under this request id (a retried session) is not written again:
        # its item keeps its first acceptance time, and an unconditional rewrite would cancel.
        nonces = items[2 * len(edges) :]
        fresh = [leaf for leaf, consumed in zip(leaves, nonces, strict=True) if consumed is None]
        nonce_puts = [{"Put": self._nonce_put(leaf, now_ms)} for leaf in fresh]
        if len(edge_writes) + len(nonce_puts) <= TRANSACT_LIMIT:
            if edge_writes or nonce_puts:
                self._write(edge_writes + nonce_puts)
        else:
            # The children first (each write conditional, as admit records a long path's), then every
            # nonce in one transaction: the nonces stay all or nothing.
            self._write(edge_writes)
            if nonce_puts:
                self._write(nonce_puts)
        if fresh:
            return None
        # Every receipt was consumed before under this request id (checked above): a retried session.
        retried = [_earlier(consumed, leaf) for leaf, consumed in zip(leaves, nonces, strict=True)]
        return EarlierAcceptance(max(earlier.accepted_ms for earlier in retried if earlier is not None))

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
        pk = item["pk"]["S"]
        key = {"pk": item["pk"], "sk": item["sk"]}
        expired = {":now": {"N": str(now_ms)}}
        try:
            if pk.startswith(USES_PK_PREFIX):
                # An index entry expires with its verdict; not an entry of its own (not counted).
                self._client.delete_item(
                    TableName=self.table, Key=key, ConditionExpression="retain_until_ms < :now",
                    ExpressionAttributeValues=expired,
                )  # fmt: skip
                return 0
            if pk.startswith(VERDICT_PK_PREFIX):
                self._client.delete_item(
                    TableName=self.table, Key=key, ConditionExpression="retain_until_ms < :now",
                    ExpressionAttributeValues=expired,
                )  # fmt: skip
                self._count_verdicts(int(pk[len(VERDICT_PK_PREFIX) :]), -1)
                return 1
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

    # -- the verdict log -----------------------------------------------------------------------

    def _count_verdicts(self, shard: int, delta: int) -> None:
        """Keep the shard's verdict count beside its items (not in their transaction: one counter item
        per shard in every verdict's transaction would make concurrent verdicts conflict). So the row
        bound is approximate: a write that fails between the two leaves the count one off."""
        self._client.update_item(
            TableName=self.table,
            Key=_verdict_count_key(shard),
            UpdateExpression="ADD n :delta",
            ExpressionAttributeValues={":delta": {"N": str(delta)}},
        )

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        """Each as :meth:`record_verdict` (DynamoDB has no flush to share, and a transaction would
        conflict on the shards' counters under load, ADR 0015); the first failure stops the batch."""
        for entry in entries:
            self.record_verdict(entry)

    def record_verdict(self, entry: VerdictEntry) -> None:
        """The index entries first (BatchWriteItem, unconditional and idempotent), the verdict item
        last: a verdict is never held without its index, and entries left by a write that failed
        half-way point at no verdict, so lookups skip them and collection removes them."""
        shard = verdict_shard(entry.verdict_id)
        sk = _verdict_sk(entry.time_ms, entry.verdict_id)
        retain = {
            "retain_until_ms": {"N": str(entry.retain_until_ms)},
            TTL_ATTRIBUTE: {"N": _expires_at(entry.retain_until_ms)},
        }
        index = [
            {"PutRequest": {"Item": {"pk": {"S": _uses_pk(kind, value, shard)}, "sk": {"S": sk}, **retain}}}
            for kind, value in (_uses_of(entry) if entry.accepted else [])
        ]
        item = {
            **_verdict_key(shard, sk),
            "verdict_id": {"S": entry.verdict_id},
            "time_ms": {"N": str(entry.time_ms)},
            "mode": {"S": entry.mode},
            "client": {"S": entry.client},
            "request_id": {"S": entry.request_id},
            "registry_sequence": {"N": str(entry.registry_sequence)},
            "verdict": {"S": entry.verdict},
            "reason": {"S": entry.reason},
            "construction": {"S": entry.construction},
            "records": {"S": _records_json(entry.records)},
            "needs_revalidation": {"BOOL": False},
            **retain,
        }
        with self._calls("record verdict"):
            for start in range(0, len(index), BATCH_WRITE_LIMIT):
                self._batch_write(index[start : start + BATCH_WRITE_LIMIT])
            try:
                self._client.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(pk)")
            except ClientError as exc:
                # Verdict ids are 128 random bits: the item there is this verdict's own, written by an
                # attempt whose answer was lost (botocore retried it). Anything else is an error.
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
                return
            self._count_verdicts(shard, 1)

    def _batch_write(self, requests: list[dict[str, Any]]) -> None:
        """One BatchWriteItem, resending what DynamoDB left unprocessed (throttling) a few times."""
        pending = {self.table: requests}
        for attempt in range(_ATTEMPTS):
            answer = self._client.batch_write_item(RequestItems=pending)
            pending = answer.get("UnprocessedItems") or {}
            if not pending:
                return
            time.sleep(min(0.2, 0.005 * 2**attempt))
        raise StateUnavailable(f"DynamoDB table {self.table} (record verdict): index writes left unprocessed")

    def accepts_relying_on(
        self, kind: DependencyKind, values: Sequence[str], *, since_ms: int = 0, limit: int = MAX_LOOKUP_VERDICTS
    ) -> list[VerdictEntry]:
        keys: set[tuple[int, str]] = set()
        with self._calls("verdict lookup"):
            for value in dict.fromkeys(values):
                for shard in range(VERDICT_SHARDS):
                    keys.update((shard, sk) for sk in self._index_range(_uses_pk(kind, value, shard), since_ms, limit))
            oldest = sorted(keys, key=lambda k: k[1])[:limit]
            items: list[Mapping[str, Any]] = []
            for start in range(0, len(oldest), BATCH_GET_LIMIT):
                items += self._batch_get(
                    [_verdict_key(shard, sk) for shard, sk in oldest[start : start + BATCH_GET_LIMIT]]
                )
        # An index entry whose verdict is gone (collected, or its write failed half-way) finds nothing.
        entries = sorted((_entry_from_item(item) for item in items), key=lambda e: (e.time_ms, e.verdict_id))
        return [e for e in entries if e.accepted]

    def _batch_get(self, keys: list[dict[str, dict[str, str]]]) -> list[Mapping[str, Any]]:
        """Consistent reads of ``keys`` (BatchGetItem), resending unprocessed keys a few times; items
        that do not exist are left out."""
        found: list[Mapping[str, Any]] = []
        pending: dict[str, Any] = {self.table: {"Keys": keys, "ConsistentRead": True}}
        for attempt in range(_ATTEMPTS):
            answer = self._client.batch_get_item(RequestItems=pending)
            found += answer.get("Responses", {}).get(self.table, [])
            pending = answer.get("UnprocessedKeys") or {}
            if not pending:
                return found
            time.sleep(min(0.2, 0.005 * 2**attempt))
        raise StateUnavailable(f"DynamoDB table {self.table} (verdict lookup): reads left unprocessed")

    def _index_range(self, pk: str, since_ms: int, limit: int) -> list[str]:
        """Sort keys of one index partition from ``since_ms`` on, oldest first, at most ``limit``."""
        found: list[str] = []
        request: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "KeyConditionExpression": "pk = :pk AND sk >= :since",
            "ExpressionAttributeValues": {":pk": {"S": pk}, ":since": {"S": f"{max(0, since_ms):013d}"}},
            "ProjectionExpression": "sk",
            "Limit": min(1000, limit),
        }
        while len(found) < limit:
            page = self._client.query(**request)
            found.extend(item["sk"]["S"] for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found[:limit]

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        """One conditional UpdateItem per verdict (unflagged, and still there): DynamoDB applies the
        conditional writes to one item one at a time, so replicas marking together count it once."""
        marked = 0
        with self._calls("mark verdicts"):
            for entry in {v.verdict_id: v for v in verdicts}.values():
                try:
                    self._client.update_item(
                        TableName=self.table,
                        Key=_verdict_key(verdict_shard(entry.verdict_id), _verdict_sk(entry.time_ms, entry.verdict_id)),
                        UpdateExpression="SET needs_revalidation = :yes, revalidation_cause = :cause, marked_ms = :now",
                        ConditionExpression="needs_revalidation = :no",
                        ExpressionAttributeValues={
                            ":yes": {"BOOL": True}, ":no": {"BOOL": False}, ":cause": {"S": cause},
                            ":now": {"N": str(now_ms)},
                        },
                    )  # fmt: skip
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                        continue  # marked already, or collected meanwhile
                    raise
                marked += 1
        return marked

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000) -> int:
        """Forget the oldest verdicts of each shard beyond its share of ``max_rows``. With ``collect=ttl``
        this does nothing: DynamoDB's TTL deletes items without the counts knowing, so the counts would
        overstate what is held and the bound would forget too much (retention alone bounds the log)."""
        if self.settings.collect == "ttl" or limit <= 0:
            return 0
        per_shard = -(-max_rows // VERDICT_SHARDS)
        removed = 0
        with self._calls("trim verdicts"):
            counts = self._shard_counts()
            for shard, held in enumerate(counts):
                excess = min(held - per_shard, limit - removed)
                if excess <= 0:
                    continue
                page = self._client.query(
                    TableName=self.table,
                    ConsistentRead=True,
                    KeyConditionExpression="pk = :pk AND sk < :counter",
                    ExpressionAttributeValues={
                        ":pk": {"S": f"{VERDICT_PK_PREFIX}{shard}"}, ":counter": {"S": VERDICT_COUNT_SK}
                    },
                    Limit=excess,
                )  # fmt: skip
                for item in page.get("Items", []):
                    removed += self._forget(shard, item)
        return removed

    def _forget(self, shard: int, item: Mapping[str, Any]) -> int:
        entry = _entry_from_item(item)
        sk = item["sk"]["S"]
        for kind, value in _uses_of(entry) if entry.accepted else []:
            self._client.delete_item(
                TableName=self.table, Key={"pk": {"S": _uses_pk(kind, value, shard)}, "sk": {"S": sk}}
            )
        try:
            self._client.delete_item(
                TableName=self.table, Key=_verdict_key(shard, sk), ConditionExpression="attribute_exists(pk)"
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return 0  # another replica's collector took it
            raise
        self._count_verdicts(shard, -1)
        return 1

    def _shard_counts(self) -> list[int]:
        counts = {item["pk"]["S"]: int(item["n"]["N"]) for item in self._batch_get(
            [_verdict_count_key(shard) for shard in range(VERDICT_SHARDS)]) if "n" in item}  # fmt: skip
        return [max(0, counts.get(f"{VERDICT_PK_PREFIX}{shard}", 0)) for shard in range(VERDICT_SHARDS)]

    def verdict_count(self) -> int:
        with self._calls("verdict count"):
            return sum(self._shard_counts())

    def close(self) -> None:
        self._client.close()
