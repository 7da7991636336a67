"""``dynamodb://TABLE?region=…``: the signer's state in one DynamoDB table (one per deployer), shared by
the deployer's signer replicas in every availability zone.

URL and table shape: :mod:`countersign._daemon.dynamodb`. Items (``<x>`` a digest, id or nonce; every
item carries ``expires_ms`` and the TTL attribute ``expires_at``):

============================  =================  ===========================================
pk                            sk                 attributes
============================  =================  ===========================================
``issued#<record digest>``    ``-``              ``path`` (B)
``parent#<parent digest>``    ``count``          ``n``: children recorded
``parent#<parent digest>``    ``child#<nonce>``
``session#<agent digest>``    ``s#<session id>`` ``seq``, ``last_digest``, ``closed``, ``stream_unit``, ``stream_n``
``grant#<grant id>``          ``-``              ``parent``, ``child_deployer``, ``manifest_digest``, ``parent_cosig``
``proposal#<grant id>``       ``-``              ``parent``, ``child_record`` (B), ``child_cosig``, ``sealed_path`` (B)
``request#<request id>``      ``-``              ``fingerprint``, ``answer`` (B), ``record``
============================  =================  ===========================================

A read is one strongly consistent BatchGetItem. A write is one TransactWriteItems whose every part
carries its condition (a new item ``attribute_not_exists(pk)``, a session ``seq = :previous``, a child
count ``n < :max``, a grant or proposal still unspent or unsealed), so DynamoDB, which applies the
conditional writes of one item serially, lets exactly one of any number of concurrent writers through;
the others are cancelled whole (a conflict). There is no shared commit to batch, so concurrent calls
write concurrently (``batches`` is False). Each call carries a ClientRequestToken: botocore's own retry
of a transaction that committed but whose answer was lost is answered as the first attempt.

Collection (URL parameter ``collect``): ``scan`` (default) deletes expired items found by a bounded,
resumable Scan (``collect_expired``), each delete conditioned on the item still being expired, and
DynamoDB's TTL removes what the sweep has not reached (it deletes only after expiry, so it never takes
a live item); ``ttl`` leaves every expired item to TTL, which costs no capacity. Either is safe: an
expired item is never used (an expired parent, grant or session is refused by its expiry, and a request
id's answer kept past its expiry answers its retry as before). An item holds at most 400 KB: a path larger than
:data:`MAX_BLOB_BYTES` is refused (INVALID_ARGUMENT), never truncated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from countersign._daemon.dynamodb import (
    calls,
    cancellation_codes,
    check_table,
    error_text,
    expires_at,
    make_client,
    parse_dynamodb_url,
    split_collect_mode,
)
from countersign.errors import MalformedError, StateUnavailable
from countersign.records import StreamUnit
from countersign.signer_state import (
    COLLECTED_TABLES,
    Proposal,
    RequestRecord,
    SessionState,
    StateReads,
    StateView,
    StateWrite,
    StoredGrant,
)

MAX_BLOB_BYTES = 380_000  # below DynamoDB's 400 KB item limit, with room for the item's other attributes
_NONE = "-"
_CONFLICTS = frozenset({"ConditionalCheckFailed", "TransactionConflict"})
# Which table of the SQL backends each kind of item stands for (collection counts).
_TABLE_OF = {"issued": "issued", "session": "agent_sessions", "grant": "grants", "proposal": "proposals",
             "request": "requests"}  # fmt: skip

Item = dict[str, dict[str, Any]]


def _key(pk: str, sk: str = _NONE) -> Item:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _issued_key(digest: str) -> Item:
    return _key(f"issued#{digest}")


def _count_key(parent: str) -> Item:
    return _key(f"parent#{parent}", "count")


def _child_key(parent: str, nonce: str) -> Item:
    return _key(f"parent#{parent}", f"child#{nonce}")


def _session_key(agent: str, session: str) -> Item:
    return _key(f"session#{agent}", f"s#{session}")


def _grant_key(grant_id: str) -> Item:
    return _key(f"grant#{grant_id}")


def _proposal_key(grant_id: str) -> Item:
    return _key(f"proposal#{grant_id}")


def _request_key(request_id: str) -> Item:
    return _key(f"request#{request_id}")


def _blob(data: bytes, what: str) -> dict[str, bytes]:
    if len(data) > MAX_BLOB_BYTES:
        raise MalformedError(
            f"{what} is {len(data)} bytes; this signer's DynamoDB state keeps at most {MAX_BLOB_BYTES}"
        )
    return {"B": data}


def _expiry(expires_ms: int) -> Item:
    return {"expires_ms": {"N": str(expires_ms)}, "expires_at": {"N": expires_at(expires_ms)}}


def _text(value: str | None) -> dict[str, Any]:
    return {"NULL": True} if value is None else {"S": value}


def _new(table: str, key: Item, attributes: Item) -> dict[str, Any]:
    """A Put of an item that must not exist yet."""
    return {
        "Put": {"TableName": table, "Item": {**key, **attributes}, "ConditionExpression": "attribute_not_exists(pk)"}
    }


class DynamoDbState:
    batches = False
    _KINDS = ("issued", "count", "session", "grant", "proposal", "request")

    def __init__(self, url: str, *, client: Any | None = None) -> None:
        table_url, self.collect = split_collect_mode(url)
        self.settings = parse_dynamodb_url(table_url)
        self.table = self.settings.table
        self._client = client if client is not None else make_client(self.settings)
        self._scan_cursor: dict[str, Any] | None = None
        check_table(self._client, self.table)

    # --- read ----------------------------------------------------------------------------------------

    def read(self, reads: StateReads) -> StateView:
        keys: dict[str, Item] = {}
        if reads.issued is not None:
            keys["issued"] = _issued_key(reads.issued)
        if reads.children_of is not None:
            keys["count"] = _count_key(reads.children_of)
        if reads.session is not None:
            keys["session"] = _session_key(*reads.session)
        if reads.grant is not None:
            keys["grant"] = _grant_key(reads.grant)
        if reads.proposal is not None:
            keys["proposal"] = _proposal_key(reads.proposal)
        if reads.request is not None:
            keys["request"] = _request_key(reads.request)
        found = self._get(keys)
        return _view(reads, found)

    def _get(self, keys: Mapping[str, Item]) -> dict[str, Item]:
        """The items at ``keys`` (by the name each was asked under), strongly consistent."""
        if not keys:
            return {}
        by_key = {(k["pk"]["S"], k["sk"]["S"]): name for name, k in keys.items()}
        request = {self.table: {"Keys": list(keys.values()), "ConsistentRead": True}}
        found: dict[str, Item] = {}
        with calls(self.table, "read"):
            for _ in range(8):  # unprocessed keys (throttling) are asked again
                answer = self._client.batch_get_item(RequestItems=request)
                for item in answer.get("Responses", {}).get(self.table, []):
                    found[by_key[(item["pk"]["S"], item["sk"]["S"])]] = item
                request = answer.get("UnprocessedKeys") or {}
                if not request:
                    return found
        raise StateUnavailable(f"DynamoDB table {self.table} (read): keys left unprocessed after 8 attempts")

    # --- write ---------------------------------------------------------------------------------------

    def apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        return [self._apply(write) for write in writes]

    def _apply(self, write: StateWrite) -> bool:
        items = self._transaction(write)
        if items is None:
            return False
        if not items:
            return True  # nothing to write holds no condition
        try:
            self._client.transact_write_items(TransactItems=items, ClientRequestToken=str(uuid.uuid4()))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                codes = cancellation_codes(exc)
                if any(code in _CONFLICTS for code in codes):
                    return False
            raise StateUnavailable(f"DynamoDB table {self.table} (write): {error_text(exc)}") from exc
        except BotoCoreError as exc:
            raise StateUnavailable(f"DynamoDB table {self.table} (write): {error_text(exc)}") from exc
        return True

    def _transaction(self, write: StateWrite) -> list[dict[str, Any]] | None:
        """The TransactWriteItems of ``write``; None when a condition cannot hold whatever is stored."""
        table = self.table
        items: list[dict[str, Any]] = []
        # Conditions hold against the state before the write: a grant (proposal) the same write creates
        # cannot be spent (sealed) by it. DynamoDB would refuse two operations on one item anyway.
        if write.new_grant is not None and write.spend is not None and write.spend.grant_id == write.new_grant.grant_id:
            return None
        if write.proposal is not None and write.seal is not None and write.seal.grant_id == write.proposal.grant_id:
            return None
        for record in {record.digest: record for record in reversed(write.issued)}.values():  # each item once
            item = {**_issued_key(record.digest), "path": _blob(record.path, "a path"), **_expiry(record.expires_ms)}
            items.append({"Put": {"TableName": table, "Item": item}})
        if (child := write.child) is not None:
            if child.max_children < 1:
                return None
            items.append(_new(table, _child_key(child.parent, child.nonce), _expiry(child.expires_ms)))
            items.append({"Update": {
                "TableName": table, "Key": _count_key(child.parent),
                "UpdateExpression": "ADD n :one SET expires_ms = :e, expires_at = :t",
                "ConditionExpression": "attribute_not_exists(n) OR n < :max",
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"}, ":max": {"N": str(child.max_children)},
                    ":e": {"N": str(child.expires_ms)}, ":t": {"N": expires_at(child.expires_ms)},
                },
            }})  # fmt: skip
        if (update := write.session) is not None:
            state = update.state
            assert state.agent is not None
            attributes: Item = {
                "seq": {"N": str(state.last_seq)}, "last_digest": {"S": state.last_digest},
                "closed": {"BOOL": state.closed},
                "stream_unit": _text(None if state.stream is None else state.stream[0].value),
                "stream_n": {"NULL": True} if state.stream is None else {"N": str(state.stream[1])},
                **_expiry(update.expires_ms),
            }  # fmt: skip
            key = _session_key(state.agent, state.session)
            if update.previous_seq is None:
                items.append(_new(table, key, attributes))
            else:
                items.append({"Put": {
                    "TableName": table, "Item": {**key, **attributes}, "ConditionExpression": "seq = :previous",
                    "ExpressionAttributeValues": {":previous": {"N": str(update.previous_seq)}},
                }})  # fmt: skip
        if (grant := write.new_grant) is not None:
            items.append(_new(table, _grant_key(grant.grant_id), {
                "parent": {"S": grant.parent}, "child_deployer": {"S": grant.child_deployer},
                **_expiry(grant.expires_ms),
            }))  # fmt: skip
        if (spend := write.spend) is not None:
            items.append({"Update": {
                "TableName": table, "Key": _grant_key(spend.grant_id),
                "UpdateExpression": "SET manifest_digest = :m, parent_cosig = :c",
                "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(manifest_digest)",
                "ExpressionAttributeValues": {":m": {"S": spend.manifest_digest}, ":c": {"S": spend.parent_cosig}},
            }})  # fmt: skip
        if (proposal := write.proposal) is not None:
            items.append(_new(table, _proposal_key(proposal.grant_id), {
                "parent": {"S": proposal.parent}, "child_record": _blob(proposal.child_record, "a child record"),
                "child_cosig": {"S": proposal.child_cosig}, **_expiry(proposal.expires_ms),
            }))  # fmt: skip
        if (seal := write.seal) is not None:
            items.append({"Update": {
                "TableName": table, "Key": _proposal_key(seal.grant_id), "UpdateExpression": "SET sealed_path = :p",
                "ConditionExpression": "attribute_exists(pk) AND attribute_not_exists(sealed_path)",
                "ExpressionAttributeValues": {":p": _blob(seal.path, "a path")},
            }})  # fmt: skip
        if (request := write.request) is not None:
            items.append(_new(table, _request_key(request.request_id), {
                "fingerprint": {"S": request.fingerprint}, "answer": _blob(request.answer, "an answer"),
                **({"record": {"S": request.record}} if request.record else {}), **_expiry(request.expires_ms),
            }))  # fmt: skip
        return items

    # --- collection ----------------------------------------------------------------------------------

    def collect_expired(self, cutoff_ms: int, limit: int) -> dict[str, int]:
        """Delete at most ``limit`` items that expired before ``cutoff_ms``, found by a consistent Scan
        that resumes where the last call stopped and reads at most ``max(4 * limit, 1000)`` items a
        call (a pass costs bounded read capacity however large the table; DynamoDB's TTL takes what
        the sweep has not reached yet). With ``collect=ttl``, nothing: TTL alone (module docstring)."""
        removed = dict.fromkeys(COLLECTED_TABLES, 0)
        if self.collect == "ttl" or limit <= 0:
            return removed
        budget = max(4 * limit, 1000)
        deleted = scanned = 0
        wrapped = self._scan_cursor is None  # started at the table's start: one pass ends at its end
        with calls(self.table, "collect"):
            while deleted < limit and scanned < budget:
                request: dict[str, Any] = {
                    # A page finds at most Limit items, so the deletes never pass ``limit``.
                    "TableName": self.table, "ConsistentRead": True, "Limit": min(limit - deleted, budget - scanned),
                    "ProjectionExpression": "pk, sk", "FilterExpression": "expires_ms < :cutoff",
                    "ExpressionAttributeValues": {":cutoff": {"N": str(cutoff_ms)}},
                }  # fmt: skip
                if self._scan_cursor is not None:
                    request["ExclusiveStartKey"] = self._scan_cursor
                page = self._client.scan(**request)
                scanned += int(page.get("ScannedCount", 0)) or 1  # at least one, so a call always ends
                for item in page.get("Items", []):
                    if self._delete_expired(item, cutoff_ms):
                        removed[_table_of(item)] += 1
                        deleted += 1
                self._scan_cursor = page.get("LastEvaluatedKey")
                if self._scan_cursor is None:
                    if wrapped:
                        break  # one whole pass over the table
                    wrapped = True  # started mid-table: go round once to cover its start
        return removed

    def _delete_expired(self, key: Item, cutoff_ms: int) -> bool:
        try:
            self._client.delete_item(
                TableName=self.table, Key={"pk": key["pk"], "sk": key["sk"]},
                ConditionExpression="expires_ms < :cutoff",
                ExpressionAttributeValues={":cutoff": {"N": str(cutoff_ms)}},
            )  # fmt: skip
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False  # written again since the scan, or already gone
            raise
        return True

    def row_counts(self) -> dict[str, int] | None:
        return None  # a count would scan the whole table; CloudWatch's ItemCount says as much

    def count_rows(self) -> dict[str, int]:
        """Items per table by a full Scan: for tests and small tables only."""
        counts = dict.fromkeys(COLLECTED_TABLES, 0)
        request: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True, "ProjectionExpression": "pk, sk"}
        with calls(self.table, "count"):
            while True:
                page = self._client.scan(**request)
                for item in page.get("Items", []):
                    counts[_table_of(item)] += 1
                if "LastEvaluatedKey" not in page:
                    return counts
                request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def close(self) -> None:
        return None


def _table_of(item: Item) -> str:
    kind = item["pk"]["S"].split("#", 1)[0]
    if kind == "parent":
        return "child_counts" if item["sk"]["S"] == "count" else "children"
    return _TABLE_OF[kind]


def _view(reads: StateReads, found: Mapping[str, Item]) -> StateView:
    issued = found.get("issued")
    count = found.get("count")
    session = grant = proposal = request = None
    if (item := found.get("session")) is not None and reads.session is not None:
        agent, name = reads.session
        unit = item.get("stream_unit", {}).get("S")
        stream = None if unit is None else (StreamUnit(unit), int(item["stream_n"]["N"]))
        session = SessionState(
            name, agent, int(item["seq"]["N"]), item["last_digest"]["S"], bool(item["closed"]["BOOL"]), stream
        )
    if (item := found.get("grant")) is not None and reads.grant is not None:
        grant = StoredGrant(
            reads.grant, item["parent"]["S"], item["child_deployer"]["S"], int(item["expires_ms"]["N"]),
            item.get("manifest_digest", {}).get("S"), item.get("parent_cosig", {}).get("S"),
        )  # fmt: skip
    if (item := found.get("proposal")) is not None and reads.proposal is not None:
        sealed = item.get("sealed_path", {}).get("B")
        proposal = Proposal(
            reads.proposal, item["parent"]["S"], bytes(item["child_record"]["B"]), item["child_cosig"]["S"],
            int(item["expires_ms"]["N"]), None if sealed is None else bytes(sealed),
        )  # fmt: skip
    if (item := found.get("request")) is not None and reads.request is not None:
        request = RequestRecord(
            reads.request, item["fingerprint"]["S"], bytes(item["answer"]["B"]), int(item["expires_ms"]["N"]),
            item.get("record", {}).get("S", ""),
        )  # fmt: skip
    return StateView(
        issued=None if issued is None else bytes(issued["path"]["B"]),
        child_count=0 if count is None else int(count["n"]["N"]),
        session=session,
        grant=grant,
        proposal=proposal,
        request=request,
    )
