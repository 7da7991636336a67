"""The verifier's durable state, behind one interface, and its in-memory implementation.

Verification needs to remember two things across requests: which leaf nonces were consumed (so an
accepted path cannot be accepted again) and which children each parent already has (so a parent's
signed ``max_children`` holds across paths). Durable backends (SQLite, PostgreSQL, DynamoDB) live with
the verifier service; they implement the same :class:`VerifierState` and pass the same conformance
suite.

The same stores keep the verifier's **verdict log** (:class:`VerdictLog`): one entry per verdict the
verifier answered, naming every record and signing key it relied on, so that "which accepted outputs
relied on the key we just revoked?" is an indexed query (``countersign.impact`` walks it).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

from countersign.reasons import Reason


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


class VerifierState(Protocol):
    """Durable verifier state. Implementations must make :meth:`admit` atomic across every verifier
    sharing the store: two concurrent calls for the same leaf nonce accept at most one, and concurrent
    children of one parent never exceed ``max_children``.

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
        A store that also keeps the verdict log forgets its expired verdicts here too."""
        ...

    def entry_count(self) -> int:
        """Entries held (consumed nonces plus child-set members): what collection keeps bounded."""
        ...

    def close(self) -> None: ...


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


class VerdictLog(Protocol):
    """The verifier's durable, bounded log of its verdicts. Every method raises
    :class:`countersign.errors.StateUnavailable` when the store cannot be reached.

    Lookups return accepted verdicts only: a rejected path relied on nothing, and no revocation can
    make it acceptable. Entries are returned oldest first (by time, then id), at most ``limit``.
    """

    def record_verdict(self, entry: VerdictEntry) -> None:
        """Durably record ``entry`` (with its records and signatures), all of it or nothing."""
        ...

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        """Durably record every one of ``entries``, in one transaction (one flush) where the store
        has them (SQLite, PostgreSQL: all or none); DynamoDB writes each as :meth:`record_verdict`
        does. A group commit of concurrent verdicts (``countersign._daemon.group_commit``)."""
        ...

    def accepts_relying_on(
        self, kind: DependencyKind, values: Sequence[str], *, since_ms: int = 0, limit: int = MAX_LOOKUP_VERDICTS
    ) -> list[VerdictEntry]:
        """Accepted verdicts at or after ``since_ms`` with a record that depends on any of ``values``."""
        ...

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        """Flag these logged verdicts (as a lookup returned them; nothing is deleted) with ``cause``;
        return how many were not flagged before, so replicas sharing a store count each verdict once."""
        ...

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000) -> int:
        """Forget the oldest verdicts beyond ``max_rows`` (at most ``limit`` of them); return how many.
        Verdicts past their ``retain_until_ms`` go with :meth:`VerifierState.collect_expired`."""
        ...

    def verdict_count(self) -> int:
        """Verdicts held in the log."""
        ...


class VerifierStore(VerifierState, VerdictLog, Protocol):
    """What a verifier's store gives it: the state verification needs, and the verdict log."""


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


class InMemoryState:
    """Process-local state for tests, the conformance harness and one-shot command-line checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nonces: dict[str, tuple[int, str, int]] = {}  # nonce -> (retain until, request id, accepted)
        self._children: dict[str, dict[str, int]] = {}
        self._verdicts: dict[str, VerdictEntry] = {}

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        with self._lock:
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
        with self._lock:
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
        with self._lock:
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
            expired_verdicts = [v for v, e in self._verdicts.items() if e.retain_until_ms < now_ms]
            for verdict_id in expired_verdicts[: max(0, limit - removed)]:
                del self._verdicts[verdict_id]
                removed += 1
            return removed

    def close(self) -> None:
        return None

    def entry_count(self) -> int:
        with self._lock:
            return len(self._nonces) + sum(len(c) for c in self._children.values())

    def record_verdict(self, entry: VerdictEntry) -> None:
        self.record_verdicts([entry])

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        with self._lock:
            for entry in entries:
                self._verdicts[entry.verdict_id] = replace(entry, needs_revalidation=False, revalidation_cause="")

    def accepts_relying_on(
        self, kind: DependencyKind, values: Sequence[str], *, since_ms: int = 0, limit: int = MAX_LOOKUP_VERDICTS
    ) -> list[VerdictEntry]:
        wanted = set(values)
        with self._lock:
            found = [
                entry
                for entry in self._verdicts.values()
                if entry.accepted
                and entry.time_ms >= since_ms
                and any(entry.depends_on(kind, value) for value in wanted)
            ]
        return sorted(found, key=lambda e: (e.time_ms, e.verdict_id))[:limit]

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        marked = 0
        with self._lock:
            for verdict_id in dict.fromkeys(v.verdict_id for v in verdicts):
                entry = self._verdicts.get(verdict_id)
                if entry is not None and not entry.needs_revalidation:
                    self._verdicts[verdict_id] = replace(entry, needs_revalidation=True, revalidation_cause=cause)
                    marked += 1
        return marked

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000) -> int:
        with self._lock:
            excess = min(max(0, len(self._verdicts) - max_rows), limit)
            oldest = sorted(self._verdicts.values(), key=lambda e: (e.time_ms, e.verdict_id))[:excess]
            for entry in oldest:
                del self._verdicts[entry.verdict_id]
            return len(oldest)

    def verdict_count(self) -> int:
        with self._lock:
            return len(self._verdicts)
