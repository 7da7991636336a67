"""The DynamoDB verifier store's items: keys, and items to and from the domain objects
(:mod:`countersign.state`). No request is made here; :class:`verifier.stores.dynamodb.DynamoDbState`
makes them. Values are in DynamoDB's attribute-value form (``{"S": ...}``, ``{"N": ...}``).

One table, hash key ``pk`` (S), range key ``sk`` (S), TTL on ``expires_at`` (epoch seconds). Replay state:

============================  =======================  ==========================================================
pk                            sk                       attributes
============================  =======================  ==========================================================
``nonce#<nonce>``             ``nonce``                ``retain_until_ms``, ``accepted_ms``, ``request_id``, TTL
``parent#<parent digest>``    ``count``                ``n`` (children recorded), ``retain_until_ms``, TTL
``parent#<parent digest>``    ``child#<child nonce>``  ``retain_until_ms``, TTL
============================  =======================  ==========================================================

The verdict log (issue 29: what repeats stored once per client identity). ``<c>`` is a client identity's
key (16 hex digits of its SHA-256), ``<s>`` a shard (0 to ``VERDICT_SHARDS - 1``), ``<t>`` a time in
ms (13 digits), ``<d>`` a path's digest in hex:

================================  ======================  ===========================================
pk                                sk                      attributes
================================  ======================  ===========================================
``verdicts#<c>#<s>``              ``<t>#<verdict id>``    the entry, ``path`` (``<d>``), ``bytes``,
                                                          ``needs_revalidation``, retention, TTL
``vpath#<c>#<d>``                 ``path``                ``client``, ``construction``, ``records``
                                                          (JSON), ``bytes``, retention, TTL
``vpath#<c>#<d>``                 ``v#<t>#<verdict id>``  ``vpk`` (the verdict's pk), ``accepted``: a ref
``vuse#<kind>#<value>#<s>``       ``<c>#<d>``             an index entry of the path (retention, TTL)
``vusage#<s>``                    ``<client>``            ``n`` verdicts and ``b`` bytes held there
``schema#verdict-log``            ``version``             the layout before issue 29 was moved over
================================  ======================  ===========================================

The layout before issue 29 (``verdict#<s>`` items with their records inline, ``uses#...`` index items)
is read by :func:`legacy_entry` once, when a store opens (``DynamoDbState._move_legacy_verdicts``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from countersign._daemon.dynamodb import TTL_ATTRIBUTE, expires_at
from countersign.state import (
    ChildEdge,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    RecordUse,
    VerdictEntry,
    bounded_cause,
    path_bytes,
    path_digest,
    path_json,
    path_uses,
    records_from_json,
    verdict_bytes,
)

Key = dict[str, dict[str, str]]
Item = dict[str, Any]

NONCE_SK = "nonce"
COUNT_SK = "count"
CHILD_SK_PREFIX = "child#"
NONCE_PK_PREFIX = "nonce#"
PARENT_PK_PREFIX = "parent#"
VERDICT_SHARDS = 8
VERDICTS_PK_PREFIX = "verdicts#"
PATH_PK_PREFIX = "vpath#"
PATH_SK = "path"
REF_SK_PREFIX = "v#"
USE_PK_PREFIX = "vuse#"
USAGE_PK_PREFIX = "vusage#"
SCHEMA_PK = "schema#verdict-log"  # sk "version": 2 once the layout before issue 29 is moved over
# A path's items live as long as the latest verdict on it, and a day more (refreshed at most daily).
PATH_RETAIN_SLACK_MS = 86_400_000
LEGACY_VERDICT_PK_PREFIX = "verdict#"
LEGACY_USES_PK_PREFIX = "uses#"
LEGACY_COUNT_SK = "verdict-count"


def retention(retain_until_ms: int) -> Item:
    """The retention attributes every item but the usage counters carries: ``retain_until_ms`` and
    the TTL in epoch seconds, rounded up, so DynamoDB never deletes an item before its retention."""
    return {"retain_until_ms": {"N": str(retain_until_ms)}, TTL_ATTRIBUTE: {"N": expires_at(retain_until_ms)}}


# --- replay state ------------------------------------------------------------------------------


def nonce_key(nonce: str) -> Key:
    return {"pk": {"S": NONCE_PK_PREFIX + nonce}, "sk": {"S": NONCE_SK}}


def child_key(parent: str, child: str) -> Key:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": CHILD_SK_PREFIX + child}}


def count_key(parent: str) -> Key:
    return {"pk": {"S": PARENT_PK_PREFIX + parent}, "sk": {"S": COUNT_SK}}


def nonce_item(leaf: LeafNonce, now_ms: int) -> Item:
    """A consumed nonce: accepted at ``now_ms``, under ``leaf.request_id`` (none: no attribute)."""
    item: Item = {**nonce_key(leaf.nonce), **retention(leaf.retain_until_ms), "accepted_ms": {"N": str(now_ms)}}
    if leaf.request_id:
        item["request_id"] = {"S": leaf.request_id}
    return item


def child_item(edge: ChildEdge) -> Item:
    """A child-set member."""
    return {**child_key(edge.parent_digest, edge.child_nonce), **retention(edge.retain_until_ms)}


def children_held(counter: Mapping[str, Any] | None) -> int:
    """The children a parent's counter item says it has (0 with no item)."""
    return int(counter["n"]["N"]) if counter is not None and "n" in counter else 0


def consumed_under(consumed: Mapping[str, Any], leaf: LeafNonce) -> bool:
    """Whether a consumed nonce item was written under ``leaf``'s (non-empty) request id."""
    return bool(leaf.request_id) and consumed.get("request_id", {}).get("S") == leaf.request_id


def earlier_acceptance(consumed: Mapping[str, Any] | None, leaf: LeafNonce) -> EarlierAcceptance | None:
    """The acceptance ``leaf`` retries, if the consumed nonce item was written under its request id
    (an item from before acceptance times were kept answers 0)."""
    if consumed is None or not consumed_under(consumed, leaf):
        return None
    return EarlierAcceptance(int(consumed.get("accepted_ms", {}).get("N", "0")))


# --- the verdict log ---------------------------------------------------------------------------


def verdict_shard(verdict_id: str) -> int:
    return hashlib.sha256(verdict_id.encode()).digest()[0] % VERDICT_SHARDS


def path_shard(digest: bytes) -> int:
    return digest[0] % VERDICT_SHARDS


def client_key(client: str) -> str:
    """A client identity as the log's keys name it: 16 hex digits of its SHA-256."""
    return hashlib.sha256(client.encode()).hexdigest()[:16]


def verdict_sk(time_ms: int, verdict_id: str) -> str:
    return f"{time_ms:013d}#{verdict_id}"


def verdict_pk(client: str, shard: int) -> str:
    return f"{VERDICTS_PK_PREFIX}{client_key(client)}#{shard}"


def verdict_key(entry: VerdictEntry) -> Key:
    return {
        "pk": {"S": verdict_pk(entry.client, verdict_shard(entry.verdict_id))},
        "sk": {"S": verdict_sk(entry.time_ms, entry.verdict_id)},
    }


def path_pk(client: str, digest: bytes) -> str:
    return f"{PATH_PK_PREFIX}{client_key(client)}#{digest.hex()}"


def path_key(client: str, digest: bytes) -> Key:
    return {"pk": {"S": path_pk(client, digest)}, "sk": {"S": PATH_SK}}


def digest_of_path_pk(pk: str) -> bytes:
    return bytes.fromhex(pk.rsplit("#", 1)[1])


def use_pk(kind: DependencyKind, value: str, shard: int) -> str:
    return f"{USE_PK_PREFIX}{kind.value}#{value}#{shard}"


def use_keys(client: str, digest: bytes, records: Sequence[RecordUse]) -> list[Key]:
    """The index entries of one client's stored path: one per key, record and deployer it relies on."""
    shard = path_shard(digest)
    sk = f"{client_key(client)}#{digest.hex()}"
    return [{"pk": {"S": use_pk(kind, value, shard)}, "sk": {"S": sk}} for kind, value in path_uses(records)]


def usage_key(client: str, shard: int) -> Key:
    return {"pk": {"S": f"{USAGE_PK_PREFIX}{shard}"}, "sk": {"S": client}}


def verdict_item(entry: VerdictEntry) -> Item:
    """The item of a logged verdict, naming its path (``path``: the digest in hex) if it has one."""
    item: Item = {
        **verdict_key(entry),
        "verdict_id": {"S": entry.verdict_id},
        "time_ms": {"N": str(entry.time_ms)},
        "mode": {"S": entry.mode},
        "client": {"S": entry.client},
        "request_id": {"S": entry.request_id},
        "registry_sequence": {"N": str(entry.registry_sequence)},
        "verdict": {"S": entry.verdict},
        "reason": {"S": entry.reason},
        "needs_revalidation": {"BOOL": entry.needs_revalidation},
        "bytes": {"N": str(verdict_bytes(entry))},
        **retention(entry.retain_until_ms),
    }
    if entry.needs_revalidation:
        item["revalidation_cause"] = {"S": bounded_cause(entry.revalidation_cause)}
    digest = path_digest(entry.construction, entry.records)
    if digest is not None:
        item["path"] = {"S": digest.hex()}
    return item


def ref_item(entry: VerdictEntry, digest: bytes) -> Item:
    """A verdict's ref in its path's partition: the path is kept while a ref is there."""
    key = verdict_key(entry)
    return {
        "pk": {"S": path_pk(entry.client, digest)}, "sk": {"S": REF_SK_PREFIX + key["sk"]["S"]}, "vpk": key["pk"],
        "accepted": {"BOOL": entry.accepted}, **retention(entry.retain_until_ms),
    }  # fmt: skip


def ref_key_of(item: Mapping[str, Any]) -> Key:
    """The ref of a verdict item (as :func:`verdict_item` wrote it, with a path)."""
    pk = path_pk(item["client"]["S"], bytes.fromhex(item["path"]["S"]))
    return {"pk": {"S": pk}, "sk": {"S": REF_SK_PREFIX + item["sk"]["S"]}}


def path_item(entry: VerdictEntry, digest: bytes) -> Item:
    """A client's stored path, kept a day past ``entry``'s retention (:data:`PATH_RETAIN_SLACK_MS`)."""
    return {
        **path_key(entry.client, digest), "client": {"S": entry.client}, "construction": {"S": entry.construction},
        "records": {"S": path_json(entry.records)}, "bytes": {"N": str(path_bytes(entry.construction, entry.records))},
        **retention(entry.retain_until_ms + PATH_RETAIN_SLACK_MS),
    }  # fmt: skip


def use_items(entry: VerdictEntry, digest: bytes) -> list[Item]:
    """The index entries of ``entry``'s path, kept as long as the path."""
    kept = retention(entry.retain_until_ms + PATH_RETAIN_SLACK_MS)
    return [{**key, **kept} for key in use_keys(entry.client, digest, entry.records)]


def entry_from_item(item: Mapping[str, Any], construction: str, records: tuple[RecordUse, ...]) -> VerdictEntry:
    """A verdict from its item and its path's construction and records."""
    return VerdictEntry(
        verdict_id=item["verdict_id"]["S"],
        time_ms=int(item["time_ms"]["N"]),
        mode=item["mode"]["S"],
        client=item["client"]["S"],
        request_id=item["request_id"]["S"],
        registry_sequence=int(item["registry_sequence"]["N"]),
        verdict=item["verdict"]["S"],
        reason=item["reason"]["S"],
        construction=construction,
        records=records,
        retain_until_ms=int(item["retain_until_ms"]["N"]),
        needs_revalidation=bool(item.get("needs_revalidation", {}).get("BOOL", False)),
        revalidation_cause=item.get("revalidation_cause", {}).get("S", ""),
    )


def entry_on_path(item: Mapping[str, Any], path: Mapping[str, Any]) -> VerdictEntry:
    """A verdict from its item and its stored path's item."""
    return entry_from_item(item, path["construction"]["S"], records_from_json(path["records"]["S"]))


def legacy_entry(item: Mapping[str, Any]) -> VerdictEntry:
    """A verdict item of the layout before issue 29 (``verdict#<s>``, its records inline)."""
    return entry_from_item(item, item["construction"]["S"], records_from_json(item["records"]["S"]))


def legacy_use_keys(entry: VerdictEntry, item: Mapping[str, Any]) -> list[Key]:
    """The index items the layout before issue 29 kept for a verdict (accepted ones only)."""
    if not entry.accepted:
        return []
    shard = item["pk"]["S"][len(LEGACY_VERDICT_PK_PREFIX) :]
    return [
        {"pk": {"S": f"{LEGACY_USES_PK_PREFIX}{kind.value}#{value}#{shard}"}, "sk": item["sk"]}
        for kind, value in path_uses(entry.records)
    ]
