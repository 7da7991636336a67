"""The verdict log on every backend (memory, SQLite, PostgreSQL, DynamoDB emulator), through the
``VerdictLog`` interface, and the impact walk over it.

The workload test keeps its own account of which verdicts used which key, revokes a key half-way
through 1,000 verdicts (later paths using it are rejected, as a verifier would), and requires the
impact of the key to be exactly the accepted verdicts the test itself says used it: nothing more.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from countersign.errors import StateUnavailable
from countersign.impact import ImpactQuery, collect_impact
from countersign.state import CoSigner, DependencyKind, InMemoryState, RecordUse, VerdictEntry, VerifierStore
from tests.stores.conftest import StoreHarness

T0 = 1_780_000_000_000
FAR = T0 + 10 * 86_400_000
DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c", "deployer-d")


def key_of(deployer: str, generation: int) -> str:
    return f"ed25519:{(DEPLOYERS.index(deployer) * 16 + generation + 1):032x}"


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


@dataclass
class Forest:
    """Records in delegation trees; a path is a root-to-record walk, as in a real mesh."""

    rng: random.Random
    parent: dict[str, str | None] = field(default_factory=dict)
    records: dict[str, RecordUse] = field(default_factory=dict)

    def grow(self, roots: int, size: int) -> None:
        for n in range(size):
            deployer = self.rng.choice(DEPLOYERS)
            key = key_of(deployer, self.rng.randrange(2))
            above = None if n < roots else self.rng.choice(list(self.records))
            cosigners: tuple[CoSigner, ...] = ()
            if above is not None and self.records[above].deployer != deployer:
                up = self.records[above]
                cosigners = (CoSigner("parent", up.deployer, up.key_id), CoSigner("child", deployer, key))
            record = RecordUse(digest(n + 1), deployer, key, T0 - 1_000, cosigners)
            self.records[record.digest] = record
            self.parent[record.digest] = above

    def path_to(self, digest: str) -> tuple[RecordUse, ...]:
        chain: list[RecordUse] = []
        at: str | None = digest
        while at is not None:
            chain.append(self.records[at])
            at = self.parent[at]
        return tuple(reversed(chain))


def entry(
    n: int,
    records: Sequence[RecordUse],
    *,
    verdict: str = "ACCEPT",
    reason: str = "",
    mode: str = "accept",
    time_ms: int | None = None,
    retain: int = FAR,
    construction: str = "signed-dag",
) -> VerdictEntry:
    return VerdictEntry(
        verdict_id=f"v-{n:05d}",
        time_ms=T0 + 10 * n if time_ms is None else time_ms,
        mode=mode,
        client="spiffe://countersign.local/client/test",
        request_id=f"r-{n}" if n % 3 else "",
        registry_sequence=3 if n < 500 else 4,
        verdict=verdict,
        reason=reason,
        construction=construction,
        records=tuple(records),
        retain_until_ms=retain,
    )


def opened(harness: StoreHarness) -> VerifierStore:
    """A handle on the harness's store (every backend there keeps the verdict log too)."""
    return cast(VerifierStore, harness.open())


def uses_key(records: Sequence[RecordUse], key_id: str) -> bool:
    return any(sig[2] == key_id for r in records for sig in r.signatures())


@pytest.mark.slow
def test_revoking_a_key_mid_workload_marks_exactly_the_verdicts_that_used_it(harness: StoreHarness) -> None:
    store = opened(harness)
    rng = random.Random(20)
    forest = Forest(rng)
    forest.grow(roots=30, size=240)
    revoked = key_of("deployer-b", 0)
    accepted_with_key: set[str] = set()
    accepted_since: set[str] = set()
    since = T0 + 10 * 250
    for n in range(1_000):
        records = forest.path_to(rng.choice(list(forest.records)))
        verdict, reason = "ACCEPT", ""
        if n >= 500 and uses_key(records, revoked):
            verdict, reason = "REJECT", "KEY_REVOKED"  # the verifier has the revocation by now
        elif rng.random() < 0.1:
            verdict, reason = "REJECT", "OUTPUT_MISMATCH"
        logged = entry(n, records, verdict=verdict, reason=reason, mode=rng.choice(("accept", "audit")))
        store.record_verdict(logged)
        if logged.accepted and uses_key(records, revoked):
            accepted_with_key.add(logged.verdict_id)
            if logged.time_ms >= since:
                accepted_since.add(logged.verdict_id)
    store.record_verdict(entry(1_000, (), verdict="REJECT", reason="MALFORMED"))  # a path that did not parse
    assert len(accepted_with_key) > 50  # the workload really exercises the key
    assert store.verdict_count() == 1_001

    report = collect_impact(store, ImpactQuery(DependencyKind.KEY, revoked))
    assert report.verdict_ids == accepted_with_key
    assert not report.truncated
    tainted = {
        r.digest
        for v in report.verdicts
        for i, r in enumerate(v.entry.records)
        if any(uses_key((earlier,), revoked) for earlier in v.entry.records[: i + 1])
    }
    assert report.record_digests == tainted
    assert {r.digest for r in report.records if r.seed} == {
        r.digest for r in forest.records.values() if uses_key((r,), revoked) and r.digest in tainted
    }
    assert collect_impact(store, ImpactQuery(DependencyKind.KEY, revoked, since_ms=since)).verdict_ids == accepted_since

    # Marking flags them once: a second marker (another replica) counts nothing; nothing is deleted.
    entries = [v.entry for v in report.verdicts]
    assert store.mark_needs_revalidation(entries, "revoke_key deployer-b", T0 + 20_000) == len(accepted_with_key)
    assert store.mark_needs_revalidation(entries, "revoke_key deployer-b", T0 + 20_001) == 0
    again = collect_impact(opened(harness), ImpactQuery(DependencyKind.KEY, revoked))
    assert again.verdict_ids == accepted_with_key
    assert all(
        v.entry.needs_revalidation and v.entry.revalidation_cause == "revoke_key deployer-b" for v in again.verdicts
    )
    assert store.verdict_count() == 1_001


def test_lookups_by_record_and_deployer_and_what_an_entry_keeps(harness: StoreHarness) -> None:
    store = opened(harness)
    root = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0 - 5)
    child = RecordUse(
        digest(2),
        "deployer-b",
        key_of("deployer-b", 0),
        T0 - 4,
        (
            CoSigner("parent", "deployer-a", key_of("deployer-a", 0)),
            CoSigner("child", "deployer-b", key_of("deployer-b", 0)),
        ),
    )
    leaf = RecordUse(digest(3), "deployer-b", key_of("deployer-b", 1), T0 - 3)
    other = RecordUse(digest(9), "deployer-c", key_of("deployer-c", 0), T0 - 3)
    first = entry(1, (root, child, leaf))
    store.record_verdict(first)
    store.record_verdict(entry(2, (root, child), mode="audit"))
    store.record_verdict(entry(3, (other,)))
    store.record_verdict(entry(4, (root, child, leaf), verdict="REJECT", reason="NONCE_REPLAYED"))

    (found,) = store.accepts_relying_on(DependencyKind.RECORD, [digest(3)])
    assert found == first  # every field, records and co-signers in order, comes back as recorded
    ids = [e.verdict_id for e in store.accepts_relying_on(DependencyKind.DEPLOYER, ["deployer-a"])]
    assert ids == ["v-00001", "v-00002"]  # oldest first; the rejected one relied on nothing
    # A co-signer relied on counts: deployer-a co-signed the edge to its child.
    assert [e.verdict_id for e in store.accepts_relying_on(DependencyKind.KEY, [key_of("deployer-a", 0)])] == [
        "v-00001",
        "v-00002",
    ]
    several = store.accepts_relying_on(DependencyKind.RECORD, [digest(3), digest(9)], since_ms=T0 + 15)
    assert [e.verdict_id for e in several] == ["v-00003"]
    assert [e.verdict_id for e in store.accepts_relying_on(DependencyKind.RECORD, [digest(1)], limit=1)] == ["v-00001"]
    assert store.accepts_relying_on(DependencyKind.KEY, ["ed25519:" + "f" * 32]) == []

    report = collect_impact(store, ImpactQuery(DependencyKind.RECORD, digest(2)))
    assert report.verdict_ids == {"v-00001", "v-00002"}
    assert [(r.digest, r.depends_on, r.seed) for r in report.records] == [
        (digest(2), (), True),
        (digest(3), (digest(2),), False),
    ]


def test_a_retired_key_reaches_only_what_it_signed_after_retirement(harness: StoreHarness) -> None:
    store = opened(harness)
    key = key_of("deployer-a", 0)
    before = RecordUse(digest(1), "deployer-a", key, T0 - 10)
    after = RecordUse(digest(2), "deployer-a", key, T0 + 10)
    store.record_verdict(entry(1, (before,)))
    store.record_verdict(entry(2, (after,)))
    report = collect_impact(store, ImpactQuery(DependencyKind.KEY, key, created_from_ms=T0))
    assert report.verdict_ids == {"v-00002"}


def test_no_chain_descendants_are_followed_into_other_paths(harness: StoreHarness) -> None:
    """Under NO-CHAIN a record does not name its parent, so one record can sit under two parents;
    the walk follows it from the path through the revoked key into the other path."""
    store = opened(harness)
    bad = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0)
    good = RecordUse(digest(2), "deployer-c", key_of("deployer-c", 0), T0)
    shared = RecordUse(digest(3), "deployer-b", key_of("deployer-b", 0), T0)
    below = RecordUse(digest(4), "deployer-b", key_of("deployer-b", 0), T0)
    store.record_verdict(entry(1, (bad, shared), construction="no-chain"))
    store.record_verdict(entry(2, (good, shared, below), construction="no-chain"))
    store.record_verdict(entry(3, (good,), construction="no-chain"))
    report = collect_impact(store, ImpactQuery(DependencyKind.KEY, key_of("deployer-a", 0)))
    assert report.verdict_ids == {"v-00001", "v-00002"}
    assert report.record_digests == {digest(1), digest(3), digest(4)}


def test_retention_collects_old_verdicts_and_the_row_bound_trims_the_oldest(harness: StoreHarness) -> None:
    store = opened(harness)
    record = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0)
    for n in range(10):
        store.record_verdict(entry(n, (record,), retain=T0 + 1_000))
    for n in range(10, 60):
        store.record_verdict(entry(n, (record,), retain=FAR))
    assert store.verdict_count() == 60
    removed = 0
    while (batch := store.collect_expired(T0 + 1_001, limit=4)) > 0:
        removed += batch
    assert removed == 10
    assert store.verdict_count() == 50
    held = store.accepts_relying_on(DependencyKind.RECORD, [digest(1)])
    assert [e.verdict_id for e in held] == [f"v-{n:05d}" for n in range(10, 60)]

    trimmed = 0
    while (batch := store.trim_verdict_log(max_rows=20, limit=7)) > 0:
        trimmed += batch
    left = [e.verdict_id for e in store.accepts_relying_on(DependencyKind.RECORD, [digest(1)])]
    assert store.verdict_count() == len(left) == 50 - trimmed
    assert left == [f"v-{n:05d}" for n in range(40, 60)]  # exactly the newest 20


def test_an_outage_refuses_to_record_and_says_so(outage_harness: StoreHarness) -> None:
    store = cast(VerifierStore, outage_harness.open_for_outage())
    record = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0)
    outage = outage_harness.outage()
    assert outage is not None
    with outage, pytest.raises(StateUnavailable):
        store.record_verdict(entry(1, (record,)))
    store.record_verdict(entry(2, (record,)))
    assert [e.verdict_id for e in store.accepts_relying_on(DependencyKind.RECORD, [digest(1)])] == ["v-00002"]


def test_a_batch_of_verdicts_is_recorded_whole(harness: StoreHarness) -> None:
    """record_verdicts, the verifier's group commit: every verdict of the batch is logged and found;
    SQLite and PostgreSQL write the batch in one transaction, so a batch that cannot be written
    (here its last verdict repeats a logged id) leaves nothing of itself behind."""
    store = opened(harness)
    record = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0 - 1_000, ())
    batch = [entry(n, (record,)) for n in range(1, 6)]
    store.record_verdicts(batch)
    assert store.verdict_count() == 5
    found = store.accepts_relying_on(DependencyKind.RECORD, [record.digest])
    assert [e.verdict_id for e in found] == [e.verdict_id for e in batch]
    if harness.name in ("sqlite", "postgresql"):
        with pytest.raises(StateUnavailable):
            store.record_verdicts([entry(10, (record,)), entry(1, (record,))])
        assert store.verdict_count() == 5
        assert [e.verdict_id for e in store.accepts_relying_on(DependencyKind.RECORD, [record.digest])] == [
            e.verdict_id for e in batch
        ]


# --- tenancy and bounds (issue 29) ------------------------------------------------------------------

ALICE = "spiffe://countersign.local/client/alice"
MALLORY = "spiffe://countersign.local/client/mallory"


def of(client: str, n: int, records: Sequence[RecordUse], **fields: object) -> VerdictEntry:
    return replace(entry(n, records, **fields), client=client, verdict_id=f"{client[-5:]}-{n:05d}")  # type: ignore[arg-type]


def test_one_client_flooding_the_log_pushes_out_only_its_own_verdicts(harness: StoreHarness) -> None:
    """Rows: the log trims the client holding the most, oldest first, so a consumer that floods it
    loses its own verdicts while another's stay whole. Bytes: the same with a byte bound, against a
    client sending long unique paths."""
    store = opened(harness)
    record = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0)
    for n in range(10):
        store.record_verdict(of(ALICE, n, (record,)))
    for n in range(10, 110):
        store.record_verdict(of(MALLORY, n, (record,)))
    assert {c: u.rows for c, u in store.verdict_usage().items()} == {ALICE: 10, MALLORY: 100}
    trimmed = 0
    while (batch := store.trim_verdict_log(max_rows=50, limit=30)) > 0:
        trimmed += batch
    assert trimmed == 60
    assert {c: u.rows for c, u in store.verdict_usage().items()} == {ALICE: 10, MALLORY: 40}
    left = [e.verdict_id for e in store.accepts_relying_on(DependencyKind.RECORD, [digest(1)], client=MALLORY)]
    assert left == [f"llory-{n:05d}" for n in range(70, 110)]  # its newest
    assert len(store.accepts_relying_on(DependencyKind.RECORD, [digest(1)], client=ALICE)) == 10

    # A path of 40 unique records per verdict: far more bytes than Alice's one-record verdicts.
    forest = Forest(random.Random(7))
    forest.grow(roots=1, size=400)
    chains = [forest.path_to(d) for d in list(forest.records)[-40:]]
    for n, records in enumerate(chains, start=200):
        store.record_verdict(of(MALLORY, n, records))
    usage = store.verdict_usage()
    assert usage[MALLORY].bytes > 10 * usage[ALICE].bytes
    budget = usage[ALICE].bytes * 3
    while store.trim_verdict_log(max_rows=1_000, limit=1_000, max_bytes=budget) > 0:
        pass
    after = store.verdict_usage()
    assert after[ALICE] == usage[ALICE]  # untouched
    assert sum(u.bytes for u in after.values()) <= budget


def test_a_client_sees_only_its_own_verdicts_when_it_asks_for_them(harness: StoreHarness) -> None:
    store = opened(harness)
    record = RecordUse(digest(1), "deployer-a", key_of("deployer-a", 0), T0)
    store.record_verdicts([of(ALICE, 1, (record,)), of(MALLORY, 2, (record,)), of(ALICE, 3, (record,))])
    mine = store.accepts_relying_on(DependencyKind.KEY, [key_of("deployer-a", 0)], client=ALICE)
    assert [e.client for e in mine] == [ALICE, ALICE]
    everyone = store.accepts_relying_on(DependencyKind.KEY, [key_of("deployer-a", 0)])
    assert [e.client for e in everyone] == [ALICE, MALLORY, ALICE]
    report = collect_impact(store, ImpactQuery(DependencyKind.RECORD, digest(1)), client=MALLORY)
    assert {v.entry.client for v in report.verdicts} == {MALLORY}


VERDICT_LOG_EXAMPLES = {"memory": 60, "sqlite": 30, "postgresql": 15, "dynamodb_emulator": 6}
CLIENTS = (ALICE, MALLORY, "spiffe://countersign.local/client/bob")


def test_random_verdict_log_sequences_match_the_reference(harness: StoreHarness) -> None:
    """Records from three clients over a few shared paths (and no path), trims under random row and
    byte bounds, expiry: the store answers as the reference (:class:`InMemoryState`) does, in what
    each client holds, what is trimmed and what each lookup returns."""
    forest = Forest(random.Random(3))
    forest.grow(roots=2, size=12)
    pool = [(), *(forest.path_to(d) for d in list(forest.records)[::2])]

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.store = cast(VerifierStore, harness.fresh())
            self.model = InMemoryState()
            self.n = 0
            self.now = T0

        @rule(
            client=st.sampled_from(CLIENTS),
            paths=st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=3),
            accepted=st.booleans(),
            retain=st.sampled_from([T0 + 1_000, FAR]),
        )
        def record(self, client: str, paths: list[int], accepted: bool, retain: int) -> None:
            batch = []
            for index in paths:
                self.n += 1
                verdict = ("ACCEPT", "") if accepted and pool[index] else ("REJECT", "OUTPUT_MISMATCH")
                batch.append(of(client, self.n, pool[index], verdict=verdict[0], reason=verdict[1], retain=retain))
            self.store.record_verdicts(batch)
            self.model.record_verdicts(batch)

        @rule(
            max_rows=st.integers(0, 12),
            max_bytes=st.one_of(st.none(), st.integers(0, 20_000)),
            limit=st.integers(1, 8),
        )
        def trim(self, max_rows: int, max_bytes: int | None, limit: int) -> None:
            expected = self.model.trim_verdict_log(max_rows, limit, max_bytes=max_bytes)
            assert self.store.trim_verdict_log(max_rows, limit, max_bytes=max_bytes) == expected

        @rule()
        def expire(self) -> None:
            self.now = T0 + 1_001
            assert self.store.collect_expired(self.now) == self.model.collect_expired(self.now)

        @invariant()
        def same_log(self) -> None:
            assert self.store.verdict_usage() == self.model.verdict_usage()
            for client in (None, *CLIENTS):
                for kind, value in ((DependencyKind.DEPLOYER, "deployer-b"), (DependencyKind.RECORD, digest(1))):
                    got = self.store.accepts_relying_on(kind, [value], client=client)
                    assert got == self.model.accepts_relying_on(kind, [value], client=client)

    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=VERDICT_LOG_EXAMPLES[harness.name], stateful_step_count=12, deadline=None),
    )
