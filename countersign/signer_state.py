"""The signer's durable state as a contract: what a signing call reads, and the one conditional write
it makes (docs/spec.md 21, ADR 0033).

Every signing call has one shape, whatever backend holds the state and however many replicas share it:

1. **read** what the call needs (:class:`StateReads` names it; a backend answers a :class:`StateView`);
2. **decide** in the core (:mod:`countersign.cosigning`: pure, from the view), sign what is allowed;
3. **write once, conditionally** (:class:`StateWrite`): every part of the write holds a condition on
   the state it was decided from, and a backend applies the write whole or not at all. A write whose
   condition no longer holds (another replica spent the grant, took the next ``seq``, filled the last
   child slot) is a *conflict*: nothing of it is stored, its signatures are never handed out, and the
   call reads again and decides again.

So the rules never run inside a backend's transaction, a backend needs no lock held across a decision,
and DynamoDB's conditional transactions express the same writes as SQL does. :class:`SignerStateModel`
is the reference semantics every backend is held to (``tests/signer/test_signer_state_backends.py``).

Pure: no clock, no I/O; times are arguments.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from countersign.errors import ErrorCode
from countersign.records import StreamUnit

MAX_REQUEST_ID = 128  # characters; the same bound VerifyPath's request_id has


@dataclass(frozen=True, slots=True)
class StoredGrant:
    """An open grant as the parent's signer stores it: one named child deployer may attach one child
    under the record ``parent`` (its digest) until ``expires_ms``. Once spent, ``manifest_digest`` is
    the edge it was spent on and ``parent_cosig`` the co-signature answered (JSON)."""

    grant_id: str
    parent: str
    child_deployer: str
    expires_ms: int
    manifest_digest: str | None = None
    parent_cosig: str | None = None


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session as the signer stores it: the agent record it belongs to (its digest; None when stored
    before this was kept), the last receipt issued, whether it is closed, and its stream's (unit, n)."""

    session: str
    agent: str | None
    last_seq: int
    last_digest: str
    closed: bool = False
    stream: tuple[StreamUnit, int] | None = None


@dataclass(frozen=True, slots=True)
class Proposal:
    """The child side of a delegation under one grant: the parent record it names, the child record
    proposed (canonical JSON, co-signatures empty), the child's co-signature (JSON), kept until the
    child record expires; once sealed, the path that was answered."""

    grant_id: str
    parent: str
    child_record: bytes
    child_cosig: str
    expires_ms: int
    sealed_path: bytes | None = None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A signing call answered under a runtime's ``request_id``: the call's fingerprint (what was asked,
    see :func:`request_fingerprint`) and its answer, kept until ``expires_ms``. A retry of the call under
    the same id gets this answer back (spec 21.2).

    ``record``: when the answer carries the path of a record issued in the same write, that record's
    digest, and ``answer`` is kept without the path (it is kept once, with the record, not twice)."""

    request_id: str
    fingerprint: str
    answer: bytes
    expires_ms: int
    record: str = ""


@dataclass(frozen=True, slots=True)
class IssuedRecord:
    """A record this signer issued: its envelope's digest, the canonical path ending at it, its expiry.
    Content-addressed: writing the same record twice is writing it once."""

    digest: str
    path: bytes
    expires_ms: int


@dataclass(frozen=True, slots=True)
class NewChild:
    """A child slot spent under ``parent``. Condition: the parent has no child with this nonce yet and
    fewer than ``max_children`` children. ``expires_ms`` is the parent's (what the slot is kept for)."""

    parent: str
    nonce: str
    max_children: int
    expires_ms: int


@dataclass(frozen=True, slots=True)
class SessionUpdate:
    """A session's new state. Condition: the session's stored last ``seq`` is ``previous_seq``, or it is
    not stored at all when ``previous_seq`` is None (so two replicas can never both take one ``seq``).
    ``expires_ms`` is the agent record's (the session goes with it)."""

    state: SessionState
    previous_seq: int | None
    expires_ms: int


@dataclass(frozen=True, slots=True)
class GrantSpend:
    """Spend grant ``grant_id`` on the edge ``manifest_digest``, answered ``parent_cosig``. Condition:
    the grant exists and is unspent."""

    grant_id: str
    manifest_digest: str
    parent_cosig: str


@dataclass(frozen=True, slots=True)
class ProposalSeal:
    """Seal the proposal under ``grant_id`` with the path answered. Condition: it exists, unsealed."""

    grant_id: str
    path: bytes


@dataclass(frozen=True, slots=True)
class StateReads:
    """What one signing call reads: each is a key, or None for "not needed"."""

    issued: str | None = None  # a record's digest: its stored path
    children_of: str | None = None  # a parent's digest: its child count
    session: tuple[str, str] | None = None  # (agent record digest, session id)
    grant: str | None = None
    proposal: str | None = None  # a grant id: the child side's proposal under it
    request: str | None = None  # a request id


@dataclass(frozen=True, slots=True)
class StateView:
    """What a backend read for :class:`StateReads` (None or 0 where nothing is stored or nothing was asked)."""

    issued: bytes | None = None
    child_count: int = 0
    session: SessionState | None = None
    grant: StoredGrant | None = None
    proposal: Proposal | None = None
    request: RequestRecord | None = None


@dataclass(frozen=True, slots=True)
class StateWrite:
    """One signing call's write: applied whole, or (on a conflict) not at all.

    Conditions, all of which must hold against the state before the write: a new grant, proposal or
    request id is not stored yet; a spent grant was unspent; a sealed proposal was unsealed; a child
    slot is free (:class:`NewChild`); a session moves on from the ``seq`` it was read at
    (:class:`SessionUpdate`). Issued records carry no condition (content-addressed)."""

    issued: tuple[IssuedRecord, ...] = ()
    child: NewChild | None = None
    session: SessionUpdate | None = None
    new_grant: StoredGrant | None = None
    spend: GrantSpend | None = None
    proposal: Proposal | None = None
    seal: ProposalSeal | None = None
    request: RequestRecord | None = None

    def answering(self, request: RequestRecord | None) -> StateWrite:
        """The same write, also recording ``request`` (the call's answer under its request id)."""
        if request is None:
            return self
        # Built field by field: dataclasses.replace costs several times as much, on every signing call.
        return StateWrite(
            self.issued, self.child, self.session, self.new_grant, self.spend, self.proposal, self.seal, request
        )


# --- request ids (idempotent signing calls, spec 21.2) -----------------------------------------------


def request_id_problem(request_id: str) -> str | None:
    """Why ``request_id`` cannot be an idempotency key (None: it can; "" means no key)."""
    if len(request_id) > MAX_REQUEST_ID or not request_id.isascii() or not request_id.isprintable():
        return f"request_id must be at most {MAX_REQUEST_ID} printable ASCII characters"
    return None


def request_fingerprint(method: str, request: bytes) -> str:
    """What a call asked, as a digest: the method and the request as sent with its ``request_id``
    cleared (deterministically serialised). A retry asks exactly the same; another call under a used
    id does not, and is refused (:func:`earlier_answer`)."""
    return "sha256:" + hashlib.sha256(method.encode() + b"\x00" + request).hexdigest()


@dataclass(frozen=True, slots=True)
class RequestReused:
    """A request id already answered a different call: the code and message to refuse with."""

    code: ErrorCode = ErrorCode.INVALID_ARGUMENT
    message: str = "request_id was already used for a different request"


def earlier_answer(stored: RequestRecord | None, fingerprint: str) -> RequestRecord | RequestReused | None:
    """What a call gets back because it was answered before under its request id (a retry: the stored
    answer), :class:`RequestReused` when that id answered another call, or None: decide it afresh."""
    if stored is None:
        return None
    if stored.fingerprint != fingerprint:
        return RequestReused()
    return stored


# --- the reference semantics ----------------------------------------------------------------------


@dataclass
class SignerStateModel:
    """The signer's state as plain maps, with the meaning every backend must give :class:`StateReads`,
    :class:`StateWrite` and collection. The ``memory:`` backend is this model behind a lock; the
    backend test drives random calls through each backend and this model side by side."""

    issued: dict[str, IssuedRecord] = field(default_factory=dict)
    children: dict[str, set[str]] = field(default_factory=dict)
    child_expiry: dict[str, int] = field(default_factory=dict)  # per parent: how long its slots are kept
    sessions: dict[tuple[str, str], tuple[SessionState, int]] = field(default_factory=dict)
    grants: dict[str, StoredGrant] = field(default_factory=dict)
    proposals: dict[str, Proposal] = field(default_factory=dict)
    requests: dict[str, RequestRecord] = field(default_factory=dict)

    def read(self, reads: StateReads) -> StateView:
        issued = self.issued.get(reads.issued) if reads.issued is not None else None
        session = self.sessions.get(reads.session) if reads.session is not None else None
        return StateView(
            issued=None if issued is None else issued.path,
            child_count=0 if reads.children_of is None else len(self.children.get(reads.children_of, ())),
            session=None if session is None else session[0],
            grant=None if reads.grant is None else self.grants.get(reads.grant),
            proposal=None if reads.proposal is None else self.proposals.get(reads.proposal),
            request=None if reads.request is None else self.requests.get(reads.request),
        )

    def holds(self, write: StateWrite) -> bool:
        """Whether every condition of ``write`` holds now."""
        child = write.child
        if child is not None:
            present = self.children.get(child.parent, set())
            if child.nonce in present or len(present) >= child.max_children:
                return False
        update = write.session
        if update is not None:
            assert update.state.agent is not None  # sessions are stored by agent record
            stored = self.sessions.get((update.state.agent, update.state.session))
            if (None if stored is None else stored[0].last_seq) != update.previous_seq:
                return False
        if write.new_grant is not None and write.new_grant.grant_id in self.grants:
            return False
        if write.spend is not None:
            grant = self.grants.get(write.spend.grant_id)
            if grant is None or grant.manifest_digest is not None:
                return False
        if write.proposal is not None and write.proposal.grant_id in self.proposals:
            return False
        if write.seal is not None:
            proposal = self.proposals.get(write.seal.grant_id)
            if proposal is None or proposal.sealed_path is not None:
                return False
        return not (write.request is not None and write.request.request_id in self.requests)

    def apply(self, write: StateWrite) -> bool:
        """Apply ``write`` if its conditions hold (True), else change nothing (False: a conflict)."""
        if not self.holds(write):
            return False
        for record in write.issued:
            self.issued.setdefault(record.digest, record)
        if write.child is not None:
            self.children.setdefault(write.child.parent, set()).add(write.child.nonce)
            expiry = self.child_expiry.get(write.child.parent, write.child.expires_ms)
            self.child_expiry[write.child.parent] = max(expiry, write.child.expires_ms)
        if write.session is not None:
            state = write.session.state
            assert state.agent is not None
            key = (state.agent, state.session)
            kept = self.sessions[key][1] if key in self.sessions else write.session.expires_ms
            self.sessions[key] = (state, max(kept, write.session.expires_ms))
        if write.new_grant is not None:
            self.grants[write.new_grant.grant_id] = write.new_grant
        if write.spend is not None:
            spend = write.spend
            self.grants[spend.grant_id] = replace(
                self.grants[spend.grant_id], manifest_digest=spend.manifest_digest, parent_cosig=spend.parent_cosig
            )
        if write.proposal is not None:
            self.proposals[write.proposal.grant_id] = write.proposal
        if write.seal is not None:
            self.proposals[write.seal.grant_id] = replace(
                self.proposals[write.seal.grant_id], sealed_path=write.seal.path
            )
        if write.request is not None:
            self.requests[write.request.request_id] = write.request
        return True

    def apply_all(self, writes: Iterable[StateWrite]) -> list[bool]:
        """Each write in order, as one group commit applies them: each whole or not at all."""
        return [self.apply(write) for write in writes]

    def collect_expired(self, cutoff_ms: int) -> dict[str, int]:
        """Forget everything that expired before ``cutoff_ms`` (ADR 0026): a record with the child slots
        and sessions kept under it, a grant, a proposal, a request's answer. Returns rows forgotten per
        table (the SQL backends' table names)."""
        removed = dict.fromkeys(COLLECTED_TABLES, 0)
        for digest in [d for d, r in self.issued.items() if r.expires_ms < cutoff_ms]:
            del self.issued[digest]
            removed["issued"] += 1
        for parent in [p for p, e in self.child_expiry.items() if e < cutoff_ms]:
            removed["children"] += len(self.children.pop(parent, ()))
            removed["child_counts"] += 1
            del self.child_expiry[parent]
        for key in [k for k, (_, e) in self.sessions.items() if e < cutoff_ms]:
            del self.sessions[key]
            removed["agent_sessions"] += 1
        for table, rows in (("grants", self.grants), ("proposals", self.proposals), ("requests", self.requests)):
            expired = [name for name, row in rows.items() if row.expires_ms < cutoff_ms]
            for name in expired:
                del rows[name]
            removed[table] += len(expired)
        return removed

    def row_counts(self) -> dict[str, int]:
        return {
            "issued": len(self.issued),
            "children": sum(len(c) for c in self.children.values()),
            "child_counts": len(self.children),
            "agent_sessions": len(self.sessions),
            "grants": len(self.grants),
            "proposals": len(self.proposals),
            "requests": len(self.requests),
        }


# The tables a backend reports on (rows held, rows collected), in the order they are collected.
COLLECTED_TABLES = ("issued", "children", "child_counts", "agent_sessions", "grants", "proposals", "requests")
