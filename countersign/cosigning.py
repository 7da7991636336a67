"""The signer's grant and co-signing rules (docs/spec.md 5.5, docs/api.md "Signer"), as pure decisions.

A signer daemon reads its state and the request, asks one of these functions, and applies the answer:
a :class:`Refusal` (a code of :class:`countersign.errors.ErrorCode` and a one-line message) ends the
call, anything else is what to sign or store. Nothing here reads a clock, a store or a socket: the
time is an argument (``now_ms``), and so are the stored grant and the parent's child count, read by
the daemon inside the transaction that then spends them.

Each function checks in a fixed order and answers with the first rule broken, so a request that
breaks several rules is always refused with the same code.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace
from typing import Protocol

from countersign.canonical import JsonValue
from countersign.constructions import EdgeProposal, RecordFields, verify_cosignature
from countersign.errors import ErrorCode, MalformedError
from countersign.keys import PublicKey
from countersign.reasons import Reason
from countersign.records import (
    MAX_CHILDREN_LIMIT,
    AgentRef,
    BindingScope,
    Construction,
    CoSignature,
    CoSignerRole,
    LifecycleEvent,
    NodeRecord,
    OutputReceipt,
    Path,
    Policy,
    SessionClose,
    StreamChunk,
    StreamUnit,
    parse_json,
)
from countersign.registry import KeyProblem, Registry
from countersign.signer_state import (
    GrantSpend,
    IssuedRecord,
    NewChild,
    Proposal,
    ProposalSeal,
    SessionState,
    SessionUpdate,
    StateWrite,
    StoredGrant,
)
from countersign.verify import edge_violation

# What a signer issues, and the only construction whose edges it co-signs.
CONSTRUCTION = Construction.SIGNED_DAG
MAX_GRANT_ID = 64
DEFAULT_RECEIPT_TTL_MS = 3_600_000
DEFAULT_MAX_SESSION_OUTPUTS = 100_000
MAX_CHUNK_BYTES = 4 << 20  # what a stream may buffer before a chunk is signed


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a signer refuses a call: a code from the closed list, and a one-line message."""

    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class SignerPolicy:
    """One signer's own limits (its configuration), as the rules below need them."""

    deployer: str
    allowed_children: Set[str]
    max_depth: int
    max_ttl_ms: int
    max_grant_ttl_ms: int
    clock_skew_ms: int


@dataclass(frozen=True, slots=True)
class EarlierAnswer:
    """The same edge asked again under the grant it spent (a retry): answer what was answered then."""

    parent_cosig: str


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """The agent fields a runtime asks for in a new record (the API's ``AgentFields``).

    ``event`` is a lifecycle event name ("" for the call's default); ``allowed_children`` None means
    no restriction, ``max_depth`` None no limit.
    """

    instance: str
    system: str
    ttl_ms: int
    max_children: int
    event: str = ""
    allowed_children: tuple[str, ...] | None = None
    max_depth: int | None = None


@dataclass(frozen=True, slots=True)
class ReceiptRequest:
    """What a runtime asks for in an output receipt; empty fields take the parent's or the defaults."""

    output_sha256: bytes
    binding_scope: str = ""
    session: str = ""
    instance: str = ""
    ttl_ms: int = 0
    stream: StreamChunk | None = None
    close: bool = False


class CertifiedPeer(Protocol):
    """Who a caller's verified certificate names (read by the daemon from the TLS session)."""

    @property
    def role(self) -> str: ...

    @property
    def deployer(self) -> str | None: ...


def _depth_refused() -> Refusal:
    return Refusal(ErrorCode.DEPTH_LIMIT, "the depth limit forbids another level here")


def _fanout_refused(max_children: int) -> Refusal:
    return Refusal(ErrorCode.FANOUT_EXCEEDED, f"the parent already has {max_children} children")


def _does_not_delegate(policy: SignerPolicy, child_deployer: str) -> Refusal:
    return Refusal(ErrorCode.POLICY_REFUSED, f"{policy.deployer} does not delegate to {child_deployer}")


def _invalid(message: str) -> Refusal:
    return Refusal(ErrorCode.INVALID_ARGUMENT, message)


# --- who may ask ---------------------------------------------------------------------------------


def runtime_refusal(policy: SignerPolicy, caller: CertifiedPeer | None) -> Refusal | None:
    """Runtime calls come only from this deployer's runtime (``caller`` None: no usable certificate)."""
    if caller is None or caller.role != "runtime" or caller.deployer != policy.deployer:
        return Refusal(ErrorCode.NOT_AUTHORISED, "only this deployer's runtime may ask")
    return None


def peer_refusal(policy: SignerPolicy, child_deployer: str, registry: Registry) -> Refusal | None:
    """An edge is co-signed only for another, enrolled deployer."""
    if child_deployer not in registry.deployers or child_deployer == policy.deployer:
        return Refusal(ErrorCode.NOT_AUTHORISED, f"{child_deployer} is not an enrolled peer")
    return None


def peer_certificate_refusal(child_deployer: str, caller: CertifiedPeer | None) -> Refusal | None:
    """Only the child deployer's own signer may ask to co-sign its edge."""
    if caller is None or caller.role != "signer" or caller.deployer != child_deployer:
        return Refusal(ErrorCode.NOT_AUTHORISED, "the peer certificate does not name the child deployer's signer")
    return None


# --- new records ---------------------------------------------------------------------------------


def depth_limit(parent: Path, max_depth: int) -> int:
    """The deepest position a descendant of ``parent``'s leaf may take: this signer's ``max_depth``
    and every signed ``policy.max_depth`` along the path, whichever is least."""
    limits = [e.record.policy.max_depth for e in parent.envelopes if e.record.policy.max_depth is not None]
    return min([max_depth, *limits])


def _event(name: str, default: LifecycleEvent) -> LifecycleEvent | Refusal:
    if not name:
        return default
    try:
        return LifecycleEvent(name)
    except ValueError:
        return _invalid(f"unknown lifecycle event {name!r}")


def record_fields(
    policy: SignerPolicy, agent: AgentRequest, ceiling_ms: int | None, default_event: LifecycleEvent, now_ms: int
) -> RecordFields | Refusal:
    """The fields of a new record created at ``now_ms``: its lifetime is ``agent.ttl_ms`` capped by
    this signer's ``max_ttl_ms`` and by ``ceiling_ms`` (the parent's expiry; None for a root)."""
    if agent.ttl_ms <= 0:
        return _invalid("ttl_ms must be positive")
    created = now_ms
    expires = created + min(agent.ttl_ms, policy.max_ttl_ms)
    if ceiling_ms is not None:
        expires = min(expires, ceiling_ms)
    if expires <= created:
        return Refusal(ErrorCode.EXPIRY_EXCEEDS_PARENT, "the parent expires before a child could be valid")
    if not 0 <= agent.max_children <= MAX_CHILDREN_LIMIT:
        return _invalid("max_children out of range")
    try:
        agent_ref = AgentRef.from_json({"instance": agent.instance, "system": agent.system})
        event = _event(agent.event, default_event)
        if isinstance(event, Refusal):
            return event
        allowed: JsonValue = None if agent.allowed_children is None else list(agent.allowed_children)
        signed_policy = Policy.from_json({"allowed_children": allowed, "max_depth": agent.max_depth})
    except MalformedError as exc:
        return _invalid(str(exc))
    return RecordFields(
        deployer=policy.deployer,
        agent=agent_ref,
        created_ms=created,
        expires_ms=expires,
        max_children=agent.max_children,
        event=event,
        policy=signed_policy,
    )


def receipt_fields(
    policy: SignerPolicy, parent: NodeRecord, receipt: ReceiptRequest, now_ms: int
) -> RecordFields | Refusal:
    """The fields of an output receipt under ``parent`` (a record of this signer), its session
    position still to be assigned (``seq`` 0, ``prev`` None) in the transaction that spends the slot."""
    if len(receipt.output_sha256) != 32:
        return _invalid("output_sha256 must be the 32 raw bytes of SHA-256")
    try:
        scope = BindingScope(receipt.binding_scope or BindingScope.PER_TURN.value)
    except ValueError:
        return _invalid(f"unknown binding scope {receipt.binding_scope!r}")
    agent = AgentRequest(
        instance=receipt.instance or parent.agent.instance,
        system=parent.agent.system,
        ttl_ms=receipt.ttl_ms or DEFAULT_RECEIPT_TTL_MS,
        max_children=0,
    )
    fields = record_fields(policy, agent, parent.expires_ms, LifecycleEvent.NEW, now_ms)
    if isinstance(fields, Refusal):
        return fields
    session = receipt.session or parent.agent.instance
    if receipt.close:
        scope = BindingScope.PER_SESSION
    elif receipt.stream is not None:
        scope = BindingScope.PER_N_TOKENS
    body: dict[str, JsonValue] = {
        "sha256": "sha256:" + receipt.output_sha256.hex(), "binding_scope": scope.value, "session": session,
        "seq": 0, "prev": None,
    }  # fmt: skip
    if receipt.stream is not None:
        body["stream"] = receipt.stream.to_json()
    if receipt.close:
        body["close"] = {"count": 0, "last": None}
    try:
        output = OutputReceipt.from_json(body)
    except MalformedError as exc:
        return _invalid(str(exc))
    return replace(fields, output=output)


def receipt_parent_refusal(parent: NodeRecord) -> Refusal | None:
    """A receipt is issued under an agent's record, never under another receipt (ADR 0018: receipts are
    counted apart from ``max_children`` only as leaves of an agent)."""
    if parent.output is not None:
        return Refusal(ErrorCode.POLICY_REFUSED, "a receipt is issued under an agent record, not under a receipt")
    return None


# --- sessions (docs/spec.md 17.6) ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EarlierClose:
    """CloseSession asked again for a session it closed (a retry): answer its close receipt again."""

    digest: str


def session_position(
    state: SessionState | None,
    *,
    agent_digest: str,
    output: OutputReceipt,
    max_outputs: int,
) -> tuple[int, str | None] | EarlierClose | Refusal:
    """The (``seq``, ``prev``) of the next receipt ``output`` of a session in ``state`` (None: a new
    session) under the agent record ``agent_digest``, or why not. Checked in the transaction that
    signs the receipt and stores the session's new state."""
    if state is not None and state.agent is not None and state.agent != agent_digest:
        return _invalid(f"session {state.session!r} belongs to another agent record")
    if state is not None and state.closed:
        if output.close is not None:
            return EarlierClose(state.last_digest)
        return Refusal(ErrorCode.SESSION_CLOSED, f"session {state.session!r} is closed")
    stream = None if output.stream is None else (output.stream.unit, output.stream.n)
    if stream is not None and state is not None and state.stream not in (None, stream):
        return _invalid("the session's stream has another unit or n")
    if state is None:
        return 0, None
    if output.close is None and state.last_seq + 1 >= max_outputs:
        return Refusal(ErrorCode.FANOUT_EXCEEDED, f"the session already has {max_outputs} outputs")
    return state.last_seq + 1, state.last_digest


def positioned(output: OutputReceipt, seq: int, prev: str | None) -> OutputReceipt:
    """``output`` at its place in the session (a close receipt commits to it as its count and last)."""
    close = None if output.close is None else SessionClose(seq, prev)
    return replace(output, seq=seq, prev=prev, close=close)


def advanced(
    state: SessionState | None, session: str, agent_digest: str, output: OutputReceipt, digest: str
) -> SessionState:
    """The session's state once the receipt ``output`` (envelope digest ``digest``) is issued."""
    stream = state.stream if state is not None else None
    if output.stream is not None:
        stream = (output.stream.unit, output.stream.n)
    return SessionState(session, agent_digest, output.seq, digest, output.close is not None, stream)


def stream_spec(unit: str, n: int) -> tuple[StreamUnit, int] | Refusal:
    """A stream's unit and chunk size as a runtime names them."""
    try:
        chunk = StreamChunk.from_json({"unit": unit, "n": n, "units": 1})
    except MalformedError as exc:
        return _invalid(str(exc))
    if chunk.unit is StreamUnit.BYTES and chunk.n > MAX_CHUNK_BYTES:
        return _invalid(f"a bytes stream's chunks hold at most {MAX_CHUNK_BYTES} bytes")
    return chunk.unit, chunk.n


class ChunkBuffer:
    """Collects a stream's pieces into chunks of ``n`` units (no I/O: the daemon feeds it).

    ``bytes``: a piece's units are its length (``units`` 0 or equal to it), and a piece is split at
    chunk boundaries. ``tokens``: the runtime counts; a piece must not straddle a chunk boundary.
    """

    def __init__(self, unit: StreamUnit, n: int) -> None:
        self.unit, self.n = unit, n
        self._data = bytearray()
        self._units = 0

    def add(self, data: bytes, units: int) -> list[tuple[bytes, int]] | Refusal:
        """The chunks this piece completes, each (bytes, units), or why the piece is refused."""
        done: list[tuple[bytes, int]] = []
        if self.unit is StreamUnit.BYTES:
            if units not in (0, len(data)):
                return _invalid("a bytes stream counts each piece by its length")
            view = memoryview(data)
            while view:
                take = min(len(view), self.n - self._units)
                self._data += view[:take]
                self._units += take
                view = view[take:]
                if self._units == self.n:
                    done.append(self._take())
            return done
        if units < 1 or self._units + units > self.n:
            return _invalid(f"a piece of {units} tokens does not fit the {self.n - self._units} left in this chunk")
        if len(self._data) + len(data) > MAX_CHUNK_BYTES:
            return _invalid(f"a chunk holds at most {MAX_CHUNK_BYTES} bytes")
        self._data += data
        self._units += units
        if self._units == self.n:
            done.append(self._take())
        return done

    def flush(self) -> tuple[bytes, int] | None:
        """The stream's short last chunk, if units are left over."""
        return self._take() if self._units else None

    def _take(self) -> tuple[bytes, int]:
        chunk = (bytes(self._data), self._units)
        self._data, self._units = bytearray(), 0
        return chunk


def local_child_refusal(policy: SignerPolicy, parent: Path) -> Refusal | None:
    """A same-deployer child (or receipt) of ``parent``'s leaf must keep the depth limit."""
    if parent.leaf.record.depth + 1 > depth_limit(parent, policy.max_depth):
        return _depth_refused()
    return None


def fanout_refusal(parent: NodeRecord, child_count: int) -> Refusal | None:
    """A parent that already has ``child_count`` children takes another only below its ``max_children``."""
    if child_count >= parent.max_children:
        return _fanout_refused(parent.max_children)
    return None


# --- the parent's side: grants and edges ---------------------------------------------------------


def grant_request_refusal(ttl_ms: int) -> Refusal | None:
    """OpenGrant's own fields, checked before anything else."""
    if ttl_ms < 0:
        return _invalid("ttl_ms must not be negative (0: the default)")
    return None


def open_grant(
    policy: SignerPolicy,
    parent: Path,
    parent_digest: str,
    child_deployer: str,
    ttl_ms: int,
    registry: Registry,
    now_ms: int,
    grant_id: str,
) -> StoredGrant | Refusal:
    """A grant for ``child_deployer`` to attach one child under ``parent``'s leaf (a record of this
    signer, digest ``parent_digest``), or why not. It lasts ``ttl_ms`` (0: the longest allowed),
    capped by ``max_grant_ttl_ms`` and by the parent's expiry."""
    parent_record = parent.leaf.record
    if child_deployer == policy.deployer:
        return Refusal(ErrorCode.POLICY_REFUSED, "use IssueLocalChild for a same-deployer child")
    if child_deployer not in policy.allowed_children:
        return _does_not_delegate(policy, child_deployer)
    allowed = parent_record.policy.allowed_children
    if allowed is not None and child_deployer not in allowed:
        return Refusal(ErrorCode.POLICY_REFUSED, f"the parent record does not allow {child_deployer} as a child")
    if child_deployer not in registry.deployers:
        return Refusal(ErrorCode.POLICY_REFUSED, f"{child_deployer} is not an enrolled deployer")
    if parent_record.depth + 1 > depth_limit(parent, policy.max_depth):
        return _depth_refused()
    ttl = ttl_ms or policy.max_grant_ttl_ms
    expires = min(now_ms + min(ttl, policy.max_grant_ttl_ms), parent_record.expires_ms)
    return StoredGrant(grant_id, parent_digest, child_deployer, expires)


def edge_refusal(
    policy: SignerPolicy,
    parent: Path,
    parent_digest: str,
    proposal: EdgeProposal,
    child_cosig: CoSignature,
    registry: Registry,
    now_ms: int,
) -> Refusal | None:
    """Whether this signer may co-sign ``proposal`` (the child record under ``parent``'s leaf, a
    record of this signer) as the parent: the lineage rules, this signer's policy and depth limit, the
    child's clock, and the child's co-signature under its registered key. The grant is decided apart,
    by :func:`spend_grant`, inside the transaction that spends it."""
    parent_record = parent.leaf.record
    child = proposal.child
    if child.construction is not CONSTRUCTION or child.cosigs:
        return _invalid("the child must be a SIGNED-DAG record without co-signatures")
    violation = edge_violation(parent_record, parent_digest, child, parent_record.depth + 1)
    if violation is not None:
        expiry = violation.reason is Reason.EXPIRY_EXCEEDS_PARENT
        code = ErrorCode.EXPIRY_EXCEEDS_PARENT if expiry else ErrorCode.POLICY_REFUSED
        return Refusal(code, f"{violation.reason}: {violation.detail}")
    if child.deployer not in policy.allowed_children:
        return _does_not_delegate(policy, child.deployer)
    if child.depth > depth_limit(parent, policy.max_depth):
        return _depth_refused()
    if abs(child.created_ms - now_ms) > policy.clock_skew_ms:
        return Refusal(ErrorCode.POLICY_REFUSED, "the child record's creation time is too far from this signer's clock")
    if child_cosig.role is not CoSignerRole.CHILD or child_cosig.deployer != child.deployer:
        return Refusal(ErrorCode.BAD_COSIGNATURE, "the child co-signature must be the child deployer's")
    child_key = registry.resolve(child.deployer, child_cosig.key_id, child.created_ms)
    record_key = registry.resolve(child.deployer, child.key_id, child.created_ms)
    for key in (child_key, record_key):
        if isinstance(key, KeyProblem):
            return Refusal(ErrorCode.NOT_AUTHORISED, f"child key: {key.detail}")
    assert isinstance(child_key, PublicKey)
    if not verify_cosignature(proposal, child_cosig, child_key):
        return Refusal(ErrorCode.BAD_COSIGNATURE, "the child's co-signature over the edge manifest does not verify")
    return None


def spend_grant(
    grant: StoredGrant | None,
    *,
    child_deployer: str,
    parent_digest: str,
    manifest_digest: str,
    max_children: int,
    child_count: int,
    now_ms: int,
) -> Refusal | EarlierAnswer | None:
    """Whether the edge ``manifest_digest`` (by ``child_deployer``, under the record ``parent_digest``
    that allows ``max_children`` and has ``child_count``) may spend ``grant`` (None: no grant by that id).

    None: it may (co-sign, spend the grant and the child slot). :class:`EarlierAnswer`: the grant was
    spent on this very edge, answer the same again and spend nothing. A spent grant answers before it
    is checked for expiry, so a retry of a committed edge succeeds even after the grant expired.
    """
    if grant is None:
        return Refusal(ErrorCode.GRANT_NOT_FOUND, "no such grant")
    if grant.child_deployer != child_deployer:
        return Refusal(ErrorCode.GRANT_WRONG_CHILD, f"the grant names {grant.child_deployer}, not {child_deployer}")
    if grant.parent != parent_digest:
        return Refusal(ErrorCode.GRANT_WRONG_CHILD, "the grant is for another parent record")
    if grant.manifest_digest is not None:
        if grant.manifest_digest == manifest_digest and grant.parent_cosig is not None:
            return EarlierAnswer(grant.parent_cosig)
        return Refusal(ErrorCode.GRANT_USED, "the grant was already used for another edge")
    if grant.expires_ms < now_ms:
        return Refusal(ErrorCode.GRANT_EXPIRED, "the grant has expired")
    if child_count >= max_children:
        return _fanout_refused(max_children)
    return None


# --- the child's side: delegations ---------------------------------------------------------------


def delegation_request_refusal(grant_id: str, parent_key_id: str) -> Refusal | None:
    """AcceptDelegation's own fields (the parent signer's address aside), checked before anything else."""
    if not grant_id or len(grant_id) > MAX_GRANT_ID:
        return _invalid(f"grant_id is required (at most {MAX_GRANT_ID} characters)")
    if not parent_key_id:
        return _invalid("parent_key_id is required (the key the grant names)")
    return None


def delegation_parent_key(
    policy: SignerPolicy, parent: NodeRecord, parent_key_id: str, registry: Registry, now_ms: int
) -> PublicKey | Refusal:
    """The key the parent's co-signature must verify under, for a delegation from ``parent``."""
    if parent.deployer == policy.deployer:
        return Refusal(ErrorCode.POLICY_REFUSED, "a delegation crosses deployers; use IssueLocalChild")
    key = registry.resolve(parent.deployer, parent_key_id, now_ms)
    if isinstance(key, KeyProblem):
        return Refusal(ErrorCode.PARENT_REFUSED, f"parent key: {key.detail}")
    return key


def proposal_refusal(proposed_parent: str, parent_digest: str) -> Refusal | None:
    """A grant keeps the edge first proposed under it: a retry must name the same parent record."""
    if proposed_parent != parent_digest:
        return Refusal(ErrorCode.GRANT_WRONG_CHILD, "this grant was already proposed for another parent record")
    return None


def parent_failure(parent_deployer: str, code: ErrorCode, message: str, *, retryable: bool) -> Refusal:
    """The child's refusal when the parent's signer refused (``code``) or could not be reached
    (``retryable``): the delegation fails closed, naming the parent and its code."""
    ours = ErrorCode.PARENT_UNREACHABLE if retryable else ErrorCode.PARENT_REFUSED
    return Refusal(ours, f"parent signer {parent_deployer}: {code}: {message}")


def parent_cosignature(proposal: EdgeProposal, answer: str | bytes, parent_key: PublicKey) -> CoSignature | Refusal:
    """The parent's co-signature from its signer's ``answer`` (JSON), if it is the parent deployer's,
    under the key the grant named, and verifies over ``proposal``."""
    try:
        cosig = CoSignature.from_json(parse_json(answer))
    except MalformedError as exc:
        return Refusal(ErrorCode.BAD_COSIGNATURE, f"parent sent a malformed co-signature: {exc}")
    if (
        cosig.role is not CoSignerRole.PARENT
        or cosig.deployer != proposal.parent.record.deployer
        or cosig.key_id != proposal.parent_key_id
        or not verify_cosignature(proposal, cosig, parent_key)
    ):
        return Refusal(ErrorCode.BAD_COSIGNATURE, "the parent's co-signature does not verify")
    return cosig


# --- what each signing call writes (countersign/signer_state.py) ---------------------------------
#
# Each call's one conditional write, built from what the call decided and signed. The conditions are
# the ones its decision relied on: a write whose state moved meanwhile (another replica spent the
# grant, took the seq, filled the slot) does not apply, and the call decides again.


def issued_record(path: Path, data: bytes) -> IssuedRecord:
    """The record at the end of ``path`` (whose canonical bytes are ``data``) as the signer keeps it."""
    return IssuedRecord(path.leaf.digest(), data, path.leaf.record.expires_ms)


def root_write(path: Path, data: bytes) -> StateWrite:
    """A root spends nothing: only the record is kept."""
    return StateWrite(issued=(issued_record(path, data),))


def local_child_write(parent: Path, parent_digest: str, child: Path, data: bytes) -> StateWrite:
    """A same-deployer child spends a child slot of its parent (kept as long as the parent)."""
    record = parent.leaf.record
    slot = NewChild(parent_digest, child.leaf.record.nonce, record.max_children, record.expires_ms)
    return StateWrite(issued=(issued_record(child, data),), child=slot)


def receipt_write(
    before: SessionState | None, agent: Path, agent_digest: str, receipt: Path, data: bytes
) -> StateWrite:
    """A receipt takes the next place in its session: the session moves on from the ``seq`` it was read
    at (``before``; a session kept by an earlier release counts as not stored, and is continued)."""
    output = receipt.leaf.record.output
    assert output is not None  # a receipt carries its output
    previous = before.last_seq if before is not None and before.agent is not None else None
    state = advanced(before, output.session, agent_digest, output, receipt.leaf.digest())
    update = SessionUpdate(state, previous, agent.leaf.record.expires_ms)
    return StateWrite(issued=(issued_record(receipt, data),), session=update)


def grant_write(grant: StoredGrant) -> StateWrite:
    return StateWrite(new_grant=grant)


def edge_write(
    grant_id: str, parent: Path, parent_digest: str, child: NodeRecord, manifest_digest: str, parent_cosig: str
) -> StateWrite:
    """The parent's side of an edge: the grant spent on it, and the child slot it takes."""
    record = parent.leaf.record
    slot = NewChild(parent_digest, child.nonce, record.max_children, record.expires_ms)
    return StateWrite(spend=GrantSpend(grant_id, manifest_digest, parent_cosig), child=slot)


def proposal_write(grant_id: str, parent_digest: str, proposal: EdgeProposal, child_cosig: str) -> StateWrite:
    """The child's side of an edge before the parent is asked: kept so a retry re-sends this very edge."""
    kept = Proposal(grant_id, parent_digest, proposal.child_bytes, child_cosig, proposal.child.expires_ms)
    return StateWrite(proposal=kept)


def seal_write(grant_id: str, path: Path, data: bytes) -> StateWrite:
    """The co-signed child record, sealed: kept, and answered to every retry under its grant."""
    return StateWrite(issued=(issued_record(path, data),), seal=ProposalSeal(grant_id, data))
