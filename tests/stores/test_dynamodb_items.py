"""The DynamoDB verifier store's item codec (verifier/stores/dynamodb_items.py), offline: whatever a
verdict or a consumed nonce is, its items read back as what was written, and the keys keep the layout
that tables already written by earlier releases hold (docs/stores.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.state import (
    MAX_VERDICT_TIME_MS,
    CoSigner,
    EarlierAcceptance,
    LeafNonce,
    RecordUse,
    VerdictEntry,
    path_digest,
    path_json,
)
from verifier.stores import dynamodb_items as items

pytestmark = pytest.mark.offline

text = st.text(min_size=1, max_size=24)
times = st.integers(min_value=0, max_value=MAX_VERDICT_TIME_MS)
cosigners = st.builds(CoSigner, st.sampled_from(["parent", "child"]), text, text)
records = st.builds(RecordUse, text, text, text, times, st.tuples() | st.tuples(cosigners, cosigners))
entries = st.builds(
    VerdictEntry,
    verdict_id=st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    time_ms=times,
    mode=st.sampled_from(["accept", "audit"]),
    client=st.text(max_size=40),
    request_id=st.text(max_size=40),
    registry_sequence=st.integers(min_value=0, max_value=2**53),
    verdict=st.sampled_from(["ACCEPT", "REJECT"]),
    reason=st.sampled_from(["", "NONCE_REPLAYED", "MALFORMED"]),
    construction=st.sampled_from(["signed-dag", "no-chain", ""]),
    records=st.lists(records, max_size=4).map(tuple),
    retain_until_ms=times,
    needs_revalidation=st.booleans(),
    revalidation_cause=st.text(max_size=40),
)


@given(entries)
def test_a_verdict_reads_back_from_its_item_and_its_path(entry: VerdictEntry) -> None:
    if not entry.needs_revalidation:
        entry = replace(entry, revalidation_cause="")  # an unmarked verdict has no cause
    item = items.verdict_item(entry)
    digest = path_digest(entry.construction, entry.records)
    if digest is None:
        assert "path" not in item
        assert items.entry_from_item(item, entry.construction, ()) == entry
        return
    path = items.path_item(entry, digest)
    assert items.entry_on_path(item, path) == entry
    assert items.ref_key_of(item) == {"pk": path["pk"], "sk": {"S": "v#" + item["sk"]["S"]}}
    assert items.ref_item(entry, digest)["vpk"] == item["pk"]
    assert items.digest_of_path_pk(path["pk"]["S"]) == digest
    assert path["records"] == {"S": path_json(entry.records)}
    # The path and its index entries outlive the verdict by the slack, and expire in seconds rounded up.
    assert int(path["retain_until_ms"]["N"]) == entry.retain_until_ms + items.PATH_RETAIN_SLACK_MS
    assert int(path["expires_at"]["N"]) * 1000 >= int(path["retain_until_ms"]["N"])
    for use in items.use_items(entry, digest):
        assert use["retain_until_ms"] == path["retain_until_ms"]


@given(st.text(min_size=1), times, st.text(max_size=10), times)
def test_a_consumed_nonce_answers_a_retry_under_its_request_id_only(
    nonce: str, retain: int, request_id: str, now: int
) -> None:
    consumed = items.nonce_item(LeafNonce(nonce, retain, 3, request_id), now)
    assert consumed["pk"] == {"S": f"nonce#{nonce}"} and consumed["sk"] == {"S": "nonce"}
    same = LeafNonce(nonce, retain, 3, request_id)
    expected = EarlierAcceptance(now) if request_id else None
    assert items.earlier_acceptance(consumed, same) == expected
    assert items.earlier_acceptance(consumed, LeafNonce(nonce, retain, 3, request_id + "x")) is None
    assert items.earlier_acceptance(None, same) is None


def test_keys_keep_the_layout_tables_already_hold() -> None:
    """Tables written by earlier releases are read by these keys: they may not change."""
    assert items.nonce_key("n") == {"pk": {"S": "nonce#n"}, "sk": {"S": "nonce"}}
    assert items.child_key("p", "c") == {"pk": {"S": "parent#p"}, "sk": {"S": "child#c"}}
    assert items.count_key("p") == {"pk": {"S": "parent#p"}, "sk": {"S": "count"}}
    assert items.client_key("spiffe://x") == "8cb20a4fe77bb062"
    assert items.verdict_shard("v-1") == 3
    assert items.verdict_sk(42, "v-1") == "0000000000042#v-1"
    assert items.usage_key("c", 3) == {"pk": {"S": "vusage#3"}, "sk": {"S": "c"}}
    assert items.retention(1_700_000_000_001) == {
        "retain_until_ms": {"N": "1700000000001"}, "expires_at": {"N": "1700000001"}
    }  # fmt: skip
    assert items.children_held(None) == 0 and items.children_held({"n": {"N": "4"}}) == 4
