"""Revocation impact: which logged verdicts, and which records below them, relied on a key, a record
or a deployer (seed 000: a revocation must reach what was derived from what it revokes).

Pure. The verifier's log (:class:`countersign.state.VerdictLog`) gives the verdicts; this module
builds the dependency graph over their paths (record -> children -> verdicts), takes the closure of
the records the query names, and marks every record and verdict in it ``NEEDS_REVALIDATION``.
Nothing is deleted: marking is a flag the log keeps, and a report is data.

Only accepted verdicts count. A rejected path relied on nothing, and revoking more can never make
it acceptable.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from countersign.canonical import JsonValue
from countersign.errors import MalformedError
from countersign.records import DEPLOYER_ID_PATTERN, DIGEST_PATTERN, KEY_ID_PATTERN, Construction, Path
from countersign.registry import Registry
from countersign.state import (
    MAX_LOOKUP_VERDICTS,
    MAX_VERDICT_TIME_MS,
    CoSigner,
    DependencyKind,
    RecordUse,
    VerdictEntry,
    VerdictLog,
)


class ImpactStatus(enum.StrEnum):
    NEEDS_REVALIDATION = "NEEDS_REVALIDATION"
    """The record or verdict depended on what the query names: check it again before relying on it."""


def path_dependencies(path: Path) -> tuple[RecordUse, ...]:
    """What a verdict on ``path`` relies on, root to leaf: each record's digest (how a child names
    its parent), its issuer and key, and every co-signer and co-signing key."""
    return tuple(
        RecordUse(
            envelope.digest(),
            envelope.record.deployer,
            envelope.record.key_id,
            envelope.record.created_ms,
            tuple(CoSigner(c.role.value, c.deployer, c.key_id) for c in envelope.record.cosigs),
        )
        for envelope in path.envelopes
    )


@dataclass(frozen=True, slots=True)
class ImpactQuery:
    """What has become suspect: a key, a record or a deployer, in verdicts logged at or after
    ``since_ms``. ``created_from_ms`` narrows it to records created at or after that time (a retired
    key: what it signed before its retirement stays valid)."""

    kind: DependencyKind
    value: str
    since_ms: int = 0
    created_from_ms: int | None = None

    def matches(self, record: RecordUse) -> bool:
        if self.created_from_ms is not None and record.created_ms < self.created_from_ms:
            return False
        return record.depends_on(self.kind, self.value)

    def to_json(self) -> dict[str, JsonValue]:
        body: dict[str, JsonValue] = {"kind": self.kind.value, "value": self.value, "since_ms": self.since_ms}
        if self.created_from_ms is not None:
            body["created_from_ms"] = self.created_from_ms
        return body


_QUERY_PATTERNS = {
    DependencyKind.KEY: (KEY_ID_PATTERN, "a key id (ed25519: and 32 hex digits)"),
    DependencyKind.RECORD: (DIGEST_PATTERN, "a record digest (sha256: and 64 hex digits)"),
    DependencyKind.DEPLOYER: (DEPLOYER_ID_PATTERN, "a deployer id"),
}


MAX_SHOWN_CHARS = 80  # of a refused query value: an error echoes no more of it than this


def impact_query(kind: DependencyKind, value: str, since_ms: int = 0) -> ImpactQuery:
    """A query from untrusted input (a command line, an RPC). Raises MalformedError saying what is wrong."""
    pattern, what = _QUERY_PATTERNS[kind]
    if pattern.fullmatch(value) is None:
        shown = repr(value[:MAX_SHOWN_CHARS]) + (
            f" (and {len(value) - MAX_SHOWN_CHARS} more)" if len(value) > MAX_SHOWN_CHARS else ""
        )
        raise MalformedError(f"{shown} is not {what}")
    if not 0 <= since_ms <= MAX_VERDICT_TIME_MS:
        raise MalformedError(f"since must be between 0 and {MAX_VERDICT_TIME_MS} ms since the epoch")
    return ImpactQuery(kind, value, since_ms)


@dataclass(frozen=True, slots=True)
class AffectedRecord:
    """A record in the query's closure. ``seed``: it matches the query itself; otherwise it lies
    below one that does. ``depends_on``: its parents (in some logged path) inside the closure."""

    digest: str
    depends_on: tuple[str, ...]
    seed: bool
    deployer: str
    key_id: str

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "digest": self.digest,
            "status": ImpactStatus.NEEDS_REVALIDATION.value,
            "depends_on": list(self.depends_on),
            "seed": self.seed,
            "deployer": self.deployer,
            "key_id": self.key_id,
        }


@dataclass(frozen=True, slots=True)
class LoggedVerdict:
    """An affected verdict as an impact report shows it (and the ``Impact`` RPC carries it): what was
    accepted, when, for whom, and which of its records (``records``, root first) the query affects."""

    verdict_id: str
    request_id: str
    time_ms: int
    result: str  # ACCEPT: only accepted verdicts are affected
    records: tuple[str, ...]
    mode: str
    client: str
    registry_sequence: int
    path: tuple[str, ...]  # every record digest of its path, root first
    marked_in_log: bool
    cause: str

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "verdict_id": self.verdict_id,
            "request_id": self.request_id,
            "time_ms": self.time_ms,
            "result": self.result,
            "records": list(self.records),
            "status": ImpactStatus.NEEDS_REVALIDATION.value,
            "mode": self.mode,
            "client": self.client,
            "registry_sequence": self.registry_sequence,
            "path": list(self.path),
            "marked_in_log": self.marked_in_log,
            "cause": self.cause,
        }


@dataclass(frozen=True, slots=True)
class AffectedVerdict:
    """A logged verdict whose path holds a record of the closure; ``records`` are those, root first."""

    entry: VerdictEntry
    records: tuple[str, ...]

    def logged(self) -> LoggedVerdict:
        entry = self.entry
        return LoggedVerdict(
            entry.verdict_id, entry.request_id, entry.time_ms, entry.verdict, self.records, entry.mode, entry.client,
            entry.registry_sequence, tuple(record.digest for record in entry.records), entry.needs_revalidation,
            entry.revalidation_cause,
        )  # fmt: skip

    def to_json(self) -> dict[str, JsonValue]:
        return self.logged().to_json()


@dataclass(frozen=True, slots=True)
class ImpactReport:
    """Every affected record and verdict. ``truncated``: a log lookup hit its limit, so the report
    may be incomplete (narrow the query with ``since_ms``)."""

    query: ImpactQuery
    records: tuple[AffectedRecord, ...]
    verdicts: tuple[AffectedVerdict, ...]
    truncated: bool = False

    @property
    def verdict_ids(self) -> frozenset[str]:
        return frozenset(v.entry.verdict_id for v in self.verdicts)

    @property
    def record_digests(self) -> frozenset[str]:
        return frozenset(r.digest for r in self.records)

    def to_json(self) -> dict[str, JsonValue]:
        """The report as the command line prints it and ``countersign report --impact`` reads it."""
        return report_json(self.query, self.records, self.verdicts, self.truncated)


def report_json(
    query: ImpactQuery,
    records: Iterable[AffectedRecord],
    verdicts: Iterable[AffectedVerdict | LoggedVerdict],
    truncated: bool,
) -> dict[str, JsonValue]:
    """An impact report's JSON, whether built here from a log or received from a verifier."""
    return {
        "query": query.to_json(),
        "records": [r.to_json() for r in records],
        "verdicts": [v.to_json() for v in verdicts],
        "truncated": truncated,
    }


def analyse(query: ImpactQuery, verdicts: Iterable[VerdictEntry], *, truncated: bool = False) -> ImpactReport:
    """The impact of ``query`` over ``verdicts``: the dependency graph of their paths, the closure
    of the records matching the query (each with everything below it), and every verdict whose
    path meets the closure. Only accepted verdicts at or after ``query.since_ms`` count."""
    considered: dict[str, VerdictEntry] = {}
    for entry in verdicts:
        if entry.accepted and entry.time_ms >= query.since_ms:
            considered.setdefault(entry.verdict_id, entry)
    ordered = sorted(considered.values(), key=lambda e: (e.time_ms, e.verdict_id))

    children: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    known: dict[str, RecordUse] = {}
    seeds: set[str] = set()
    for entry in ordered:
        previous: str | None = None
        for record in entry.records:
            known.setdefault(record.digest, record)
            if query.matches(record):
                seeds.add(record.digest)
            if previous is not None:
                children.setdefault(previous, set()).add(record.digest)
                parents.setdefault(record.digest, set()).add(previous)
            previous = record.digest

    closure = _closure(seeds, children)
    records = tuple(
        AffectedRecord(
            digest,
            tuple(sorted(parents.get(digest, set()) & closure)),
            digest in seeds,
            known[digest].deployer,
            known[digest].key_id,
        )
        for digest in sorted(closure)
    )
    affected = tuple(
        AffectedVerdict(entry, tuple(dict.fromkeys(r.digest for r in entry.records if r.digest in closure)))
        for entry in ordered
        if any(r.digest in closure for r in entry.records)
    )
    return ImpactReport(query, records, affected, truncated)


def _closure(seeds: set[str], children: Mapping[str, set[str]]) -> set[str]:
    reached = set(seeds)
    frontier = list(seeds)
    while frontier:
        for child in children.get(frontier.pop(), ()):
            if child not in reached:
                reached.add(child)
                frontier.append(child)
    return reached


def _binds_ancestors(construction: str) -> bool:
    """Whether a record of this construction names its parent inside its digest (the parent's digest
    or the Merkle root of the prefix): then every accepted path holding the record holds its one
    chain of ancestors too. Unknown text counts as not binding (the walk looks further, never less)."""
    try:
        return Construction(construction).links_parent
    except ValueError:
        return False


def collect_impact(
    log: VerdictLog, query: ImpactQuery, *, limit: int = MAX_LOOKUP_VERDICTS, client: str | None = None
) -> ImpactReport:
    """:func:`analyse` over the verdicts of ``log`` that the query can reach, found by indexed lookups.

    The first lookup finds the verdicts holding a record that matches the query. A record of every
    construction but NO-CHAIN names its parent inside its own digest, and an accepted path has each
    record's parent right before it, so every accepted path holding a descendant also holds the
    matching record: that lookup has found them all. Under NO-CHAIN a descendant can appear under
    other parents, so those descendants are looked up too, until nothing new turns up.
    ``client``: only that client identity's verdicts (a consumer's own query): the graph, and so the
    records reported, is built from them alone.
    Raises :class:`countersign.errors.StateUnavailable` when the log cannot be read.
    """
    fetched: dict[str, VerdictEntry] = {}
    truncated = False
    looked_up: set[str] = set()

    def lookup(kind: DependencyKind, values: list[str]) -> bool:
        nonlocal truncated
        found = log.accepts_relying_on(kind, values, since_ms=query.since_ms, limit=limit, client=client)
        truncated = truncated or len(found) >= limit
        new = [entry for entry in found if entry.verdict_id not in fetched]
        for entry in new:
            fetched[entry.verdict_id] = entry
        return bool(new)

    lookup(query.kind, [query.value])
    while True:
        report = analyse(query, fetched.values(), truncated=truncated)
        unbound = {
            record.digest
            for entry in fetched.values()
            if not _binds_ancestors(entry.construction)
            for record in entry.records
        }
        frontier = sorted((report.record_digests & unbound) - looked_up)
        if not frontier:
            return report
        looked_up.update(frontier)
        if not lookup(DependencyKind.RECORD, frontier):
            return report


# --- revocations arriving with the registry ---------------------------------------------------------


class KeyChangeKind(enum.StrEnum):
    REVOKED = "revoke_key"
    RETIRED = "retire_key"


@dataclass(frozen=True, slots=True)
class KeyChange:
    """A key the registry stopped trusting: revoked (for everything it signed) or retired (for
    records created at or after ``at_ms``)."""

    kind: KeyChangeKind
    deployer: str
    key_id: str
    at_ms: int | None = None

    @property
    def query(self) -> ImpactQuery:
        return ImpactQuery(
            DependencyKind.KEY, self.key_id, created_from_ms=self.at_ms if self.kind is KeyChangeKind.RETIRED else None
        )

    def cause(self, sequence: int) -> str:
        when = f" at {self.at_ms}" if self.kind is KeyChangeKind.RETIRED else ""
        return f"{self.kind.value} {self.deployer} {self.key_id}{when} (registry sequence {sequence})"


def key_changes(before: Registry | None, after: Registry) -> list[KeyChange]:
    """The keys ``after`` distrusts and ``before`` did not (``before=None``: every key ``after``
    distrusts, as a verifier starting up must assume it has not marked them yet)."""
    changes: list[KeyChange] = []
    for deployer, keys in sorted(after.deployers.items()):
        earlier = {} if before is None else before.deployers.get(deployer, {})
        for key_id, entry in sorted(keys.items()):
            old = earlier.get(key_id)
            if entry.revoked_ms is not None and (old is None or old.revoked_ms is None):
                changes.append(KeyChange(KeyChangeKind.REVOKED, deployer, key_id))
            elif entry.retired_ms is not None and (old is None or old.retired_ms != entry.retired_ms):
                changes.append(KeyChange(KeyChangeKind.RETIRED, deployer, key_id, entry.retired_ms))
    return changes


def distrusted_by(entry: VerdictEntry, registry: Registry) -> KeyChange | None:
    """The first key ``entry`` relied on that ``registry`` no longer trusts for that record, if any.
    A verdict reached just before a revocation arrived, and logged just after the verifier marked
    what the revocation reached, is caught this way."""
    for record in entry.records:
        for _, deployer, key_id in record.signatures():
            known = registry.deployers.get(deployer, {}).get(key_id)
            if known is None:
                continue
            if known.revoked_ms is not None:
                return KeyChange(KeyChangeKind.REVOKED, deployer, key_id)
            if known.retired_ms is not None and record.created_ms >= known.retired_ms:
                return KeyChange(KeyChangeKind.RETIRED, deployer, key_id, known.retired_ms)
    return None
