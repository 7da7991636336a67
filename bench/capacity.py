"""What one receipt costs the signer's store (issue 28's capacity page; ``python -m bench --only capacity``).

A signer service is run in this process with a DynamoDB state whose client records every request instead
of sending it (the store's own code path builds each request as it would for AWS), and issues receipts
under a delegated agent (a depth-2 agent record, so each receipt's path has three records, as a
delegated worker's receipts do) with a request id each, as the SDK sends them. For each call it counts
the requests and items the store sent and sizes every item by DynamoDB's rules (attribute names plus
values; a write unit per KB of item, twice that inside a transaction; a strongly consistent read unit
per 4 KB). It does the same for one ``StreamReceipts`` call, whose chunks are decided from the session
the stream's last write left (ADR 0033), so only its first chunk reads. The SQL stores write the same
rows (one per item); their commits are shared by concurrent receipts (``python -m bench --only signing``
measures how many). Last, what one ``VerifyPath`` costs a verifier's DynamoDB store, the requests its own
code sends to moto in this process.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections import Counter
from typing import Any

import prometheus_client

from bench.issuance import _Context, _Registry
from countersign._proto.v1 import signer_pb2, verifier_pb2
from countersign.client.tls import TlsConfig
from countersign.cosigning import root_write
from countersign.records import Construction, Path
from countersign.samples import SampleMesh
from signer.config import SignerConfig
from signer.daemon import SignerMetrics, SignerService
from signer.stores.dynamodb import DynamoDbState

RECEIPTS = 200


def item_bytes(item: dict[str, dict[str, Any]]) -> int:
    """An item's size as DynamoDB counts it: each attribute's name plus its value."""
    size = 0
    for name, value in item.items():
        size += len(name.encode())
        ((kind, raw),) = value.items()
        if kind == "S":
            size += len(raw.encode())
        elif kind == "B":
            size += len(raw)
        elif kind == "N":
            size += math.ceil(len(raw.lstrip("-").replace(".", "")) / 2) + 1
        else:  # BOOL, NULL
            size += 1
    return size


class _StreamContext(_Context):
    """A gRPC context for a stream: the lane slot a stream holds is given back by its end callback."""

    def add_callback(self, callback: Any) -> bool:
        return True


class RecordingClient:
    """A stand-in DynamoDB client that keeps every request and answers reads from the items it was
    given to put (enough for a signer issuing receipts: records, sessions and request ids are puts)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._items: dict[tuple[str, str], dict[str, Any]] = {}

    def describe_table(self, **request: Any) -> dict[str, Any]:
        return {"Table": {"KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"},
                                        {"AttributeName": "sk", "KeyType": "RANGE"}],
                          "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"},
                                                   {"AttributeName": "sk", "AttributeType": "S"}]}}  # fmt: skip

    def batch_get_item(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("BatchGetItem", request))
        ((table, asked),) = request["RequestItems"].items()
        found = [
            self._items[(k["pk"]["S"], k["sk"]["S"])]
            for k in asked["Keys"]
            if (k["pk"]["S"], k["sk"]["S"]) in self._items
        ]
        return {"Responses": {table: found}}

    def transact_write_items(self, **request: Any) -> dict[str, Any]:
        self.calls.append(("TransactWriteItems", request))
        for part in request["TransactItems"]:
            if "Put" in part:
                item = part["Put"]["Item"]
                self._items[(item["pk"]["S"], item["sk"]["S"])] = item
        return {}


def _write_units(request: dict[str, Any]) -> tuple[int, int]:
    """(items, write units) of one TransactWriteItems."""
    return len(request["TransactItems"]), int(_units("TransactWriteItems", request, {})[1])


def run(quick: bool = False) -> dict[str, Any]:
    mesh = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"bench-capacity")
    config = SignerConfig(
        deployer="deployer-b", signer_key="", operator_public_key="", coordinator="", registry_cache="",
        tls=TlsConfig(insecure_loopback=True),
    )  # fmt: skip
    client = RecordingClient()
    state = DynamoDbState("dynamodb://capacity?region=eu-west-1", client=client)
    follower = _Registry(mesh.registry)
    metrics = SignerMetrics(prometheus_client.CollectorRegistry(), follower)  # type: ignore[arg-type]
    service = SignerService(config, mesh.signers["deployer-b"], state, follower, metrics)  # type: ignore[arg-type]
    # A delegated agent of deployer-b under deployer-a's root: its receipts' paths have three records.
    now = time.time_ns() // 1_000_000
    agent = Path(mesh.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"",
                                 now_ms=now).envelopes[:2])  # fmt: skip
    state.apply([root_write(agent, agent.to_bytes())])  # as if this signer had issued it
    context: Any = _Context()
    count = 50 if quick else RECEIPTS
    digest = hashlib.sha256(b"an output").digest()
    path_bytes = []
    for index in range(count):
        client.calls.clear()  # what the last receipt cost is left for the report
        answer = service.IssueReceipt(signer_pb2.IssueReceiptRequest(
            parent_path=agent.to_bytes(), output_sha256=digest, session="capacity", request_id=f"req-{index:08d}",
        ), context)  # fmt: skip
        path_bytes.append(len(answer.path))
    reads = [c for c in client.calls if c[0] == "BatchGetItem"]
    writes = [c for c in client.calls if c[0] == "TransactWriteItems"]
    items, units = _write_units(writes[0][1])
    read_keys = len(reads[0][1]["RequestItems"]["capacity"]["Keys"])
    # One stream of ``count`` chunks (256 bytes each, one receipt each), with a request id as the SDK sends.
    client.calls.clear()
    first = signer_pb2.OutputChunk(parent_path=agent.to_bytes(), session="capacity-stream", unit="bytes", n=256,
                                   request_id="stream-00000001")  # fmt: skip
    chunks = [first, *(signer_pb2.OutputChunk(data=b"t" * 256) for _ in range(count))]
    streamed = list(service.StreamReceipts(iter(chunks), _StreamContext()))
    stream_reads = [c for c in client.calls if c[0] == "BatchGetItem"]
    stream_writes = [c for c in client.calls if c[0] == "TransactWriteItems"]
    stream_units = [_write_units(request)[1] for _, request in stream_writes]
    return {
        "receipts": count,
        "path_bytes": statistics.median(path_bytes),
        "reads_per_receipt": len(reads),
        "read_keys": read_keys,
        "read_units": read_keys,  # each key read strongly consistent: one unit per 4 KB, an absent item one
        "writes_per_receipt": len(writes),
        "items_per_write": items,
        "write_units": units,
        "stream_receipts": len(streamed),
        "stream_reads": len(stream_reads),
        "stream_read_units": sum(len(r["RequestItems"]["capacity"]["Keys"]) for _, r in stream_reads),
        "stream_writes": len(stream_writes),
        "stream_write_units": statistics.median(stream_units),
        "verifier": verifier_costs(10 if quick else 20),
    }


def report(results: dict[str, Any]) -> str:
    return "\n".join([
        f"What one receipt costs the signer's store (a receipt path of {results['path_bytes']:,.0f} bytes, three"
        " records; median of the receipts issued)",
        "",
        "| per receipt | DynamoDB | SQL stores |",
        "|---|---:|---:|",
        f"| reads | {results['reads_per_receipt']} BatchGetItem of {results['read_keys']} keys,"
        f" {results['read_units']} strongly consistent read units | one statement |",
        f"| writes | {results['writes_per_receipt']} TransactWriteItems of {results['items_per_write']} items,"
        f" {results['write_units']} write units | {results['items_per_write']} rows, in a commit shared with"
        " concurrent receipts |",
        "",
        f"One StreamReceipts call of {results['stream_receipts']} chunks (one receipt each): "
        f"{results['stream_reads']} BatchGetItem in all ({results['stream_read_units']} read units, "
        f"{results['stream_read_units'] / results['stream_receipts']:.2f} a receipt), "
        f"{results['stream_writes']} TransactWriteItems ({results['stream_write_units']:.0f} write units each).",
        "",
        "What one VerifyPath costs a verifier's DynamoDB store (replay state and verdict log in one table), a depth-5",
        "SIGNED-DAG path whose records are all new to the log (the most a verdict writes), mean per call:",
        "",
        "| call | requests | read units | write units | requests by operation |",
        "|---|---:|---:|---:|---|",
        *(
            f"| {label} | {row['requests']:.1f} | {row['read_units']:.1f} | {row['write_units']:.1f} | "
            + ", ".join(f"{name} {n:.0f}" for name, n in sorted(row["operations"].items()))
            + " |"
            for label, row in (
                ("accept, a new path", results["verifier"]["accept"]),
                ("audit, a new path", results["verifier"]["audit"]),
                ("accept, the same path again (NONCE_REPLAYED)", results["verifier"]["replay"]),
            )
        ),
    ])  # fmt: skip


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)


# --- the verifier's side: one VerifyPath against a DynamoDB store ------------------------------------


class _VerifyContext:
    """A plaintext caller of VerifyPath in this process (the verifier runs without require_identity)."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return "in-process"

    def abort_with_status(self, status: Any) -> None:
        raise RuntimeError(f"VerifyPath aborted: {status}")


class CountingClient:
    """A real DynamoDB client (here moto's, in this process) that keeps every request and its answer."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        operation = self._client.meta.method_to_api_mapping.get(name)
        if operation is None:  # not a DynamoDB request (meta, exceptions, paginators)
            return method

        def counted(**request: Any) -> Any:
            answer = method(**request)
            self.calls.append((operation, request, answer))
            return answer

        return counted


def _units(operation: str, request: dict[str, Any], answer: dict[str, Any]) -> tuple[float, float]:
    """(read units, write units) of one request by DynamoDB's rules: a strongly consistent read a unit per
    4 KB of each item (an absent one: one), a write a unit per KB, twice either inside a transaction."""

    def written(item: dict[str, Any]) -> int:
        return math.ceil(max(item_bytes(item), 1) / 1024)

    def put_or_update(body: dict[str, Any]) -> dict[str, Any]:
        """A Put's item, or an Update's key and new values (a Delete or a ConditionCheck: its key)."""
        values = body.get("ExpressionAttributeValues", {}) if "UpdateExpression" in body else {}
        return body.get("Item") or {**body["Key"], **{k.strip(":"): v for k, v in values.items()}}

    def read(items: list[dict[str, Any]], asked: int) -> int:
        return sum(math.ceil(max(item_bytes(i), 1) / 4096) for i in items) + max(0, asked - len(items))

    if operation == "TransactWriteItems":
        total = 0
        for part in request["TransactItems"]:
            ((_, body),) = part.items()
            total += 2 * written(put_or_update(body))
        return 0.0, float(total)
    if operation == "BatchWriteItem":
        parts = [p for requests in request["RequestItems"].values() for p in requests]
        return 0.0, float(sum(written(p["PutRequest"]["Item"] if "PutRequest" in p else p["DeleteRequest"]["Key"])
                              for p in parts))  # fmt: skip
    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        return 0.0, float(written(put_or_update(request)))
    if operation == "BatchGetItem":
        asked = sum(len(t["Keys"]) for t in request["RequestItems"].values())
        return float(read([i for items in answer.get("Responses", {}).values() for i in items], asked)), 0.0
    if operation == "TransactGetItems":
        items = [r["Item"] for r in answer.get("Responses", []) if "Item" in r]
        return 2.0 * read(items, len(request["TransactItems"])), 0.0
    if operation == "GetItem":
        return float(read([answer["Item"]] if "Item" in answer else [], 1)), 0.0
    if operation == "Query":
        return float(math.ceil(max(sum(item_bytes(i) for i in answer.get("Items", [])), 1) / 4096)), 0.0
    return 0.0, 0.0


def verifier_costs(count: int) -> dict[str, dict[str, float]]:
    """What one VerifyPath costs a verifier's DynamoDB store (its replay state and its verdict log), per
    kind of call, averaged over ``count`` calls each: an accept of a new depth-5 path, an audit of one,
    and the same path accepted again (the replay, refused). Against moto in this process (``mock_aws``):
    the requests are the store's own; the units are counted from them by DynamoDB's rules."""
    import boto3
    from moto import mock_aws

    from countersign.verify import DEFAULT_POLICY
    from verifier.daemon import VerifierMetrics, VerifierService
    from verifier.stores.dynamodb import DynamoDbState as VerifierDynamoDb
    from verifier.stores.dynamodb import ensure_table
    from verifier.verdict_log import VerdictLogMetrics, VerdictRecorder

    deployers = ["deployer-a", "deployer-b", "deployer-c"]
    mesh = SampleMesh.create(deployers, seed=b"bench-capacity-verifier")
    output = b"an output\n"
    url = "dynamodb://capacity-verifier?region=us-east-1"
    with mock_aws():
        ensure_table(url)
        client = CountingClient(boto3.client("dynamodb", region_name="us-east-1"))
        store = VerifierDynamoDb(url, client=client)
        follower = _Registry(mesh.registry)
        metrics_registry = prometheus_client.CollectorRegistry()
        metrics = VerifierMetrics(metrics_registry, follower)  # type: ignore[arg-type]
        log_metrics = VerdictLogMetrics(metrics_registry, store)
        recorder = VerdictRecorder(
            store, log_metrics, metrics.errors, lambda: mesh.registry, enabled=True, retention_ms=3_600_000
        )
        service = VerifierService(
            state=store, follower=follower, policy=DEFAULT_POLICY, metrics=metrics,  # type: ignore[arg-type]
            verdicts=recorder, verdict_log_metrics=log_metrics, require_identity=False,
        )  # fmt: skip
        context: Any = _VerifyContext()
        results: dict[str, dict[str, float]] = {}
        for kind in ("accept", "audit", "replay"):
            calls: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
            for index in range(count):
                path = mesh.issue_path(Construction.SIGNED_DAG, [*deployers, "deployer-a", "deployer-b"], output,
                                       now_ms=time.time_ns() // 1_000_000)  # fmt: skip
                mode = (
                    verifier_pb2.VerifyPathRequest.AUDIT if kind == "audit" else verifier_pb2.VerifyPathRequest.ACCEPT
                )
                request = verifier_pb2.VerifyPathRequest(path=path.to_bytes(), output=output, mode=mode,
                                                         request_id=f"{kind}-{index}")  # fmt: skip
                if kind == "replay":
                    first = service.VerifyPath(request, context)
                    assert first.verdict.verdict == first.verdict.ACCEPT, first.verdict.reason
                    request.request_id = f"{kind}-{index}-again"
                client.calls.clear()
                answer = service.VerifyPath(request, context)
                expected = "NONCE_REPLAYED" if kind == "replay" else ""
                assert answer.verdict.reason == expected, (kind, answer.verdict.reason)
                calls += client.calls
            units = [_units(operation, request, answer) for operation, request, answer in calls]
            results[kind] = {
                "requests": len(calls) / count,
                "read_units": sum(u[0] for u in units) / count,
                "write_units": sum(u[1] for u in units) / count,
                "operations": {name: n / count for name, n in Counter(c[0] for c in calls).items()},  # type: ignore[dict-item]
            }
        store.close()
    return results
