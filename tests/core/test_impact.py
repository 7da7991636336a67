"""The pure impact graph (countersign.impact): what a query marks, for all logs, and the pieces the
verifier builds it from (a path's dependencies, the keys a new registry distrusts)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.impact import (
    ImpactQuery,
    ImpactStatus,
    KeyChange,
    KeyChangeKind,
    analyse,
    collect_impact,
    distrusted_by,
    key_changes,
    path_dependencies,
)
from countersign.keys import PublicKey
from countersign.records import Construction
from countersign.registry import KeyEntry, Registry
from countersign.samples import SampleMesh
from countersign.state import CoSigner, DependencyKind, InMemoryState, RecordUse, VerdictEntry

pytestmark = pytest.mark.offline

NOW = 1_780_000_000_000
DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
KEYS = tuple(f"ed25519:{n:032x}" for n in range(1, 5))


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[VerdictEntry], ImpactQuery]:
    """A verdict log as a mesh could leave it: records of signed constructions in delegation trees
    (each names its one parent), NO-CHAIN records free to sit under any parent, verdicts over
    root-to-record walks (or any NO-CHAIN sequence), accepted or not, at various times; and a query."""
    count = draw(st.integers(1, 24))
    records: list[RecordUse] = []
    parent: dict[str, str | None] = {}
    loose: list[RecordUse] = []
    for n in range(count):
        deployer = draw(st.sampled_from(DEPLOYERS))
        key = draw(st.sampled_from(KEYS))
        cosigners = tuple(
            CoSigner(role, draw(st.sampled_from(DEPLOYERS)), draw(st.sampled_from(KEYS)))
            for role in draw(st.sampled_from([(), ("parent", "child")]))
        )
        record = RecordUse(digest(n + 1), deployer, key, NOW + draw(st.integers(-5, 5)), cosigners)
        if draw(st.booleans()):
            parent[record.digest] = draw(st.sampled_from([r.digest for r in records])) if records and n % 3 else None
            records.append(record)
        else:
            loose.append(record)
    by_digest = {r.digest: r for r in records + loose}

    def chain(to: str) -> list[RecordUse]:
        walk: list[RecordUse] = []
        at: str | None = to
        while at is not None:
            walk.append(by_digest[at])
            at = parent[at]
        return walk[::-1]

    entries = []
    for n in range(draw(st.integers(0, 20))):
        if records and (not loose or draw(st.booleans())):
            path = chain(draw(st.sampled_from([r.digest for r in records])))
            construction = draw(st.sampled_from([c.value for c in Construction if c.links_parent]))
        else:
            path = draw(st.lists(st.sampled_from(loose), min_size=1, max_size=5, unique=True))
            construction = Construction.NO_CHAIN.value
        entries.append(
            VerdictEntry(
                f"v-{n:03d}",
                NOW + draw(st.integers(0, 50)),
                draw(st.sampled_from(["accept", "audit"])),
                "c",
                "",
                1,
                draw(st.sampled_from(["ACCEPT", "ACCEPT", "REJECT"])),
                "",
                construction,
                tuple(path),
                NOW + 10**6,
            )
        )
    kind = draw(st.sampled_from(list(DependencyKind)))
    value = {
        DependencyKind.KEY: st.sampled_from(KEYS),
        DependencyKind.DEPLOYER: st.sampled_from(DEPLOYERS),
        DependencyKind.RECORD: st.sampled_from(sorted(by_digest)),
    }[kind]
    query = ImpactQuery(
        kind,
        draw(value),
        since_ms=draw(st.sampled_from([0, NOW + 25])),
        created_from_ms=draw(st.sampled_from([None, NOW])),
    )
    return entries, query


def naive_closure(query: ImpactQuery, considered: list[VerdictEntry]) -> set[str]:
    """The closure by definition: matching records, then whatever follows one in any path, until
    nothing changes."""
    reached = {r.digest for e in considered for r in e.records if query.matches(r)}
    while True:
        grown = set(reached)
        for e in considered:
            for before, after in zip(e.records, e.records[1:], strict=False):
                if before.digest in grown:
                    grown.add(after.digest)
        if grown == reached:
            return reached
        reached = grown


@given(logs())
def test_marked_verdicts_are_exactly_those_meeting_the_closure(case: tuple[list[VerdictEntry], ImpactQuery]) -> None:
    entries, query = case
    report = analyse(query, entries)
    considered = [e for e in entries if e.accepted and e.time_ms >= query.since_ms]
    closure = naive_closure(query, considered)
    assert report.record_digests == closure
    assert report.verdict_ids == {e.verdict_id for e in considered if {r.digest for r in e.records} & closure}
    for affected in report.verdicts:
        assert affected.entry.accepted and affected.entry.time_ms >= query.since_ms
        assert set(affected.records) == {r.digest for r in affected.entry.records} & closure
    for record in report.records:
        assert record.seed == any(query.matches(r) for e in considered for r in e.records if r.digest == record.digest)
        assert record.seed or record.depends_on  # below a seed: some parent of it is affected
        assert set(record.depends_on) <= closure


@given(logs())
def test_the_indexed_walk_finds_what_the_whole_log_would(case: tuple[list[VerdictEntry], ImpactQuery]) -> None:
    """collect_impact reads only what its lookups return; over a log that a mesh could leave, that is
    exactly the impact over the whole log."""
    entries, query = case
    log = InMemoryState()
    for entry in entries:
        log.record_verdict(entry)
    assert collect_impact(log, query) == analyse(query, entries)


def test_a_limited_lookup_says_the_report_may_be_incomplete() -> None:
    record = RecordUse(digest(1), "deployer-a", KEYS[0], NOW)
    log = InMemoryState()
    for n in range(3):
        log.record_verdict(VerdictEntry(f"v-{n}", NOW + n, "accept", "", "", 1, "ACCEPT", "", "merkle", (record,), NOW))
    query = ImpactQuery(DependencyKind.KEY, KEYS[0])
    assert not collect_impact(log, query).truncated
    cut = collect_impact(log, query, limit=2)
    assert cut.truncated and cut.verdict_ids == {"v-0", "v-1"}


def test_report_json_has_the_agreed_shape() -> None:
    root = RecordUse(digest(1), "deployer-a", KEYS[0], NOW)
    leaf = RecordUse(digest(2), "deployer-b", KEYS[1], NOW, (CoSigner("parent", "deployer-a", KEYS[0]),))
    entry = VerdictEntry("v-1", NOW, "accept", "client", "req-1", 7, "ACCEPT", "", "signed-dag", (root, leaf), NOW)
    body = json.loads(json.dumps(analyse(ImpactQuery(DependencyKind.RECORD, digest(1)), [entry]).to_json()))
    assert set(body) >= {"query", "records", "verdicts"}
    assert body["query"] == {"kind": "record", "value": digest(1), "since_ms": 0}
    assert body["records"] == [
        {"digest": digest(1), "status": "NEEDS_REVALIDATION", "depends_on": [], "seed": True,
         "deployer": "deployer-a", "key_id": KEYS[0]},
        {"digest": digest(2), "status": "NEEDS_REVALIDATION", "depends_on": [digest(1)], "seed": False,
         "deployer": "deployer-b", "key_id": KEYS[1]},
    ]  # fmt: skip
    (verdict,) = body["verdicts"]
    assert {k: verdict[k] for k in ("verdict_id", "request_id", "time_ms", "result", "records", "status")} == {
        "verdict_id": "v-1", "request_id": "req-1", "time_ms": NOW, "result": "ACCEPT",
        "records": [digest(1), digest(2)], "status": ImpactStatus.NEEDS_REVALIDATION.value,
    }  # fmt: skip


def test_path_dependencies_name_every_record_and_signature_of_a_real_path() -> None:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"impact")
    path = mesh.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"out", now_ms=NOW)
    uses = path_dependencies(path)
    assert [u.digest for u in uses] == [e.digest() for e in path.envelopes]
    # Each child names its parent by the digest the log keeps for that parent.
    assert [e.record.parent for e in path.envelopes[1:]] == [u.digest for u in uses[:-1]]
    a, b = mesh.signers["deployer-a"].key_id, mesh.signers["deployer-b"].key_id
    assert [(u.deployer, u.key_id) for u in uses] == [("deployer-a", a), ("deployer-b", b), ("deployer-b", b)]
    assert uses[1].cosigners == (CoSigner("parent", "deployer-a", a), CoSigner("child", "deployer-b", b))
    assert uses[0].cosigners == uses[2].cosigners == ()  # a root, and a same-deployer edge
    assert uses[1].depends_on(DependencyKind.KEY, a) and uses[1].depends_on(DependencyKind.DEPLOYER, "deployer-a")


def test_key_changes_between_registries_and_what_an_entry_relied_on() -> None:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"impact")
    before = mesh.registry
    a = mesh.signers["deployer-a"].key_id
    b = mesh.signers["deployer-b"].key_id
    spare = PublicKey(mesh.signers["deployer-c"].public_key)

    def changed(
        deployer: str, key_id: str, *, revoked_ms: int | None = None, retired_ms: int | None = None
    ) -> Registry:
        keys = dict(before.deployers[deployer])
        keys[key_id] = replace(keys[key_id], revoked_ms=revoked_ms, retired_ms=retired_ms)
        return Registry({**before.deployers, deployer: keys}, before.sequence + 1)

    revoked = changed("deployer-a", a, revoked_ms=NOW)
    assert key_changes(before, revoked) == [KeyChange(KeyChangeKind.REVOKED, "deployer-a", a)]
    assert key_changes(revoked, revoked) == []
    retired = changed("deployer-b", b, retired_ms=NOW)
    assert key_changes(before, retired) == [KeyChange(KeyChangeKind.RETIRED, "deployer-b", b, NOW)]
    assert key_changes(None, revoked) == [KeyChange(KeyChangeKind.REVOKED, "deployer-a", a)]  # at start-up
    added = Registry(
        {**before.deployers, "deployer-c": {**before.deployers["deployer-c"], "x": KeyEntry(spare, NOW)}}, 9
    )
    assert key_changes(before, added) == []
    assert KeyChange(KeyChangeKind.RETIRED, "deployer-b", b, NOW).query == ImpactQuery(
        DependencyKind.KEY, b, created_from_ms=NOW
    )

    old = RecordUse(digest(1), "deployer-b", b, NOW - 1, (CoSigner("parent", "deployer-a", a),))
    new = RecordUse(digest(2), "deployer-b", b, NOW + 1)
    entry = VerdictEntry("v", NOW, "accept", "", "", 3, "ACCEPT", "", "signed-dag", (old,), NOW)
    assert distrusted_by(entry, before) is None
    assert distrusted_by(entry, revoked) == KeyChange(KeyChangeKind.REVOKED, "deployer-a", a)  # as co-signer
    assert distrusted_by(entry, retired) is None  # signed before the retirement
    assert distrusted_by(replace(entry, records=(new,)), retired) == KeyChange(
        KeyChangeKind.RETIRED, "deployer-b", b, NOW
    )
