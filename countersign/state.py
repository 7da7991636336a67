"""The verifier's durable state, behind two interfaces, each with its in-memory reference.

* :class:`ReplayState`: what verification needs to remember across requests, which leaf nonces were
  consumed (so an accepted path cannot be accepted again) and which children each parent already has
  (so a parent's signed ``max_children`` holds across paths). Reference: :class:`InMemoryReplayState`.
* :class:`VerdictLog`: one entry per verdict the verifier answered, naming every record and signing
  key it relied on, so that "which accepted outputs relied on the key we just revoked?" is an indexed
  query (``countersign.impact`` walks it). Reference: :class:`InMemoryVerdictLog`.

A backend implements either or both (:class:`VerifierStore`; :class:`InMemoryState` is both
references in one). Durable backends (SQLite, PostgreSQL, DynamoDB) live with the verifier service,
keep both, and pass the same conformance suites as the references (tests/stores).
"""

from __future__ import annotations

import enum
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol, runtime_checkable

from countersign.reasons import Reason
from countersign.records import same_layout


@dataclass(frozen=True, slots=True)
class ChildEdge:
    """One parent-to-child edge of a verified path, to be counted against the parent's limit.

    ``retain_until_ms`` is when the entry may be forgotten: after the parent expires (plus the clock
    skew), no path through it can verify any more.
    """

    parent_digest: str
    child_nonce: str
    max_children: int
    retain_until_ms: int
    index: int


@dataclass(frozen=True, slots=True)
class LeafNonce:
    """The leaf record's nonce; consumed in accept mode, kept until ``retain_until_ms``.

    ``request_id`` (optional) is the caller's idempotency key: consuming a nonce that was consumed
    under the same non-empty key succeeds again, so a request retried after a lost answer gets its
    ACCEPT instead of NONCE_REPLAYED. Any other presentation of the nonce is a replay.
    """

    nonce: str
    retain_until_ms: int
    index: int
    request_id: str = ""


def new_leaf_nonce(nonce: str, retain_until_ms: int, index: int, request_id: str) -> LeafNonce:
    """``LeafNonce(...)`` without the frozen dataclass's generated ``__init__`` (as
    :func:`countersign.records.new_record`): a session's check makes one per receipt."""
    leaf: Any = _NEW(_LEAF_NONCE_LAYOUT)
    leaf.nonce = nonce
    leaf.retain_until_ms = retain_until_ms
    leaf.index = index
    leaf.request_id = request_id
    leaf.__class__ = LeafNonce
    return leaf  # type: ignore[no-any-return]


def new_child_edge(
    parent_digest: str, child_nonce: str, max_children: int, retain_until_ms: int, index: int
) -> ChildEdge:
    """``ChildEdge(...)`` without the generated ``__init__``: the walk makes one per counted edge."""
    edge: Any = _NEW(_CHILD_EDGE_LAYOUT)
    edge.parent_digest = parent_digest
    edge.child_nonce = child_nonce
    edge.max_children = max_children
    edge.retain_until_ms = retain_until_ms
    edge.index = index
    edge.__class__ = ChildEdge
    return edge  # type: ignore[no-any-return]


_NEW: Final[Callable[[type], Any]] = object.__new__
_LEAF_NONCE_LAYOUT, _CHILD_EDGE_LAYOUT = same_layout(LeafNonce), same_layout(ChildEdge)


@dataclass(frozen=True, slots=True)
class EarlierAcceptance:
    """The leaf nonce was already consumed under the same non-empty ``request_id``: this admit is a
    retry of that acceptance, made at ``accepted_ms`` (the ``now_ms`` of the admit that consumed it;
    0 when the store holds no time, for an entry consumed before stores kept one), and consumed
    nothing. Of concurrent admits of one nonce under one key exactly one returns None."""

    accepted_ms: int


@dataclass(frozen=True, slots=True)
class StateRejection:
    reason: Reason
    index: int


@runtime_checkable
class ReplayState(Protocol):
    """Replay admission: consumed leaf nonces and child sets. Implementations must make :meth:`admit`
    atomic across every verifier sharing the store: two concurrent calls for the same leaf nonce accept
    at most one, and concurrent children of one parent never exceed ``max_children``.

    Methods raise :class:`countersign.errors.StateUnavailable` when the store cannot be reached; they
    never turn an outage into an accept or a reject.
    """

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        """Check (``consume=False``: audit) or check and record (``consume=True``) a verified path.

        Each edge's child joins its parent's child set unless the set already holds ``max_children``
        other children (``FANOUT_EXCEEDED`` at ``edge.index``); a child already in the set always
        passes. With ``consume=True`` the leaf nonce is then consumed, or ``NONCE_REPLAYED`` returned
        if it already was (unless it was consumed under the same non-empty ``leaf.request_id``: then
        :class:`EarlierAcceptance` with the time of that consumption). Audit mode records nothing
        and does not look at consumed nonces.
        """
        ...

    def admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        """:meth:`admit` for a verified session (docs/spec.md 17.5): the agent path's ``edges`` once, and
        every receipt's nonce in ``leaves``, ALL OR NOTHING. With ``consume=True``, if any leaf nonce
        was already consumed (other than under the same non-empty ``request_id``), or repeats an
        earlier leaf of the session, the answer is ``NONCE_REPLAYED`` at the lowest such leaf index and
        nothing at all is recorded: no nonce and no edge. If EVERY leaf nonce was already consumed
        under the same non-empty ``request_id`` (a retried session: this call consumes nothing), the
        answer is :class:`EarlierAcceptance` with the latest of their acceptance times (the acceptance
        that completed the set). Audit mode checks the edges only, as :meth:`admit` does. Raises
        :class:`countersign.errors.StateUnavailable` when the store cannot be reached, and ValueError
        for no leaf, or (in accept mode) more than :attr:`max_session_leaves`."""
        ...

    @property
    def max_session_leaves(self) -> int:
        """The most receipts one :meth:`admit_session` can consume atomically in this store (audit mode
        writes nothing and takes up to :data:`MAX_SESSION_LEAVES`)."""
        ...

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Forget at most ``limit`` entries whose retention ended before ``now_ms``; return how many.
        A backend that also keeps the verdict log forgets its expired verdicts in the same call (one
        pass over its store), counted among the entries: :meth:`VerdictLog.collect_expired`."""
        ...

    def entry_count(self) -> int:
        """Entries held (consumed nonces plus child-set members): what collection keeps bounded."""
        ...

    def close(self) -> None: ...


VerifierState = ReplayState
"""The name :class:`ReplayState` had while it was the only verifier state (before issue 31); the core's
``verify_path`` and the SDK's consumer still take their ``state`` under it."""


# --- the verdict log -------------------------------------------------------------------------

MAX_VERDICT_TIME_MS: Final = 10**13 - 1
"""Verdict times must fit 13 decimal digits (until the year 2286): stores sort them as text."""

MAX_LOOKUP_VERDICTS: Final = 100_000
"""The most verdicts one log lookup returns (an impact walk says when it was cut short)."""


class DependencyKind(enum.StrEnum):
    """What a verdict can be looked up by in the log."""

    KEY = "key"
    """A key id that signed or co-signed one of its records."""
    RECORD = "record"
    """The digest (``sha256:`` of the canonical envelope) of one of its records."""
    DEPLOYER = "deployer"
    """A deployer that issued or co-signed one of its records."""


@dataclass(frozen=True, slots=True)
class CoSigner:
    """A co-signature a record carries: the edge's ``parent`` or ``child`` deployer and its key."""

    role: str
    deployer: str
    key_id: str


@dataclass(frozen=True, slots=True)
class RecordUse:
    """One record of a verified path, as the verdict log keeps it: what the verdict relied on."""

    digest: str
    deployer: str
    key_id: str
    created_ms: int
    cosigners: tuple[CoSigner, ...] = ()

    def signatures(self) -> tuple[tuple[str, str, str], ...]:
        """(role, deployer, key id) of every signature on the record: its issuer's, then co-signers'."""
        return (("signer", self.deployer, self.key_id), *((c.role, c.deployer, c.key_id) for c in self.cosigners))

    def depends_on(self, kind: DependencyKind, value: str) -> bool:
        if kind is DependencyKind.RECORD:
            return self.digest == value
        column = 2 if kind is DependencyKind.KEY else 1
        return any(signature[column] == value for signature in self.signatures())


@dataclass(frozen=True, slots=True)
class VerdictEntry:
    """One verdict the verifier answered, as its log keeps it.

    ``records`` runs root to leaf (empty when the path did not parse); ``client`` is the caller's
    certificate identity and ``request_id`` its idempotency key as sent ("" for none). The last two
    fields belong to the log: a verdict is recorded unmarked, and only
    :meth:`VerdictLog.mark_needs_revalidation` sets them.
    """

    verdict_id: str
    time_ms: int
    mode: str
    client: str
    request_id: str
    registry_sequence: int
    verdict: str
    reason: str
    construction: str
    records: tuple[RecordUse, ...]
    retain_until_ms: int
    needs_revalidation: bool = False
    revalidation_cause: str = ""

    @property
    def accepted(self) -> bool:
        return self.verdict == "ACCEPT"

    def depends_on(self, kind: DependencyKind, value: str) -> bool:
        return any(record.depends_on(kind, value) for record in self.records)


MAX_CAUSE_CHARS: Final = 256
"""A revalidation cause is kept to this many characters (it is counted in every entry's bytes)."""

VERDICT_ROW_BYTES: Final = 200
"""What a logged verdict counts for beside its variable text: its fixed columns and index entries."""

PATH_ROW_BYTES: Final = 100
USE_ROW_BYTES: Final = 120
"""What a stored path counts for beside its records' JSON, and each of its index entries."""


@dataclass(frozen=True, slots=True)
class ClientUsage:
    """What one client identity holds in the verdict log: its verdicts, and the bytes they and its
    paths count for."""

    rows: int
    bytes: int


def path_json(records: Sequence[RecordUse]) -> str:
    """The records a verdict relied on, as the log stores them once per path: compact JSON
    ``[[digest, deployer, key_id, created_ms, [[role, deployer, key_id], ...]], ...]``."""
    return json.dumps(
        [[r.digest, r.deployer, r.key_id, r.created_ms, [[c.role, c.deployer, c.key_id] for c in r.cosigners]]
         for r in records],
        separators=(",", ":"),
    )  # fmt: skip


def records_from_json(text: str) -> tuple[RecordUse, ...]:
    """:func:`path_json` read back. Raises ValueError (or KeyError, TypeError) on anything else."""
    return tuple(
        RecordUse(
            str(digest), str(deployer), str(key_id), int(created), tuple(CoSigner(*map(str, c)) for c in cosigners)
        )
        for digest, deployer, key_id, created, cosigners in json.loads(text)
    )


def path_digest(construction: str, records: Sequence[RecordUse]) -> bytes | None:
    """The key a path is stored under (SHA-256 of its construction and :func:`path_json`); None for a
    verdict on no path (the input did not parse)."""
    if not records:
        return None
    return hashlib.sha256(f"{construction}\n{path_json(records)}".encode()).digest()


def path_uses(records: Sequence[RecordUse]) -> list[tuple[DependencyKind, str]]:
    """Every record, key and deployer a path relies on (each once): its index entries."""
    uses: dict[tuple[DependencyKind, str], None] = {}
    for record in records:
        uses[DependencyKind.RECORD, record.digest] = None
        for _, deployer, key_id in record.signatures():
            uses[DependencyKind.KEY, key_id] = None
            uses[DependencyKind.DEPLOYER, deployer] = None
    return list(uses)


def verdict_bytes(entry: VerdictEntry) -> int:
    """What a logged verdict counts for against the log's byte bound (its path apart)."""
    text = (entry.verdict_id, entry.mode, entry.client, entry.request_id, entry.verdict, entry.reason)
    return VERDICT_ROW_BYTES + sum(len(t.encode()) for t in text) + MAX_CAUSE_CHARS


def path_bytes(construction: str, records: Sequence[RecordUse]) -> int:
    """What a stored path counts for: its records' JSON and its index entries (0 for no path)."""
    if not records:
        return 0
    uses = path_uses(records)
    return (
        PATH_ROW_BYTES + len(construction) + len(path_json(records).encode())
        + sum(USE_ROW_BYTES + len(value) for _, value in uses)
    )  # fmt: skip


def bounded_cause(cause: str) -> str:
    return cause if len(cause) <= MAX_CAUSE_CHARS else cause[: MAX_CAUSE_CHARS - 3] + "..."


TRIM_BYTES_BATCH: Final = 64
"""Verdicts of the largest holder forgotten at once while the log is over its byte bound."""


def trim_by_share(
    usage: dict[str, ClientUsage],
    max_rows: int,
    max_bytes: int | None,
    limit: int,
    forget_oldest: Callable[[str, int], ClientUsage],
) -> int:
    """The trimming rule every store follows: while the log is over ``max_rows`` (or ``max_bytes``),
    forget the oldest verdicts of the client holding the most rows (bytes), the smaller identity
    first among equals; ``forget_oldest(client, n)`` forgets ``n`` and says how many rows and bytes
    went. Over rows, as many at once as keep that client the largest holder; over bytes,
    :data:`TRIM_BYTES_BATCH`. Stops after ``limit``. ``usage`` is updated; returns how many went."""
    held = dict(usage)
    removed = 0
    while removed < limit:
        rows = sum(u.rows for u in held.values())
        total = sum(u.bytes for u in held.values())
        by_rows = rows > max_rows
        if not by_rows and (max_bytes is None or total <= max_bytes):
            break
        ranked = sorted(
            (c for c in held if held[c].rows > 0),
            key=lambda c: (-(held[c].rows if by_rows else held[c].bytes), c),
        )
        if not ranked:
            break
        top = ranked[0]
        if by_rows:
            second = held[ranked[1]].rows if len(ranked) > 1 else 0
            keeps_lead = len(ranked) > 1 and top < ranked[1]
            count = max(1, held[top].rows - second + (1 if keeps_lead else 0))
            count = min(count, rows - max_rows)
        else:
            count = TRIM_BYTES_BATCH
        count = min(count, limit - removed, held[top].rows)
        gone = forget_oldest(top, count)
        if gone.rows == 0:
            break  # another replica's collector took them meanwhile
        held[top] = ClientUsage(held[top].rows - gone.rows, held[top].bytes - gone.bytes)
        removed += gone.rows
    usage.update(held)
    return removed


@runtime_checkable
class VerdictLog(Protocol):
    """The verifier's durable, bounded log of its verdicts. Every method raises
    :class:`countersign.errors.StateUnavailable` when the store cannot be reached.

    What repeats is stored once (issue 29): a verdict names its path by :func:`path_digest`, and each
    client identity's store holds each of its paths once, with the path's index entries (every key,
    record and deployer it relies on). A verdict on a path its client logged before adds one row.

    Lookups return accepted verdicts only: a rejected path relied on nothing, and no revocation can
    make it acceptable. Entries are returned oldest first (by time, then id), at most ``limit``.

    The log is bounded in rows and in bytes (:func:`verdict_bytes`, :func:`path_bytes`: what an entry
    and a path count for, the same on every backend), and each client identity gets its share: the
    verdicts trimmed are always the oldest of the client holding the most (:func:`trim_by_share`), so
    one client flooding the log pushes out only its own.
    """

    def record_verdict(self, entry: VerdictEntry) -> None:
        """Durably record ``entry`` (with its path, if the client's store does not hold it yet), all
        of it or nothing."""
        ...

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        """Durably record every one of ``entries``, in one transaction (one flush) where the store
        has them (SQLite, PostgreSQL: all or none); DynamoDB writes each as :meth:`record_verdict`
        does. A group commit of concurrent verdicts (``countersign._daemon.group_commit``)."""
        ...

    def accepts_relying_on(
        self,
        kind: DependencyKind,
        values: Sequence[str],
        *,
        since_ms: int = 0,
        limit: int = MAX_LOOKUP_VERDICTS,
        client: str | None = None,
    ) -> list[VerdictEntry]:
        """Accepted verdicts at or after ``since_ms`` with a record that depends on any of ``values``;
        only those of ``client`` when it is given (a consumer sees its own verdicts only)."""
        ...

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        """Flag these logged verdicts (as a lookup returned them; nothing is deleted) with ``cause``
        (cut to :data:`MAX_CAUSE_CHARS`); return how many were not flagged before, so replicas sharing
        a store count each verdict once."""
        ...

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000, *, max_bytes: int | None = None) -> int:
        """Forget verdicts while the log holds more than ``max_rows`` of them or (given) more than
        ``max_bytes``, each time the oldest of the client holding the most (:func:`trim_by_share`), at
        most ``limit``; return how many. A path goes with the last of its client's verdicts on it.
        Verdicts past their ``retain_until_ms`` go with :meth:`collect_expired`."""
        ...

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Forget at most ``limit`` verdicts whose ``retain_until_ms`` is before ``now_ms`` (and each
        path with the last of its client's verdicts on it); return how many verdicts. A backend that
        also keeps replay state forgets its expired entries in the same call
        (:meth:`ReplayState.collect_expired`): the verifier calls it once per backend."""
        ...

    def close(self) -> None: ...

    def verdict_count(self) -> int:
        """Verdicts held in the log."""
        ...

    def verdict_usage(self) -> dict[str, ClientUsage]:
        """Rows and bytes each client identity holds (what trimming shares out)."""
        ...


@runtime_checkable
class VerifierStore(ReplayState, VerdictLog, Protocol):
    """A backend that keeps both: replay state and the verdict log, in one store (every built-in durable
    backend does). Its one :meth:`collect_expired` forgets expired entries of both."""


def _oldest_first(entry: VerdictEntry) -> tuple[int, str]:
    return entry.time_ms, entry.verdict_id


MAX_SESSION_LEAVES: Final = 65_536
"""The most receipts a session admission consumes in the stores without a per-transaction item limit
(the core's own bound on a session, ``countersign.sessions.MAX_SESSION_RECEIPTS``)."""


def check_session_leaves(leaves: Sequence[LeafNonce], limit: int) -> None:
    """Raise ValueError unless there are 1 to ``limit`` leaves: a caller bounds sessions first."""
    if not 1 <= len(leaves) <= limit:
        raise ValueError(f"a session admission takes 1 to {limit} receipts in this store, not {len(leaves)}")


def first_repeated_leaf(leaves: Sequence[LeafNonce]) -> int | None:
    """The index of the first leaf whose nonce an earlier leaf of the same session already carries: a
    session cannot consume one nonce twice (its signer never issues that; a forger could)."""
    seen: set[str] = set()
    for leaf in leaves:
        if leaf.nonce in seen:
            return leaf.index
        seen.add(leaf.nonce)
    return None


class InMemoryReplayState:
    """The reference :class:`ReplayState`, process-local: for tests, the conformance harness and
    one-shot command-line checks. Every backend answers as it does (tests/stores)."""

    def __init__(self) -> None:
        self._replay_lock = threading.Lock()
        self._nonces: dict[str, tuple[int, str, int]] = {}  # nonce -> (retain until, request id, accepted)
        self._children: dict[str, dict[str, int]] = {}

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        with self._replay_lock:
            for edge in edges:
                children = self._children.get(edge.parent_digest, {})
                if edge.child_nonce not in children and len(children) >= edge.max_children:
                    return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            if not consume:
                return None
            for edge in edges:
                self._children.setdefault(edge.parent_digest, {})[edge.child_nonce] = edge.retain_until_ms
            consumed = self._nonces.get(leaf.nonce)
            if consumed is not None:
                if leaf.request_id and consumed[1] == leaf.request_id:
                    return EarlierAcceptance(consumed[2])
                return StateRejection(Reason.NONCE_REPLAYED, leaf.index)
            self._nonces[leaf.nonce] = (leaf.retain_until_ms, leaf.request_id, now_ms)
            return None

    def admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        check_session_leaves(leaves, self.max_session_leaves if consume else MAX_SESSION_LEAVES)
        with self._replay_lock:
            for edge in edges:
                children = self._children.get(edge.parent_digest, {})
                if edge.child_nonce not in children and len(children) >= edge.max_children:
                    return StateRejection(Reason.FANOUT_EXCEEDED, edge.index)
            if not consume:
                return None
            repeated = first_repeated_leaf(leaves)
            for leaf in leaves:
                consumed = self._nonces.get(leaf.nonce)
                if consumed is not None and not (leaf.request_id and consumed[1] == leaf.request_id):
                    repeated = leaf.index if repeated is None else min(repeated, leaf.index)
                    break
            if repeated is not None:
                return StateRejection(Reason.NONCE_REPLAYED, repeated)
            for edge in edges:
                self._children.setdefault(edge.parent_digest, {})[edge.child_nonce] = edge.retain_until_ms
            earlier = [consumed[2] for leaf in leaves if (consumed := self._nonces.get(leaf.nonce)) is not None]
            if len(earlier) == len(leaves):
                return EarlierAcceptance(max(earlier))
            for leaf in leaves:  # a receipt retried under the same request id keeps its first time
                self._nonces.setdefault(leaf.nonce, (leaf.retain_until_ms, leaf.request_id, now_ms))
            return None

    @property
    def max_session_leaves(self) -> int:
        return MAX_SESSION_LEAVES

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        with self._replay_lock:
            expired = [n for n, (until, _, _) in self._nonces.items() if until < now_ms][:limit]
            for nonce in expired:
                del self._nonces[nonce]
            removed = len(expired)
            for parent in list(self._children):
                if removed >= limit:
                    break
                children = self._children[parent]
                for child in [c for c, until in children.items() if until < now_ms][: limit - removed]:
                    del children[child]
                    removed += 1
                if not children:
                    del self._children[parent]
            return removed

    def entry_count(self) -> int:
        with self._replay_lock:
            return len(self._nonces) + sum(len(c) for c in self._children.values())

    def close(self) -> None:
        return None


class InMemoryVerdictLog:
    """The reference :class:`VerdictLog`, process-local. Every backend answers as it does (tests/stores)."""

    def __init__(self) -> None:
        self._log_lock = threading.Lock()
        self._verdicts: dict[str, VerdictEntry] = {}
        self._path_refs: dict[tuple[str, bytes], int] = {}  # (client, path digest) -> its verdicts held

    def record_verdict(self, entry: VerdictEntry) -> None:
        self.record_verdicts([entry])

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        with self._log_lock:
            for entry in entries:
                if entry.verdict_id in self._verdicts:
                    continue
                digest = path_digest(entry.construction, entry.records)
                if digest is not None:
                    key = (entry.client, digest)
                    self._path_refs[key] = self._path_refs.get(key, 0) + 1
                self._verdicts[entry.verdict_id] = replace(entry, needs_revalidation=False, revalidation_cause="")

    def accepts_relying_on(
        self,
        kind: DependencyKind,
        values: Sequence[str],
        *,
        since_ms: int = 0,
        limit: int = MAX_LOOKUP_VERDICTS,
        client: str | None = None,
    ) -> list[VerdictEntry]:
        wanted = set(values)
        with self._log_lock:
            found = [
                entry
                for entry in self._verdicts.values()
                if entry.accepted
                and entry.time_ms >= since_ms
                and (client is None or entry.client == client)
                and any(entry.depends_on(kind, value) for value in wanted)
            ]
        return sorted(found, key=lambda e: (e.time_ms, e.verdict_id))[:limit]

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        marked = 0
        with self._log_lock:
            for verdict_id in dict.fromkeys(v.verdict_id for v in verdicts):
                entry = self._verdicts.get(verdict_id)
                if entry is not None and not entry.needs_revalidation:
                    self._verdicts[verdict_id] = replace(
                        entry, needs_revalidation=True, revalidation_cause=bounded_cause(cause)
                    )
                    marked += 1
        return marked

    def _forget(self, verdict_ids: Sequence[str]) -> ClientUsage:
        """Forget these verdicts, and each path with the last of its client's verdicts on it."""
        rows = freed = 0
        for verdict_id in verdict_ids:
            entry = self._verdicts.pop(verdict_id, None)
            if entry is None:
                continue
            rows += 1
            freed += verdict_bytes(entry)
            digest = path_digest(entry.construction, entry.records)
            if digest is not None:
                key = (entry.client, digest)
                self._path_refs[key] -= 1
                if self._path_refs[key] == 0:
                    del self._path_refs[key]
                    freed += path_bytes(entry.construction, entry.records)
        return ClientUsage(rows, freed)

    def _usage(self) -> dict[str, ClientUsage]:
        usage: dict[str, ClientUsage] = {}
        paths: dict[tuple[str, bytes], int] = {}
        for entry in self._verdicts.values():
            held = usage.get(entry.client, ClientUsage(0, 0))
            usage[entry.client] = ClientUsage(held.rows + 1, held.bytes + verdict_bytes(entry))
            digest = path_digest(entry.construction, entry.records)
            if digest is not None:
                paths[entry.client, digest] = path_bytes(entry.construction, entry.records)
        for (client, _), size in paths.items():
            held = usage[client]
            usage[client] = ClientUsage(held.rows, held.bytes + size)
        return usage

    def verdict_usage(self) -> dict[str, ClientUsage]:
        with self._log_lock:
            return self._usage()

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000, *, max_bytes: int | None = None) -> int:
        with self._log_lock:

            def forget_oldest(client: str, count: int) -> ClientUsage:
                mine = sorted((e for e in self._verdicts.values() if e.client == client), key=_oldest_first)
                return self._forget([e.verdict_id for e in mine[:count]])

            return trim_by_share(self._usage(), max_rows, max_bytes, limit, forget_oldest)

    def verdict_count(self) -> int:
        with self._log_lock:
            return len(self._verdicts)

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        with self._log_lock:
            expired = [v for v, e in self._verdicts.items() if e.retain_until_ms < now_ms]
            return self._forget(expired[: max(0, limit)]).rows

    def close(self) -> None:
        return None


class InMemoryState(InMemoryReplayState, InMemoryVerdictLog):
    """Both references in one object (a :class:`VerifierStore`), as the durable backends keep both:
    its :meth:`collect_expired` forgets expired replay entries first, then verdicts, ``limit`` in all."""

    def __init__(self) -> None:
        InMemoryReplayState.__init__(self)
        InMemoryVerdictLog.__init__(self)

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        removed = InMemoryReplayState.collect_expired(self, now_ms, limit)
        return removed + InMemoryVerdictLog.collect_expired(self, now_ms, max(0, limit - removed))

    def close(self) -> None:
        return None
