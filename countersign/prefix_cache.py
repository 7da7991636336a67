"""The verified-prefix cache (ADR 0028): a verifier that already verified a path's prefix checks only
what is new below it.

An entry says "the records with these envelope digests, in this order, passed every check of the
path walk that does not depend on the time, under this registry and this verifier policy", and holds
what the walk knew after them (the parent digest, the Merkle state, the nonces seen, the depth limit,
the fan-out edges). It is keyed by the content digests of the prefix's envelopes together with the
registry's own content digest, its sequence and the policy, so a revocation or any other registry
change can never reuse an entry: the cache is emptied when it sees another registry, and it is never
shared between registries. The time windows of the cached records, the output binding and the
durable state (replay and fan-out) are still checked on every verification.

It also remembers the signed envelopes of the paths it stored, by their signature, so parsing a path
skips the schema checks of an envelope already seen (:meth:`Envelope.from_json_known`: one held under
the same signature that equals the presented value as JSON; everything else is parsed in full).

Bounded: at most ``max_entries`` prefixes and half as many envelopes, least recently used first out;
a receipt (a record with an output, new for every output) is not remembered as an envelope. Measured
here: about 1.1 KB per entry and 4.5 KB per envelope in the interpreter, so a full cache of the
default size holds at most about 14 MB, whatever the traffic (issue 29: four times as many envelopes
as prefixes, every receipt among them, made a verifier under a stream of new outputs 1.5 times its
idle size). Signatures are skipped by prefix, so fewer envelopes only means parsing a record's
schema again. Pure data, no I/O; safe to share between threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

from countersign.canonical import canonicalize_validated, sha256_digest
from countersign.records import Envelope
from countersign.registry import Registry
from countersign.state import ChildEdge

DEFAULT_MAX_ENTRIES = 4_096
MAX_ENTRIES_LIMIT = 1_000_000


@dataclass(frozen=True, slots=True)
class PrefixState:
    """What the walk knows once the first ``length`` records have passed their checks."""

    length: int
    parent_digest: str
    """The digest of the prefix's last envelope (what its child's ``parent`` names under the chains)."""
    merkle_subtrees: tuple[tuple[int, bytes], ...] | None
    nonces: frozenset[str]
    depth_limit: int
    edges: tuple[ChildEdge, ...]
    latest_created_ms: int
    earliest_expires_ms: int


def registry_digest(registry: Registry) -> str:
    """The registry's content digest: its identity, whatever object or process holds it."""
    return sha256_digest(canonicalize_validated(registry.to_json()))


class PrefixCache:
    """A bounded LRU of verified prefixes for one verifier (see the module docstring)."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if not 1 <= max_entries <= MAX_ENTRIES_LIMIT:
            raise ValueError(f"max_entries must be between 1 and {MAX_ENTRIES_LIMIT}")
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, PrefixState] = OrderedDict()
        self._envelopes: OrderedDict[str, Envelope] = OrderedDict()
        self._lock = threading.Lock()
        self._registry: Registry | None = None  # held, so its identity cannot be reused by another object
        self._registry_digest = ""
        self.hits = 0
        self.misses = 0

    def epoch(self, registry: Registry, policy: Hashable) -> tuple[str, int, Hashable]:
        """The part of every key that names the registry and the policy. Seeing a registry with other
        contents empties the cache (entries under the old one could never match again anyway)."""
        with self._lock:
            if registry is not self._registry:
                digest = registry_digest(registry)
                if digest != self._registry_digest:
                    self._entries.clear()
                    self._envelopes.clear()
                    self._registry_digest = digest
                self._registry = registry
            return (self._registry_digest, registry.sequence, policy)

    def get(self, key: Hashable) -> PrefixState | None:
        with self._lock:
            state = self._entries.get(key)
            if state is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return state

    def put(self, key: Hashable, state: PrefixState) -> None:
        with self._lock:
            self._entries[key] = state
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def known_envelope(self, sig: str) -> Envelope | None:
        """The envelope last stored with the signature ``sig``, if any (the caller compares contents)."""
        with self._lock:
            envelope = self._envelopes.get(sig)
            if envelope is not None:
                self._envelopes.move_to_end(sig)
            return envelope

    def remember_envelopes(self, envelopes: tuple[Envelope, ...]) -> None:
        with self._lock:
            for envelope in envelopes:
                if envelope.sig is not None:  # the unsigned baselines are parsed in full
                    self._envelopes[envelope.sig] = envelope
                    self._envelopes.move_to_end(envelope.sig)
            while len(self._envelopes) > max(1, self.max_entries // 2):
                self._envelopes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._envelopes.clear()

    def __len__(self) -> int:
        return len(self._entries)
