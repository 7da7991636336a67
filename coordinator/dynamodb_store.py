"""The registry log in DynamoDB, shared by coordinator replicas in every zone.

URL and table shape: :mod:`countersign._daemon.dynamodb` (its own table; nothing here expires, so the
TTL attribute is never set). Items:

=================  ======================  ==================================================
pk                 sk                      attributes
=================  ======================  ==================================================
``log``            ``<sequence, 20 digits>``  ``digest``, ``statement`` (B)
``checkpoint``     ``-``                   ``checkpoint`` (B), ``sequence``, ``issued_ms``
=================  ======================  ==================================================

An append is one TransactWriteItems: the statement's item conditioned on ``attribute_not_exists(pk)``
(a sequence is taken once) and, with it, the checkpoint item conditioned on the stored one not being
newer. The log is read with a strongly consistent Query of its one partition (a registry holds a few
statements per deployer: thousands, not millions).
"""

from __future__ import annotations

import uuid
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from coordinator.store import LogConflict, StoredCheckpoint, statements_in_order
from countersign._daemon.dynamodb import (
    calls,
    cancellation_codes,
    check_table,
    error_text,
    make_client,
    parse_dynamodb_url,
)
from countersign.errors import StateUnavailable

LOG_PK = "log"
CHECKPOINT_KEY = {"pk": {"S": "checkpoint"}, "sk": {"S": "-"}}
_NOT_OLDER = "attribute_not_exists(pk) OR (#seq <= :seq AND issued_ms <= :issued)"


def _sk(sequence: int) -> str:
    return f"{sequence:020d}"


class DynamoDbLogStore:
    def __init__(self, url: str, *, client: Any | None = None) -> None:
        self.settings = parse_dynamodb_url(url)
        self.table = self.settings.table
        self._client = client if client is not None else make_client(self.settings)
        check_table(self._client, self.table)

    def load(self, start: int = 0) -> list[bytes]:
        request: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True,
            "KeyConditionExpression": "pk = :pk AND sk >= :from",
            "ExpressionAttributeValues": {":pk": {"S": LOG_PK}, ":from": {"S": _sk(start)}},
        }  # fmt: skip
        rows: list[tuple[int, bytes]] = []
        with calls(self.table, "load"):
            while True:
                page = self._client.query(**request)
                rows += [(int(item["sk"]["S"]), bytes(item["statement"]["B"])) for item in page.get("Items", [])]
                if "LastEvaluatedKey" not in page:
                    break
                request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return statements_in_order(start, rows)

    def _checkpoint_put(self, checkpoint: StoredCheckpoint) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "Item": {**CHECKPOINT_KEY, "checkpoint": {"B": checkpoint.data},
                     "sequence": {"N": str(checkpoint.sequence)}, "issued_ms": {"N": str(checkpoint.issued_ms)}},
            "ConditionExpression": _NOT_OLDER,
            "ExpressionAttributeNames": {"#seq": "sequence"},
            "ExpressionAttributeValues": {":seq": {"N": str(checkpoint.sequence)},
                                          ":issued": {"N": str(checkpoint.issued_ms)}},
        }  # fmt: skip

    def append(self, sequence: int, digest: str, statement: bytes, checkpoint: StoredCheckpoint | None = None) -> None:
        items: list[dict[str, Any]] = [{"Put": {
            "TableName": self.table,
            "Item": {"pk": {"S": LOG_PK}, "sk": {"S": _sk(sequence)}, "digest": {"S": digest},
                     "statement": {"B": statement}},
            "ConditionExpression": "attribute_not_exists(pk)",
        }}]  # fmt: skip
        if checkpoint is not None:
            items.append({"Put": self._checkpoint_put(checkpoint)})
        try:
            self._client.transact_write_items(TransactItems=items, ClientRequestToken=str(uuid.uuid4()))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                codes = cancellation_codes(exc)
                if codes and codes[0] == "ConditionalCheckFailed":
                    raise LogConflict(f"sequence {sequence} is already stored") from None
                if "ConditionalCheckFailed" in codes:
                    raise LogConflict("a newer checkpoint is stored") from None
            raise StateUnavailable(f"DynamoDB table {self.table} (append): {error_text(exc)}") from exc
        except BotoCoreError as exc:
            raise StateUnavailable(f"DynamoDB table {self.table} (append): {error_text(exc)}") from exc

    def load_checkpoint(self) -> bytes | None:
        with calls(self.table, "load checkpoint"):
            item = self._client.get_item(TableName=self.table, Key=CHECKPOINT_KEY, ConsistentRead=True).get("Item")
        return None if item is None else bytes(item["checkpoint"]["B"])

    def store_checkpoint(self, checkpoint: StoredCheckpoint) -> bool:
        try:
            self._client.put_item(**self._checkpoint_put(checkpoint))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise StateUnavailable(f"DynamoDB table {self.table} (store checkpoint): {error_text(exc)}") from exc
        except BotoCoreError as exc:
            raise StateUnavailable(f"DynamoDB table {self.table} (store checkpoint): {error_text(exc)}") from exc
        return True

    def close(self) -> None:
        return None
