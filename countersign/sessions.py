"""Session evidence: one agent's ordered outputs, verified as a whole (docs/spec.md section 17).

A consumer presents the path to the emitting agent and the session's receipt envelopes in session
order (optionally with the bytes of each output). Every receipt is checked as the path agent → receipt
would be (section 6, step W), and in addition: one emitting agent, one session, no receipt twice,
``seq`` 0, 1, 2, ... without a gap, each ``prev`` the digest of the receipt before, nothing after a
close receipt, every output's hash, and (when asked) a close receipt at the end. Each way a session
can be rearranged has its own reason, reported at the first offending receipt.

This is the audit-style check: nothing is consumed. What the durable state step must admit for an
accepted session (the agent path's edges and one leaf nonce per receipt, all or nothing) is returned
beside the verdict, for a verifier to apply (:class:`SessionAdmission`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from countersign.canonical import JsonValue, b64url_decode_validated
from countersign.constructions import parent_link, record_signing_input
from countersign.errors import MalformedError
from countersign.policy import ConsumerPolicy
from countersign.reasons import Attribution, Reason, VerificationResult
from countersign.records import (
    ENVELOPE_KEYS,
    FORMAT_VERSION,
    MAX_DEPTH,
    MAX_NESTING,
    NONCE_PATTERN,
    RECORD_KEYS,
    SIGNATURE_PATTERN,
    Envelope,
    NodeRecord,
    OutputReceipt,
    Path,
    UnsupportedVersionError,
    _compiled_session,
    _int,
    _match,
    _object,
    nesting_exceeds,
    parse_json,
)
from countersign.registry import KeyProblem, Registry
from countersign.state import ChildEdge, EarlierAcceptance, LeafNonce, VerifierState, new_leaf_nonce
from countersign.verify import (
    DEFAULT_POLICY,
    SERIAL,
    Mode,
    OutputDigest,
    SignatureBatch,
    VerifierPolicy,
    attribute,
    edge_violation,
    malformed_result,
    output_digest,
    policy_refusal,
    replay_key,
    walk,
)

MAX_SESSION_RECEIPTS: Final = 65_536
MAX_SESSION_INPUT_BYTES: Final = 64 << 20
SESSION_KEYS: Final = frozenset({"v", "agent", "receipts"})


@dataclass(frozen=True, slots=True)
class SessionEvidence:
    """The path to the emitting agent, and its session's receipt envelopes in the order presented."""

    agent: Path
    receipts: tuple[Envelope, ...]
    v: int = FORMAT_VERSION

    @classmethod
    def from_json(cls, value: object) -> SessionEvidence:
        return cls._from_json(value, parsed=False)

    @classmethod
    def _from_json(cls, value: object, *, parsed: bool) -> SessionEvidence:
        """``parsed``: ``value`` came from :func:`parse_json`, so it holds only JSON's own types (no
        subclass of str or int), which the receipts' fast path (:class:`_Receipts`) relies on."""
        if type(value) is dict and type(value.get("v")) is int and value["v"] != FORMAT_VERSION:
            raise UnsupportedVersionError(f"session version {value['v']} is not supported")
        obj: dict[str, Any] = _object(value, SESSION_KEYS, "session")
        _int(obj["v"], "session.v", FORMAT_VERSION, FORMAT_VERSION)
        try:
            agent = Path.from_json(obj["agent"])
        except MalformedError as exc:  # an index here names an agent envelope, not a receipt
            raise type(exc)(f"session.agent: {exc}") from None
        items = obj["receipts"]
        if type(items) is not list or not 1 <= len(items) <= MAX_SESSION_RECEIPTS:
            raise MalformedError(f"session.receipts must be a list of 1 to {MAX_SESSION_RECEIPTS} envelopes")
        receipts: list[Envelope] = []
        parser = _Receipts(fast=parsed)
        for index, item in enumerate(items):
            try:
                receipts.append(parser.parse(item))
            except MalformedError as exc:
                raise type(exc)(f"receipt {index}: {exc}", index=index) from None
        return cls(agent, tuple(receipts))

    def to_json(self) -> dict[str, JsonValue]:
        return {"v": self.v, "agent": self.agent.to_json(), "receipts": [r.to_json() for r in self.receipts]}

    def to_bytes(self) -> bytes:
        """Canonical bytes (keys sort ``agent`` < ``receipts`` < ``v``), composed like :meth:`Path.to_bytes`."""
        body = b",".join(receipt.canonical_bytes() for receipt in self.receipts)
        return b'{"agent":' + self.agent.to_bytes() + b',"receipts":[' + body + b'],"v":%d}' % self.v

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionEvidence:
        """Parse session evidence from JSON bytes; raises MalformedError (never anything else).

        The compiled decoder reads valid input when the ``fast`` extra is installed (ADR 0036), and
        :meth:`parse_bytes_reference` decides everything it cannot prove valid: the same result."""
        if _compiled_session is not None:
            parsed = _compiled_session(data, MAX_SESSION_INPUT_BYTES, MAX_SESSION_RECEIPTS)
            if parsed is not None:
                return cls(*parsed)
        return cls.parse_bytes_reference(data)

    @classmethod
    def parse_bytes_reference(cls, data: bytes) -> SessionEvidence:
        """:meth:`from_bytes` by the reference parser alone (:func:`parse_json`, then the schema)."""
        try:
            return cls._from_json(parse_json(data, MAX_SESSION_INPUT_BYTES), parsed=True)
        except MalformedError:
            if nesting_exceeds(bytes(data)):
                raise MalformedError(f"input is nested deeper than {MAX_NESTING} levels") from None
            raise


def session_from_parts(agent: bytes, receipts: bytes | Sequence[bytes]) -> SessionEvidence:
    """Session evidence from its parts as files hold them: the agent path's JSON bytes, and the
    receipts as one JSON array (``bytes``) or each envelope's bytes. The verdict is the one the
    evidence assembled from the parts would get from :meth:`SessionEvidence.from_bytes` (spec 17.1
    and 2.1), nesting included: counted from the evidence's outer object (the agent path and the array
    sit at level 2, each receipt at level 3), a part nested too deep is ``MALFORMED`` at index null
    whatever else is wrong, so the answer never depends on the caller's stack. Otherwise faults are
    found in the evidence's order (the agent path, then each receipt), and a receipt whose bytes are
    not JSON is ``MALFORMED`` at its position. Raises MalformedError (or UnsupportedVersionError),
    never anything else."""
    parts: list[bytes] = [receipts] if isinstance(receipts, bytes) else list(receipts)
    separate = not isinstance(receipts, bytes)
    assembled = len(_ASSEMBLED) + len(agent) + sum(map(len, parts)) + (2 + max(len(parts) - 1, 0) if separate else 0)
    try:
        if assembled > MAX_SESSION_INPUT_BYTES:
            raise MalformedError(f"session evidence exceeds {MAX_SESSION_INPUT_BYTES} bytes")
        agent_value = parse_json(agent, MAX_SESSION_INPUT_BYTES)
        unparsed: MalformedError | None = None
        items: object
        if separate:
            values: list[object] = []
            for index, part in enumerate(parts):
                try:
                    values.append(parse_json(part, MAX_SESSION_INPUT_BYTES))
                except MalformedError as exc:  # reported when the check reaches it (an earlier fault first)
                    unparsed = unparsed or MalformedError(f"receipt {index}: {exc}", index=index)
                    values.append(None)
            items = values
        else:
            items = parse_json(parts[0], MAX_SESSION_INPUT_BYTES)
        evidence = {"v": FORMAT_VERSION, "agent": agent_value, "receipts": items}
        try:
            return SessionEvidence._from_json(evidence, parsed=True)
        except MalformedError as exc:
            if unparsed is not None and exc.index == unparsed.index:
                raise unparsed from None
            raise
    except MalformedError:
        inner = MAX_NESTING - 2 if separate else MAX_NESTING - 1
        if nesting_exceeds(agent, MAX_NESTING - 1) or any(nesting_exceeds(p, inner) for p in parts):
            raise MalformedError(f"input is nested deeper than {MAX_NESTING} levels") from None
        raise


_ASSEMBLED: Final = b'{"v":1,"agent":,"receipts":}'
"""What the evidence adds around its parts (then ``[``, ``]`` and a comma between receipts)."""


# Fields every receipt of a session shares with its first receipt (as a signer issues them); a receipt
# whose values of these are exactly the first's (same JSON types too) needs only the others checked.
_SHARED_FIELDS: Final = ("v", "construction", "deployer", "key_id", "agent", "parent", "depth", "max_children",
                         "event", "policy", "cosigs")  # fmt: skip


class _Receipts:
    """Parses a session's receipts as :meth:`Envelope.from_json` does, with the same result for every
    input, and faster for receipts that repeat the first receipt's shared fields.

    Values parsed from JSON text are equal under ``==`` only if equal as JSON, with one
    exception: ``true == 1`` and ``false == 0``. So the shared fields are compared with ``==``, and
    the ones that hold integers have their types checked too. When they match, those fields were
    checked with the first receipt: only the fields that vary between receipts (times, nonce,
    output, signature) are checked, and the record is the first's with those replaced. On anything
    else the strict parse decides, so a malformed receipt gets the strict parse's error.
    ``tests/core/test_session_fast_paths.py`` holds the two equal over valid and mutated receipts."""

    def __init__(self, *, fast: bool) -> None:
        self._fast = fast  # only for values parsed from JSON text: no subclasses of str or int in them
        self._first: Envelope | None = None
        self._shared: tuple[object, ...] = ()
        self._max_depth_type: type = type(None)

    def parse(self, item: object) -> Envelope:
        first = self._first
        if first is None or not self._fast:
            envelope = Envelope.from_json(item)
            if first is None:
                self._first = envelope
                self._shared = tuple(map(envelope.record_json.__getitem__, _SHARED_FIELDS))
                self._max_depth_type = type(envelope.record.policy.max_depth)
            return envelope
        fast = self._like_first(item, first)
        return Envelope.from_json(item) if fast is None else fast

    def _like_first(self, item: object, first: Envelope) -> Envelope | None:
        if type(item) is not dict or item.keys() != ENVELOPE_KEYS:
            return None
        record = item["record"]
        if type(record) is not dict or record.keys() != RECORD_KEYS:
            return None
        if tuple(map(record.__getitem__, _SHARED_FIELDS)) != self._shared:
            return None
        policy = record["policy"]
        if (
            type(record["v"]) is not int
            or type(record["depth"]) is not int
            or type(record["max_children"]) is not int
            or type(policy["max_depth"]) is not self._max_depth_type
        ):
            return None
        try:
            created, expires = _int(record["created_ms"], ""), _int(record["expires_ms"], "")
            nonce = _match(record["nonce"], NONCE_PATTERN, "")
            output = record["output"]
            parsed_output = None if output is None else OutputReceipt.from_json(output)
        except MalformedError:
            return None
        key_id, sig = item["key_id"], item["sig"]
        base = first.record
        if expires <= created or key_id != base.key_id:
            return None
        if base.construction.signed:
            if type(sig) is not str or SIGNATURE_PATTERN.fullmatch(sig) is None:
                return None
        elif sig is not None:
            return None
        parsed = NodeRecord(
            base.construction, base.deployer, base.key_id, base.agent, created, expires, base.parent, base.depth,
            nonce, base.max_children, base.event, base.policy, parsed_output, base.cosigs, base.v,
        )  # fmt: skip
        return Envelope(parsed, base.key_id, sig, record)


@dataclass(frozen=True, slots=True)
class SessionAdmission:
    """What the durable state step must admit for an accepted session, atomically, all or nothing:
    the agent path's edges (receipts are not counted against ``max_children``, ADR 0018) and every
    receipt's nonce (in accept mode, each consumed; any one already consumed rejects the session)."""

    edges: tuple[ChildEdge, ...]
    leaves: tuple[LeafNonce, ...]


@dataclass(frozen=True, slots=True)
class SessionCheck:
    """The verdict of :func:`check_session_evidence`, and on accept what the state step must admit."""

    result: VerificationResult
    admission: SessionAdmission | None = None


@dataclass(frozen=True, slots=True)
class _AgentPrefix:
    """What the checks of a record under the agent's leaf need from the agent path (spec 6.4), and the
    leaf's construction's properties, read once for a session's receipts instead of once each."""

    leaf: NodeRecord
    link: str | None
    position: int
    depth_limit: int
    nonces: frozenset[str]
    signed: bool
    cosigns_edges: bool

    @classmethod
    def of(cls, agent: Path) -> _AgentPrefix:
        limits = [e.record.policy.max_depth for e in agent.envelopes if e.record.policy.max_depth is not None]
        construction = agent.leaf.record.construction
        return cls(
            agent.leaf.record,
            parent_link(construction, agent.envelopes),
            len(agent),
            min([MAX_DEPTH, *limits]),
            frozenset(e.record.nonce for e in agent.envelopes),
            construction.signed,
            construction.cosigns_edges,
        )


def _receipt_walk(
    prefix: _AgentPrefix, receipt: Envelope, registry: Registry, now_ms: int, policy: VerifierPolicy
) -> VerificationResult | None:
    """Step W for the last record of ``agent ‖ receipt`` alone, once the agent path passed step W:
    a record's checks depend only on the records before it, so the agent path's verdict holds for every
    receipt's path, and this gives the verdict of the whole walk (the same-deployer receipts of a
    session only: no co-signatures). ``tests/core/test_session_properties.py`` holds it equal to
    :func:`countersign.verify.walk` over the whole path."""
    record, index, parent = receipt.record, prefix.position, prefix.leaf
    construction = parent.construction
    if record.construction is not construction:
        return VerificationResult.reject(Reason.MALFORMED, index, "records of one path share a construction")
    if prefix.signed:
        key = registry.resolve(record.deployer, record.key_id, record.created_ms)
        if isinstance(key, KeyProblem):
            return VerificationResult.reject(key.reason, index, key.detail)
        sig = receipt.sig
        assert sig is not None
        if not key.verify(record_signing_input(construction, receipt), b64url_decode_validated(sig)):
            return VerificationResult.reject(Reason.BAD_SIGNATURE, index, "primary signature does not verify")
    skew = policy.clock_skew_ms
    if record.created_ms > now_ms + skew:
        return VerificationResult.reject(Reason.NOT_YET_VALID, index, "record created in the future")
    if record.expires_ms + skew <= now_ms:
        return VerificationResult.reject(Reason.EXPIRED, index, "record expired")
    violation = edge_violation(parent, prefix.link, record, index)
    if violation is not None:
        return VerificationResult.reject(violation.reason, index, violation.detail)
    if prefix.cosigns_edges and record.cosigs:
        return VerificationResult.reject(Reason.MALFORMED, index, "a same-deployer edge carries no co-signatures")
    own = record.policy.max_depth
    if index > (prefix.depth_limit if own is None else min(prefix.depth_limit, own)):
        return VerificationResult.reject(Reason.POLICY_VIOLATION, index, "a max_depth policy forbids this depth")
    if record.nonce in prefix.nonces:
        return VerificationResult.reject(Reason.DUPLICATE_NONCE, index, "nonce repeats inside the path")
    return None


def _out_of_order(receipts: Sequence[Envelope], index: int, seq: int) -> tuple[Reason, int, str]:
    """Why the receipt at ``index`` carries ``seq`` instead: its own receipt comes later (reordered),
    one is missing before it (a gap), or it repeats a position (a second receipt for it)."""
    later = [None if r.record.output is None else r.record.output.seq for r in receipts[index + 1 :]]
    if index in later:
        return Reason.SESSION_REORDERED, index, f"seq {seq} at position {index}"
    if seq > index:
        return Reason.SESSION_GAP, index, f"seq {seq} at position {index}: a receipt is missing"
    return Reason.SESSION_CHAIN_BROKEN, index, f"a second receipt for position {seq}"


def _reject(reason: Reason, index: int | None, detail: str) -> SessionCheck:
    return SessionCheck(VerificationResult.reject(reason, index, detail))


def check_session_evidence(
    session: SessionEvidence,
    outputs: Sequence[bytes | OutputDigest | None] | None = None,
    *,
    registry: Registry,
    now_ms: int,
    require_closed: bool = False,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
    request_id: str = "",
    consumer_policy: ConsumerPolicy | None = None,
) -> SessionCheck:
    """Verify ``session`` in the order of docs/spec.md 17.3; consume nothing.

    ``outputs[i]`` (when given) are the bytes presented for receipt *i* (None: not presented, not
    checked); the list, when given, has one entry per receipt. ``require_closed``: the session must end
    with its close receipt. ``consumer_policy`` (spec 16.3) is then applied to each receipt's path in
    order. The result's index is the receipt's position in ``session.receipts``.
    """
    receipts = session.receipts
    if outputs is not None and len(outputs) != len(receipts):
        raise ValueError(f"{len(outputs)} outputs for {len(receipts)} receipts")
    agent = session.agent
    agent_record = agent.leaf.record
    agent_deployer = agent_record.deployer
    link = parent_link(agent.envelopes[0].record.construction, agent.envelopes)
    digests = [receipt.digest() for receipt in receipts]
    # Counted only when some receipt is there twice: most sessions have none, and a set says so.
    copies = Counter(digests) if len(set(digests)) != len(digests) else None
    edges: list[ChildEdge] = []
    leaves: list[LeafNonce] = []
    first_output = before = None
    first_stream = None
    skew = policy.clock_skew_ms
    for index, receipt in enumerate(receipts):
        record = receipt.record
        if record.parent != link or record.deployer != agent_deployer:
            return _reject(
                Reason.SESSION_AGENT_MISMATCH, index, "the receipt was not issued under the session's agent record"
            )
        if index == 0:  # the whole path once: the agent path's checks, its edges for the state step
            result, edges = walk(
                Path((*agent.envelopes, receipt)),
                registry=registry,
                now_ms=now_ms,
                policy=policy,
                signatures=signatures,
            )
            prefix = _AgentPrefix.of(agent)
            if not result:
                assert result.reason is not None
                return _reject(result.reason, index, f"path envelope {result.index}: {result.detail}")
        else:  # the agent path passed with receipt 0: only this receipt's own record is left to check
            found = _receipt_walk(prefix, receipt, registry, now_ms, policy)
            if found is not None:
                assert found.reason is not None
                return _reject(found.reason, index, f"path envelope {found.index}: {found.detail}")
        output = record.output
        if output is None:
            return _reject(Reason.OUTPUT_MISSING, index, "the receipt has no output section")
        if first_output is None:
            first_output = output
        elif output.session != first_output.session:
            return _reject(Reason.SESSION_MISMATCH, index, f"receipt of session {output.session!r}")
        if output.stream is not None:
            if first_stream is None:
                first_stream = output.stream
            elif (output.stream.unit, output.stream.n) != (first_stream.unit, first_stream.n):
                return _reject(Reason.SESSION_MISMATCH, index, "the chunk belongs to another stream of the session")
        if before is not None and before.close is not None:
            return _reject(Reason.SESSION_AFTER_CLOSE, index, "a receipt follows the close receipt")
        if copies is not None and copies[digests[index]] > 1:
            return _reject(Reason.SESSION_DUPLICATE, index, "the receipt is presented more than once")
        if output.seq != index:
            return _reject(*_out_of_order(receipts, index, output.seq))
        if index > 0 and output.prev != digests[index - 1]:
            return _reject(Reason.SESSION_CHAIN_BROKEN, index, "prev is not the digest of the receipt before")
        presented = None if outputs is None else outputs[index]
        if presented is not None and output_digest(presented) != output.sha256:
            return _reject(Reason.SESSION_OUTPUT_MISMATCH, index, "SHA-256 of the output differs from the signed hash")
        leaves.append(
            new_leaf_nonce(replay_key(agent_deployer, record.nonce), record.expires_ms + skew, index, request_id)
        )
        before = output
    last = receipts[-1].record.output
    assert last is not None
    if require_closed and last.close is None:
        return _reject(Reason.SESSION_TRUNCATED, None, f"the session ends after {len(receipts)} receipts, unclosed")
    if consumer_policy is not None:
        refused = session_policy_refusal(session, consumer_policy, registry.sequence, now_ms)
        if refused is not None:
            return SessionCheck(refused)
    return SessionCheck(VerificationResult.accept(), SessionAdmission(tuple(edges), tuple(leaves)))


def session_policy_refusal(
    session: SessionEvidence, consumer_policy: ConsumerPolicy, registry_sequence: int, now_ms: int
) -> VerificationResult | None:
    """Step C for a session (spec 16.3): each receipt's path in order, told whether the session ends
    with its close receipt; the first refusal, at that receipt's position, with the session's
    attribution. None when every receipt is allowed, or when a receipt has no output section (only
    for evidence not yet verified, spec 16.4: the verifier then rejects it without touching its
    state). Pure; never raises for parsed evidence."""
    receipts = session.receipts
    if any(receipt.record.output is None for receipt in receipts):
        return None
    last = receipts[-1].record.output
    closed = last is not None and last.close is not None
    for index, receipt in enumerate(receipts):
        path = Path((*session.agent.envelopes, receipt))
        found = policy_refusal(path, consumer_policy, attribute(path, registry_sequence), now_ms, session_closed=closed)
        if found is not None:
            detail = f"path envelope {'null' if found.index is None else found.index}: {found.detail}"
            return VerificationResult.reject(
                Reason.CONSUMER_POLICY_VIOLATION, index, detail, session_attribution(session, registry_sequence)
            )
    return None


def check_session_evidence_bytes(
    data: bytes,
    outputs: Sequence[bytes | OutputDigest | None] | None = None,
    *,
    registry: Registry,
    now_ms: int,
    require_closed: bool = False,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
    consumer_policy: ConsumerPolicy | None = None,
) -> SessionCheck:
    """Parse, then :func:`check_session_evidence`. Malformed input is a ``MALFORMED`` (or version) reject."""
    try:
        session = SessionEvidence.from_bytes(data)
    except MalformedError as exc:
        return SessionCheck(malformed_result(exc))
    if outputs is not None and len(outputs) != len(session.receipts):
        return _reject(Reason.MALFORMED, None, f"{len(outputs)} outputs for {len(session.receipts)} receipts")
    return check_session_evidence(
        session, outputs, registry=registry, now_ms=now_ms, require_closed=require_closed, policy=policy,
        signatures=signatures, consumer_policy=consumer_policy,
    )  # fmt: skip


# --- a verifier's session verdict (docs/spec.md 17.4) ------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """What an accepted session is, beside the verdict: its id, how many receipts were presented,
    and whether the last one is the session's close receipt."""

    session: str
    receipts: int
    closed: bool

    @classmethod
    def of(cls, session: SessionEvidence) -> SessionSummary:
        last = session.receipts[-1].record.output
        assert last is not None  # only read once the check held
        return cls(last.session, len(session.receipts), last.close is not None)


def session_attribution(session: SessionEvidence, registry_sequence: int) -> Attribution:
    """The verdict's attribution for a session whose check held: the path to its last receipt, read
    from the verified records (as ``verify`` names the emitter of one output)."""
    return attribute(Path((*session.agent.envelopes, session.receipts[-1])), registry_sequence)


def verify_session_evidence(
    session: SessionEvidence,
    outputs: Sequence[bytes | OutputDigest | None] | None = None,
    *,
    registry: Registry,
    state: VerifierState,
    mode: Mode,
    now_ms: int,
    require_closed: bool = False,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
    request_id: str = "",
    consumer_policy: ConsumerPolicy | None = None,
) -> VerificationResult:
    """:func:`check_session_evidence` (with ``consumer_policy``, step C: a session it refuses touches no state),
    then the durable state step: in accept mode every receipt's nonce and the
    agent path's edges are admitted all or nothing (:meth:`VerifierState.admit_session`); audit mode
    checks the edges and consumes nothing. The verdict carries the attribution of the session's last
    receipt once the check held (also on a state reject, as ``verify_path`` does). Raises
    :class:`countersign.errors.StateUnavailable` when the state cannot be reached, and ValueError for
    more receipts than the state admits at once (callers bound the request first)."""
    check = check_session_evidence(
        session, outputs, registry=registry, now_ms=now_ms, require_closed=require_closed, policy=policy,
        signatures=signatures, request_id=request_id, consumer_policy=consumer_policy,
    )  # fmt: skip
    if check.admission is None:
        return check.result
    attribution = session_attribution(session, registry.sequence)
    admission = check.admission
    rejection = state.admit_session(admission.edges, admission.leaves, consume=mode is Mode.ACCEPT, now_ms=now_ms)
    if isinstance(rejection, EarlierAcceptance):  # a retried session: say so, with the acceptance it repeats
        return VerificationResult.accept(attribution, retry_of_ms=rejection.accepted_ms)
    if rejection is not None and rejection.reason is Reason.FANOUT_EXCEEDED:
        # An edge of the agent path, which every receipt's path holds: found at receipt 0, its index in
        # that path in the detail, as step 2 reports a fault of the agent path (spec 17.4).
        detail = f"path envelope {rejection.index}: parent already has max_children children"
        return VerificationResult.reject(rejection.reason, 0, detail, attribution)
    if rejection is not None:
        detail = "a receipt's nonce was already consumed, or repeats an earlier receipt's: the session consumed nothing"
        return VerificationResult.reject(rejection.reason, rejection.index, detail, attribution)
    return VerificationResult.accept(attribution)
