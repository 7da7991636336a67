"""DynamoDB verifier state: one table shared by verifier replicas in any availability zone.

URL: ``dynamodb://TABLE?region=REGION[&endpoint_url=http://HOST:PORT][&PARAMS]``, read as every daemon's
DynamoDB store reads it (:mod:`countersign._daemon.dynamodb`: ``endpoint_url``, ``connect_timeout``,
``read_timeout``, ``max_attempts``; credentials from boto3's default chain), and one parameter of the
verifier's own:

* ``collect``: ``scan`` (default) makes :meth:`DynamoDbState.collect_expired` delete expired items
  found by a bounded, resumable consistent Scan (needs ``dynamodb:Scan``); ``ttl`` makes it a no-op
  that returns 0 and leaves expiry to DynamoDB's native TTL alone.

The table (created by Terraform in production, by :func:`ensure_table` in tests) has the shape every
daemon's table has (:func:`countersign._daemon.dynamodb.check_table`). Its items, to and from the domain
objects, are :mod:`verifier.stores.dynamodb_items`; this module makes the requests.

Atomicity: a consume is a PutItem conditioned on ``attribute_not_exists(pk)``, alone when the path
has no edge, inside the same TransactWriteItems as the new children otherwise; DynamoDB applies a
conditional write to one item serially, so exactly one consumer succeeds. A new child is a Put of its
item (``attribute_not_exists``) plus ``ADD n :k`` on the parent's counter item conditioned on
``n < :max`` in one transaction: the counter can never pass ``max_children``, and a child item
already present is a known child (it passes without touching the counter).

The verdict log: a verdict's ref in its path's partition first, then its path and the path's index
entries if the client's store lacks them, the verdict item last, so a verdict is never held without
its path and index. A lookup queries the index partitions of the value (one per shard), then the
paths' refs from ``since`` on, then reads the verdicts and their paths.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from countersign._daemon.dynamodb import (
    TTL_ATTRIBUTE,
    DynamoDbSettings,
    calls,
    check_table,
    expires_at,
    make_client,
    parse_dynamodb_url,
    split_collect_mode,
)
from countersign._daemon.dynamodb import ensure_table as ensure_daemon_table
from countersign.errors import ConfigError, StateUnavailable
from countersign.reasons import Reason
from countersign.state import (
    MAX_LOOKUP_VERDICTS,
    MAX_SESSION_LEAVES,
    ChildEdge,
    ClientUsage,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    StateRejection,
    VerdictEntry,
    bounded_cause,
    check_session_leaves,
    first_repeated_leaf,
    path_digest,
    records_from_json,
    trim_by_share,
    verdict_bytes,
)
from verifier.stores import StoreConfigError
from verifier.stores.dynamodb_items import (
    CHILD_SK_PREFIX,
    COUNT_SK,
    LEGACY_COUNT_SK,
    LEGACY_USES_PK_PREFIX,
    LEGACY_VERDICT_PK_PREFIX,
    NONCE_SK,
    PATH_PK_PREFIX,
    PATH_SK,
    REF_SK_PREFIX,
    SCHEMA_PK,
    USAGE_PK_PREFIX,
    USE_PK_PREFIX,
    VERDICT_SHARDS,
    VERDICTS_PK_PREFIX,
    child_item,
    child_key,
    children_held,
    client_key,
    consumed_under,
    count_key,
    digest_of_path_pk,
    earlier_acceptance,
    entry_on_path,
    legacy_entry,
    legacy_use_keys,
    nonce_item,
    nonce_key,
    path_item,
    path_key,
    path_shard,
    ref_item,
    ref_key_of,
    usage_key,
    use_items,
    use_keys,
    use_pk,
    verdict_item,
    verdict_key,
    verdict_pk,
    verdict_shard,
)

__all__ = ["TTL_ATTRIBUTE", "DynamoDbState", "StoreSettings", "ensure_table", "make_client", "parse_url"]

TRANSACT_LIMIT = 100  # items per TransactWriteItems (and TransactGetItems on AWS)
# Keys per TransactGetItems read here: AWS takes 100, but the emulator (moto) still enforces the older
# limit of 25, and the writes that follow a read are conditional, so reading in smaller snapshots
# can only cost a retry, never an admission.
TRANSACT_GET_CHUNK = 25
BATCH_WRITE_LIMIT = 25  # requests per BatchWriteItem
BATCH_GET_LIMIT = 100  # keys per BatchGetItem
_ATTEMPTS = 8  # optimistic rounds of an admit under contention before giving up (StateUnavailable)


@dataclass(frozen=True, slots=True)
class StoreSettings(DynamoDbSettings):
    """A table URL as every daemon reads it, and the verifier's ``collect`` mode."""

    collect: str = "scan"


def _split_collect(url: str) -> tuple[str, str]:
    """(the URL without ``collect``, the collect mode). Raises StoreConfigError for an unknown mode."""
    try:
        return split_collect_mode(url)
    except ConfigError as exc:
        raise StoreConfigError(str(exc)) from None


def parse_url(url: str) -> StoreSettings:
    """Read a verifier store URL (module docstring). Raises StoreConfigError naming what is wrong."""
    table_url, collect = _split_collect(url)
    try:
        table = parse_dynamodb_url(table_url)
    except ConfigError as exc:
        raise StoreConfigError(str(exc)) from None
    return StoreSettings(
        table=table.table, region=table.region, endpoint_url=table.endpoint_url,
        connect_timeout=table.connect_timeout, read_timeout=table.read_timeout,
        max_attempts=table.max_attempts, collect=collect,
    )  # fmt: skip


def ensure_table(url: str, *, wait_s: float = 60.0) -> None:
    """Create the table a store URL names as Terraform does; no-op if it exists. For tests and local runs."""
    table_url, _ = _split_collect(url)
    try:
        ensure_daemon_table(table_url, wait_s=wait_s)
    except ConfigError as exc:
        raise StoreConfigError(str(exc)) from None


class _Contended(Exception):
    """A transaction was cancelled (a condition raced with another writer, or a conflict): re-read."""


class DynamoDbState:
    """:class:`countersign.state.VerifierStore` (replay state and verdict log) in one DynamoDB table."""

    def __init__(self, url: str, *, client: Any | None = None) -> None:
        self.settings = parse_url(url)
        self.table = self.settings.table
        self._client = client if client is not None else make_client(self.settings)
        self._scan_cursor: dict[str, Any] | None = None
        check_table(self._client, self.table)
        self._move_legacy_verdicts()

    def _calls(self, what: str) -> AbstractContextManager[None]:
        """Every botocore failure inside becomes StateUnavailable naming the table and ``what``."""
        return calls(self.table, what)

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
                    TableName=self.table, Key=nonce_key(leaf.nonce), ConsistentRead=True
                ).get("Item")
                return earlier_acceptance(consumed, leaf) or StateRejection(Reason.NONCE_REPLAYED, leaf.index)
        return None

    def _nonce_put(self, leaf: LeafNonce, now_ms: int) -> dict[str, Any]:
        # Only the first consumption writes the item (a retry must not move its acceptance time), so
        # of concurrent retries under one key exactly one is the acceptance, the rest retries of it.
        return {
            "TableName": self.table, "Item": nonce_item(leaf, now_ms), "ConditionExpression": "attribute_not_exists(pk)"
        }  # fmt: skip

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
            keys.append(child_key(edge.parent_digest, edge.child_nonce))
            keys.append(count_key(edge.parent_digest))
        if consume:
            keys.append(nonce_key(leaf.nonce))
        items = self._read(keys)
        known: list[bool] = []
        for position, edge in enumerate(edges):
            child, counter = items[2 * position], items[2 * position + 1]
            if child is None and children_held(counter) >= edge.max_children:
                return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            known.append(child is not None)
        if not consume:
            return None
        consumed = items[-1]
        earlier = earlier_acceptance(consumed, leaf)
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
            put = {"TableName": self.table, "Item": child_item(edge), "ConditionExpression": "attribute_not_exists(pk)"}
            writes.append({"Put": put})
        for parent, new in new_per_parent.items():
            retain = max(e.retain_until_ms for e in new)
            writes.append(
                {
                    "Update": {
                        "TableName": self.table,
                        "Key": count_key(parent),
                        # The checks above ran against the state before this path (as the reference
                        # does), so the condition is on the count before these k children join.
                        "UpdateExpression": "ADD n :k SET retain_until_ms = :r, #ttl = :ttl",
                        "ConditionExpression": "attribute_not_exists(n) OR n < :max",
                        "ExpressionAttributeNames": {"#ttl": TTL_ATTRIBUTE},
                        "ExpressionAttributeValues": {
                            ":k": {"N": str(len(new))},
                            ":max": {"N": str(min(e.max_children for e in new))},
                            ":r": {"N": str(retain)},
                            ":ttl": {"N": expires_at(retain)},
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
            keys.append(child_key(edge.parent_digest, edge.child_nonce))
            keys.append(count_key(edge.parent_digest))
        if consume:
            keys.extend(nonce_key(leaf.nonce) for leaf in leaves)
        items = self._read(keys)
        known: list[bool] = []
        for position, edge in enumerate(edges):
            child, counter = items[2 * position], items[2 * position + 1]
            if child is None and children_held(counter) >= edge.max_children:
                return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            known.append(child is not None)
        if not consume:
            return None
        replayed = first_repeated_leaf(leaves)
        for leaf, consumed in zip(leaves, items[2 * len(edges) :], strict=True):
            if consumed is not None and not consumed_under(consumed, leaf):
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
        retried = [earlier_acceptance(consumed, leaf) for leaf, consumed in zip(leaves, nonces, strict=True)]
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
            if pk.startswith(VERDICTS_PK_PREFIX):
                return self._forget_item(item, expired_before=now_ms).rows
            if pk.startswith(PATH_PK_PREFIX):
                if sk.startswith(REF_SK_PREFIX):  # left by a forget that failed half-way
                    self._client.delete_item(
                        TableName=self.table, Key=key, ConditionExpression="retain_until_ms < :now",
                        ExpressionAttributeValues=expired,
                    )  # fmt: skip
                self._drop_path_if_unused(pk)  # a path outlives its verdicts by a day at most
                return 0
            if pk.startswith((USE_PK_PREFIX, LEGACY_USES_PK_PREFIX, LEGACY_VERDICT_PK_PREFIX)):
                self._client.delete_item(
                    TableName=self.table, Key=key, ConditionExpression="retain_until_ms < :now",
                    ExpressionAttributeValues=expired,
                )  # fmt: skip
                return 0
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

    def _count_usage(self, client: str, shard: int, rows: int, size: int) -> None:
        """Keep a client's rows and bytes beside its items (not in their writes: one counter in every
        verdict's transaction would make concurrent verdicts conflict). So the bounds are approximate:
        a write that fails between the two leaves the count off by one verdict."""
        self._client.update_item(
            TableName=self.table,
            Key=usage_key(client, shard),
            UpdateExpression="ADD n :rows, b :bytes",
            ExpressionAttributeValues={":rows": {"N": str(rows)}, ":bytes": {"N": str(size)}},
        )

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        """Each as :meth:`record_verdict` (DynamoDB has no flush to share, and a transaction would
        conflict on the usage counters under load, ADR 0015); the first failure stops the batch."""
        for entry in entries:
            self.record_verdict(entry)

    def record_verdict(self, entry: VerdictEntry) -> None:
        """Its path's ref first, then its path and the path's index entries if the client's store
        lacks them (or their retention is to be extended), the verdict item last: a verdict is never
        held without its path and index. Without a transaction: a collector dropping the path at the
        same moment finds the ref and puts the path back (:meth:`_drop_path_if_unused`)."""
        digest = path_digest(entry.construction, entry.records)
        item = verdict_item(entry)
        with self._calls("record verdict"):
            if digest is not None:
                self._client.put_item(TableName=self.table, Item=ref_item(entry, digest))
                self._keep_path(entry, digest)
            try:
                self._client.put_item(TableName=self.table, Item=item, ConditionExpression="attribute_not_exists(pk)")
            except ClientError as exc:
                # Verdict ids are 128 random bits: the item there is this verdict's own, written by an
                # attempt whose answer was lost (botocore retried it). Anything else is an error.
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
                return
            self._count_usage(entry.client, verdict_shard(entry.verdict_id), 1, verdict_bytes(entry))

    def _keep_path(self, entry: VerdictEntry, digest: bytes) -> None:
        """Make sure the client's store holds ``entry``'s path and its index entries, kept at least as
        long as ``entry`` (extended a day at a time, so a path in daily use is written once a day)."""
        key = path_key(entry.client, digest)
        held = self._client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item")
        if held is not None and int(held["retain_until_ms"]["N"]) >= entry.retain_until_ms:
            return
        uses = [{"PutRequest": {"Item": use}} for use in use_items(entry, digest)]
        for start in range(0, len(uses), BATCH_WRITE_LIMIT):
            self._batch_write(uses[start : start + BATCH_WRITE_LIMIT])
        path = path_item(entry, digest)
        if held is not None:
            self._client.put_item(TableName=self.table, Item=path)
            return
        try:
            self._client.put_item(TableName=self.table, Item=path, ConditionExpression="attribute_not_exists(pk)")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            return  # another replica stored it meanwhile (and counted it)
        self._count_usage(entry.client, path_shard(digest), 0, int(path["bytes"]["N"]))

    def _drop_path_if_unused(self, pk: str) -> int:
        """Drop the path item of partition ``pk`` and its index entries if no ref is left there;
        return the bytes it counted for (0 if kept or gone). The path item goes first, then the refs
        are read: a verdict recorded meanwhile (its ref is written before it looks at the path) is
        seen here and the path is put back, or it finds the path gone and writes it afresh."""
        try:
            old = self._client.delete_item(
                TableName=self.table, Key={"pk": {"S": pk}, "sk": {"S": PATH_SK}}, ReturnValues="ALL_OLD"
            ).get("Attributes")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                raise
            return 0
        if old is None:
            return 0
        refs = self._client.query(
            TableName=self.table, ConsistentRead=True, Limit=1,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :ref)",
            ExpressionAttributeValues={":pk": {"S": pk}, ":ref": {"S": REF_SK_PREFIX}},
        )  # fmt: skip
        if refs.get("Items"):
            try:
                self._client.put_item(TableName=self.table, Item=old, ConditionExpression="attribute_not_exists(pk)")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
            return 0
        digest = digest_of_path_pk(pk)
        client = old["client"]["S"]
        for use in use_keys(client, digest, records_from_json(old["records"]["S"])):
            self._client.delete_item(TableName=self.table, Key=use)
        size = int(old["bytes"]["N"])
        self._count_usage(client, path_shard(digest), 0, -size)
        return size

    def _forget_item(self, item: Mapping[str, Any], *, expired_before: int | None = None) -> ClientUsage:
        """Forget one verdict item: the item (if still there, and expired when ``expired_before`` is
        given), its ref, its count, and its path if no verdict of its client is left on it. Returns
        the rows (0 or 1) and bytes that went."""
        condition = "attribute_exists(pk)" + ("" if expired_before is None else " AND retain_until_ms < :now")
        values = {} if expired_before is None else {"ExpressionAttributeValues": {":now": {"N": str(expired_before)}}}
        try:
            self._client.delete_item(
                TableName=self.table, Key={"pk": item["pk"], "sk": item["sk"]}, ConditionExpression=condition, **values
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return ClientUsage(0, 0)  # another replica's collector took it
            raise
        client = item["client"]["S"]
        freed = int(item.get("bytes", {}).get("N", "0"))
        self._count_usage(client, verdict_shard(item["verdict_id"]["S"]), -1, -freed)
        if "path" in item:
            ref = ref_key_of(item)
            self._client.delete_item(TableName=self.table, Key=ref)
            freed += self._drop_path_if_unused(ref["pk"]["S"])
        return ClientUsage(1, freed)

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
        self,
        kind: DependencyKind,
        values: Sequence[str],
        *,
        since_ms: int = 0,
        limit: int = MAX_LOOKUP_VERDICTS,
        client: str | None = None,
    ) -> list[VerdictEntry]:
        mine = None if client is None else client_key(client) + "#"
        with self._calls("verdict lookup"):
            paths: set[str] = set()
            for value in dict.fromkeys(values):
                for shard in range(VERDICT_SHARDS):
                    paths.update(
                        PATH_PK_PREFIX + sk for sk in self._range(use_pk(kind, value, shard), mine or "", limit=None)
                    )
            refs: list[tuple[str, str]] = []  # (sk of the verdict, its pk)
            for pk in sorted(paths):
                for ref in self._refs(pk, since_ms, limit):
                    refs.append((ref["sk"]["S"][len(REF_SK_PREFIX) :], ref["vpk"]["S"]))
            oldest = sorted(set(refs))[:limit]
            items: list[Mapping[str, Any]] = []
            for start in range(0, len(oldest), BATCH_GET_LIMIT):
                items += self._batch_get(
                    [{"pk": {"S": pk}, "sk": {"S": sk}} for sk, pk in oldest[start : start + BATCH_GET_LIMIT]]
                )
            wanted = {ref_key_of(i)["pk"]["S"] for i in items if "path" in i}
            held: dict[str, Mapping[str, Any]] = {}
            ordered = sorted(wanted)
            for start in range(0, len(ordered), BATCH_GET_LIMIT):
                for path in self._batch_get(
                    [{"pk": {"S": pk}, "sk": {"S": PATH_SK}} for pk in ordered[start : start + BATCH_GET_LIMIT]]
                ):
                    held[path["pk"]["S"]] = path
        entries = []
        for item in items:
            if item["verdict"]["S"] != "ACCEPT" or "path" not in item:
                continue
            stored = held.get(ref_key_of(item)["pk"]["S"])
            if stored is None:
                continue  # dropped by a collector this instant and being put back: seen on the next lookup
            entries.append(entry_on_path(item, stored))
        return sorted(entries, key=lambda e: (e.time_ms, e.verdict_id))

    def _range(self, pk: str, prefix: str, *, limit: int | None) -> list[str]:
        """Sort keys of partition ``pk`` beginning with ``prefix`` (all of them without a limit)."""
        found: list[str] = []
        condition = "pk = :pk" + (" AND begins_with(sk, :prefix)" if prefix else "")
        values = {":pk": {"S": pk}, **({":prefix": {"S": prefix}} if prefix else {})}
        request: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True, "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values, "ProjectionExpression": "sk",
        }  # fmt: skip
        while limit is None or len(found) < limit:
            page = self._client.query(**request)
            found.extend(item["sk"]["S"] for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found

    def _refs(self, pk: str, since_ms: int, limit: int) -> list[Mapping[str, Any]]:
        """A path's refs from ``since_ms`` on, of accepted verdicts, oldest first, at most ``limit``."""
        found: list[Mapping[str, Any]] = []
        request: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "KeyConditionExpression": "pk = :pk AND sk BETWEEN :since AND :end",
            "FilterExpression": "accepted = :yes",
            "ExpressionAttributeValues": {
                ":pk": {"S": pk}, ":since": {"S": f"{REF_SK_PREFIX}{max(0, since_ms):013d}"},
                ":end": {"S": REF_SK_PREFIX + "~"}, ":yes": {"BOOL": True},
            },
            "ProjectionExpression": "sk, vpk",
        }  # fmt: skip
        while len(found) < limit:
            page = self._client.query(**request)
            found.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return found[:limit]

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

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        """One conditional UpdateItem per verdict (unflagged, and still there): DynamoDB applies the
        conditional writes to one item one at a time, so replicas marking together count it once."""
        marked = 0
        with self._calls("mark verdicts"):
            for entry in {v.verdict_id: v for v in verdicts}.values():
                try:
                    self._client.update_item(
                        TableName=self.table,
                        Key=verdict_key(entry),
                        UpdateExpression="SET needs_revalidation = :yes, revalidation_cause = :cause, marked_ms = :now",
                        ConditionExpression="needs_revalidation = :no",
                        ExpressionAttributeValues={
                            ":yes": {"BOOL": True}, ":no": {"BOOL": False}, ":cause": {"S": bounded_cause(cause)},
                            ":now": {"N": str(now_ms)},
                        },
                    )  # fmt: skip
                except ClientError as exc:
                    if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                        continue  # marked already, or collected meanwhile
                    raise
                marked += 1
        return marked

    def verdict_usage(self) -> dict[str, ClientUsage]:
        with self._calls("verdict usage"):
            return self._usage()

    def _usage(self) -> dict[str, ClientUsage]:
        usage: dict[str, ClientUsage] = {}
        for shard in range(VERDICT_SHARDS):
            request: dict[str, Any] = {
                "TableName": self.table, "ConsistentRead": True, "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": f"{USAGE_PK_PREFIX}{shard}"}},
            }  # fmt: skip
            while True:
                page = self._client.query(**request)
                for item in page.get("Items", []):
                    held = usage.get(item["sk"]["S"], ClientUsage(0, 0))
                    usage[item["sk"]["S"]] = ClientUsage(
                        held.rows + int(item.get("n", {}).get("N", "0")),
                        held.bytes + int(item.get("b", {}).get("N", "0")),
                    )
                if "LastEvaluatedKey" not in page:
                    break
                request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return {c: ClientUsage(max(0, u.rows), max(0, u.bytes)) for c, u in usage.items() if u.rows > 0 or u.bytes > 0}

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000, *, max_bytes: int | None = None) -> int:
        """:func:`countersign.state.trim_by_share` over the usage counters. With ``collect=ttl`` this
        does nothing: DynamoDB's TTL deletes items without the counters knowing, so they would
        overstate what is held and the bounds would forget too much (retention alone bounds the log)."""
        if self.settings.collect == "ttl" or limit <= 0:
            return 0

        def forget_oldest(client: str, count: int) -> ClientUsage:
            items: list[Mapping[str, Any]] = []
            for shard in range(VERDICT_SHARDS):
                partition = {":pk": {"S": verdict_pk(client, shard)}}
                page = self._client.query(
                    TableName=self.table, ConsistentRead=True, Limit=count, KeyConditionExpression="pk = :pk",
                    ExpressionAttributeValues=partition,
                )  # fmt: skip
                items += page.get("Items", [])
            gone = [self._forget_item(item) for item in sorted(items, key=lambda i: i["sk"]["S"])[:count]]
            return ClientUsage(sum(g.rows for g in gone), sum(g.bytes for g in gone))

        with self._calls("trim verdicts"):
            return trim_by_share(self._usage(), max_rows, max_bytes, limit, forget_oldest)

    def verdict_count(self) -> int:
        with self._calls("verdict count"):
            return sum(u.rows for u in self._usage().values())

    def _move_legacy_verdicts(self) -> None:
        """The verdict items of the layout before issue 29 (``verdict#<s>``, records inline, an index
        item per key, record and deployer of each verdict) into the new one, marks kept, then gone;
        once per table (a marker item records it). Replicas doing it at once do the same writes."""
        marker = {"pk": {"S": SCHEMA_PK}, "sk": {"S": "version"}}
        with self._calls("move legacy verdicts"):
            if self._client.get_item(TableName=self.table, Key=marker, ConsistentRead=True).get("Item"):
                return
            request: dict[str, Any] = {
                "TableName": self.table, "ConsistentRead": True, "FilterExpression": "begins_with(pk, :old)",
                "ExpressionAttributeValues": {":old": {"S": LEGACY_VERDICT_PK_PREFIX}},
            }  # fmt: skip
            while True:
                page = self._client.scan(**request)
                for item in page.get("Items", []):
                    if item["sk"]["S"] == LEGACY_COUNT_SK:
                        self._client.delete_item(TableName=self.table, Key={"pk": item["pk"], "sk": item["sk"]})
                        continue
                    entry = legacy_entry(item)
                    self.record_verdict(entry)
                    for legacy in legacy_use_keys(entry, item):
                        self._client.delete_item(TableName=self.table, Key=legacy)
                    self._client.delete_item(TableName=self.table, Key={"pk": item["pk"], "sk": item["sk"]})
                if "LastEvaluatedKey" not in page:
                    break
                request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            self._client.put_item(TableName=self.table, Item={**marker, "v": {"N": "2"}})

    def close(self) -> None:
        self._client.close()
