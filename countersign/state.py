"""The verifier's durable state, behind one interface, and its in-memory implementation.

Verification needs to remember two things across requests: which leaf nonces were consumed (so an
accepted path cannot be accepted again) and which children each parent already has (so a parent's
signed ``max_children`` holds across paths). Durable backends (SQLite, PostgreSQL, DynamoDB) live with
the verifier service; they implement the same :class:`VerifierState` and pass the same conformance
suite.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
    ) -> StateRejection | None:
        """Check (``consume=False``: audit) or check and record (``consume=True``) a verified path.

        Each edge's child joins its parent's child set unless the set already holds ``max_children``
        other children (``FANOUT_EXCEEDED`` at ``edge.index``); a child already in the set always
        passes. With ``consume=True`` the leaf nonce is then consumed, or ``NONCE_REPLAYED`` returned
        if it already was (unless it was consumed under the same non-empty ``leaf.request_id``: then
        it succeeds again). Audit mode records nothing and does not look at consumed nonces.
        """
        ...

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Forget at most ``limit`` entries whose retention ended before ``now_ms``; return how many."""
        ...

    def entry_count(self) -> int:
        """Entries held (consumed nonces plus child-set members): what collection keeps bounded."""
        ...

    def close(self) -> None: ...


class InMemoryState:
    """Process-local state for tests, the conformance harness and one-shot command-line checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nonces: dict[str, tuple[int, str]] = {}
        self._children: dict[str, dict[str, int]] = {}

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | None:
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
                    return None
                return StateRejection(Reason.NONCE_REPLAYED, leaf.index)
            self._nonces[leaf.nonce] = (leaf.retain_until_ms, leaf.request_id)
            return None

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        with self._lock:
            expired = [n for n, (until, _) in self._nonces.items() if until < now_ms][:limit]
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

    def close(self) -> None:
        return None

    def entry_count(self) -> int:
        with self._lock:
            return len(self._nonces) + sum(len(c) for c in self._children.values())
