"""Verifying a presented root-to-leaf path (normative order: docs/spec.md section 6).

The checks run record by record from the root, failing closed at the first violation with a typed
reason and the offending index; the output and the durable state come last, so nothing is recorded
for a path whose cryptography does not hold.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol

from countersign.canonical import DIGEST_PREFIX, b64url_decode_validated, sha256_digest
from countersign.constructions import edge_manifest, edge_signing_input, record_signing_input
from countersign.errors import MalformedError
from countersign.keys import PublicKey
from countersign.merkle import MerkleAccumulator
from countersign.policy import ConsumerPolicy
from countersign.prefix_cache import PrefixCache, PrefixState
from countersign.reasons import Attribution, Reason, VerificationResult, new_emitter, new_proven_edge
from countersign.records import (
    MAX_DEPTH,
    Construction,
    CoSignerRole,
    Envelope,
    NodeRecord,
    Path,
    UnsupportedVersionError,
)
from countersign.registry import KeyProblem, Registry
from countersign.state import ChildEdge, EarlierAcceptance, VerifierState, new_child_edge, new_leaf_nonce


class Mode(enum.StrEnum):
    ACCEPT = "accept"
    """Verify and consume the leaf nonce: the path is accepted at most once."""
    AUDIT = "audit"
    """Verify without consuming or recording anything."""


MAX_CLOCK_SKEW_MS = 3_600_000
MAX_SAFE_TIME = 2**53 - 1  # no record time exceeds it (the schema's integer range)
SIGNED_CONSTRUCTIONS = frozenset({Construction.LINKED_LIST, Construction.MERKLE, Construction.SIGNED_DAG})


@dataclass(frozen=True, slots=True)
class VerifierPolicy:
    """What this verifier accepts beyond the cryptography.

    By default only constructions with signed parent commitments are accepted; the baselines exist to
    be compared, and accepting them is an explicit, unsafe choice.
    """

    constructions: frozenset[Construction] = field(default=SIGNED_CONSTRUCTIONS)
    clock_skew_ms: int = 60_000

    def __post_init__(self) -> None:
        if not 0 <= self.clock_skew_ms <= MAX_CLOCK_SKEW_MS:
            raise ValueError(f"clock_skew_ms must be between 0 and {MAX_CLOCK_SKEW_MS}")

    @classmethod
    def unsafe_allow_baselines(cls, clock_skew_ms: int = 60_000) -> VerifierPolicy:
        """Accept all six constructions, including NO-CHAIN, HASH-ONLY and NAIVE-SIG."""
        return cls(frozenset(Construction), clock_skew_ms)


DEFAULT_POLICY = VerifierPolicy()


@dataclass(frozen=True, slots=True)
class OutputDigest:
    """An output presented by its SHA-256 instead of its bytes (ADR 0027): a consumer holding a large
    output hashes it where it lies and sends 32 bytes. The verdict is the one the bytes would get,
    since step O compares exactly this hash with the leaf's ``output.sha256``; what the verifier can
    no longer check is that the consumer hashed the bytes it holds, which only the consumer relies on."""

    sha256: bytes

    def __post_init__(self) -> None:
        if len(self.sha256) != 32:
            raise ValueError("an output digest is 32 bytes (SHA-256)")

    @classmethod
    def of(cls, output: bytes) -> OutputDigest:
        return cls(hashlib.sha256(output).digest())


def output_digest(output: bytes | OutputDigest) -> str:
    """The ``sha256:<hex>`` form of an output, presented by its bytes or by its digest."""
    if isinstance(output, OutputDigest):
        return DIGEST_PREFIX + output.sha256.hex()
    return DIGEST_PREFIX + hashlib.sha256(output).hexdigest()


def replay_key(deployer: str, nonce: str) -> str:
    """What the durable state remembers for a record: its nonce in its issuer's namespace, so that one
    deployer cannot use up another deployer's nonces (deployer ids cannot contain ``:``)."""
    return f"{deployer}:{nonce}"


def _reject(reason: Reason, index: int | None, detail: str) -> VerificationResult:
    return VerificationResult.reject(reason, index, detail)


class SignatureCheck(NamedTuple):
    """One signature the walk deferred; ``order`` is (record index, step) in the normative order."""

    order: tuple[int, int]
    key: PublicKey
    message: bytes
    signature: str
    reason: Reason
    detail: str

    def holds(self) -> bool:
        return self.key.verify(self.message, b64url_decode_validated(self.signature))


class SignatureBatch(Protocol):
    """Verifies deferred signatures; returns the failing check with the smallest order, if any."""

    def first_failure(self, checks: Sequence[SignatureCheck]) -> SignatureCheck | None: ...

    def close(self) -> None:
        """Release the threads it holds, if any."""


class SerialSignatures:
    """One signature after another, stopping at the first failure. The default."""

    def first_failure(self, checks: Sequence[SignatureCheck]) -> SignatureCheck | None:
        for check in checks:
            if not check.holds():
                return check
        return None

    def close(self) -> None:
        return None


def split_lanes(checks: int, lanes: int, free_cores: int) -> int:
    """The lanes a path of ``checks`` signatures is split into: at most ``lanes``, no more than the free
    cores, never a lane of one check (not worth a hand-off), and at least the caller's own."""
    return max(1, min(lanes, checks // 2, free_cores))


SERIAL = SerialSignatures()


def verify_path(
    path: Path,
    output: bytes | OutputDigest,
    *,
    registry: Registry,
    state: VerifierState,
    mode: Mode,
    now_ms: int,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
    request_id: str = "",
    consumer_policy: ConsumerPolicy | None = None,
    prefix_cache: PrefixCache | None = None,
) -> VerificationResult:
    """Verify ``path`` for the exact ``output`` bytes (or their :class:`OutputDigest`); in accept mode
    consume its leaf nonce.

    ``request_id`` is the caller's optional idempotency key (see :class:`countersign.state.LeafNonce`):
    the same accept-mode request retried after a lost answer is accepted again, marked as a retry of
    the earlier acceptance (``retry_of_ms``); nothing else is.
    ``consumer_policy`` (docs/spec.md section 16) is applied once the path and its output verified
    and before the durable state is touched, so a path it refuses consumes no nonce and records no
    edge. Returns the verdict, with the path's :class:`Attribution` once its checks held. Raises
    :class:`countersign.errors.StateUnavailable` when the durable state cannot be reached
    (retryable; never an accept). With ``prefix_cache`` (:mod:`countersign.prefix_cache`) the walk
    skips what the cache proves of a prefix verified before under the same registry and policy; the
    verdict, its reason and its index are the same as without it.
    """
    edges: list[ChildEdge] = []
    result = _walk(path, registry, now_ms, policy, primary=True, edges=edges, signatures=signatures, cache=prefix_cache)
    if result is not None:
        return result
    leaf_index = len(path) - 1
    leaf = path.leaf.record
    if leaf.output is None:
        return _reject(Reason.OUTPUT_MISSING, leaf_index, "the leaf record has no output section")
    if output_digest(output) != leaf.output.sha256:
        return _reject(Reason.OUTPUT_MISMATCH, leaf_index, "SHA-256 of the output differs from the signed hash")
    attribution = attribute(path, registry.sequence)
    if consumer_policy is not None:
        refusal = policy_refusal(path, consumer_policy, attribution, now_ms)
        if refusal is not None:  # a reject is falsy: compare with None
            return refusal
    leaf_nonce = new_leaf_nonce(
        replay_key(leaf.deployer, leaf.nonce), leaf.expires_ms + policy.clock_skew_ms, leaf_index, request_id
    )
    rejection = state.admit(edges, leaf_nonce, consume=mode is Mode.ACCEPT, now_ms=now_ms)
    if isinstance(rejection, EarlierAcceptance):  # a retry: say so, with the acceptance it repeats
        return VerificationResult.accept(attribution, retry_of_ms=rejection.accepted_ms)
    if rejection is not None:
        detail = (
            "parent already has max_children children"
            if rejection.reason is Reason.FANOUT_EXCEEDED
            else ("the leaf nonce was already consumed")
        )
        return VerificationResult.reject(rejection.reason, rejection.index, detail, attribution)
    return VerificationResult.accept(attribution)


def policy_refusal(
    path: Path, consumer_policy: ConsumerPolicy, attribution: Attribution, now_ms: int, *, session_closed: bool = False
) -> VerificationResult | None:
    """Step C (docs/spec.md 16.3): the ``CONSUMER_POLICY_VIOLATION`` verdict ``consumer_policy`` gives
    ``path``, whose ``attribution`` it is, at ``now_ms``; None when the policy allows it."""
    violation = consumer_policy.violation(path, attribution, now_ms, session_closed=session_closed)
    if violation is None:
        return None
    return VerificationResult.reject(
        Reason.CONSUMER_POLICY_VIOLATION, violation.index, violation.describe(), attribution
    )


def presented_policy_refusal(path: Path, consumer_policy: ConsumerPolicy, now_ms: int) -> VerificationResult | None:
    """What ``consumer_policy`` says of ``path`` as presented, before it is verified (spec 16.4): a
    client that asks a verifier decides here whether to ask in audit mode, so that a path its policy
    refuses consumes nothing. The refusal is only a verdict through :func:`refusal_after_audit`.
    None when the policy allows the path, or when its leaf has no output section (the verifier then
    rejects it without touching its state). Pure; never raises for a parsed path."""
    if path.leaf.record.output is None:
        return None
    return policy_refusal(path, consumer_policy, attribute(path, 0), now_ms)


def refusal_after_audit(audited: VerificationResult, refusal: VerificationResult) -> VerificationResult:
    """The verdict on evidence that a consumer policy refused as presented, given a verifier's audit
    of the same evidence: the checks come before the policy (spec 16.3), so a reject they decided
    stands; an accept, or a reject decided after them (``NONCE_REPLAYED``, ``FANOUT_EXCEEDED``: the
    evidence's attribution is set), gives way to the refusal, which then carries the verifier's
    attribution. The same verdict as applying the policy in the verifier (spec 16.4)."""
    if not audited and audited.attribution is None:
        return audited
    return VerificationResult.reject(
        Reason.CONSUMER_POLICY_VIOLATION, refusal.index, refusal.detail, audited.attribution
    )


def attribute(path: Path, registry_sequence: int) -> Attribution:
    """The :class:`Attribution` of a path whose walk and output check passed: read from the records
    the walk verified (no second verification). Callers must not use it for any other path, except
    to ask a policy about evidence not yet verified (:func:`presented_policy_refusal`, whose answer
    counts only once a verifier's checks held), for a parsed path whose leaf has an output."""
    envelopes = path.envelopes
    leaf = envelopes[-1].record
    output = leaf.output
    assert output is not None  # step O passed
    edges = []
    parent = envelopes[0].record
    for index in range(1, len(envelopes)):
        record = envelopes[index].record
        edges.append(
            new_proven_edge(
                index,
                parent.deployer,
                parent.key_id,
                record.deployer,
                record.key_id,
                record.construction,
                record.deployer != parent.deployer,
                record.cosigs,
            )
        )
        parent = record
    emitter = new_emitter(
        len(envelopes) - 1,
        leaf.deployer,
        leaf.key_id,
        leaf.agent.instance,
        leaf.agent.system,
        leaf.construction,
        leaf.created_ms,
        output.sha256,
        output.binding_scope,
        output.session,
        output.seq,
    )
    return Attribution(emitter, tuple(edges), registry_sequence)


def verify_path_bytes(
    path_bytes: bytes,
    output: bytes | OutputDigest,
    *,
    registry: Registry,
    state: VerifierState,
    mode: Mode,
    now_ms: int,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
    consumer_policy: ConsumerPolicy | None = None,
    request_id: str = "",
    prefix_cache: PrefixCache | None = None,
) -> VerificationResult:
    """Parse, then :func:`verify_path`. Malformed input is a ``MALFORMED`` (or version) reject."""
    try:
        path = Path.from_bytes(path_bytes, None if prefix_cache is None else prefix_cache.known_envelope)
    except MalformedError as exc:
        return malformed_result(exc)
    return verify_path(
        path, output, registry=registry, state=state, mode=mode, now_ms=now_ms, policy=policy, signatures=signatures,
        consumer_policy=consumer_policy, request_id=request_id, prefix_cache=prefix_cache,
    )  # fmt: skip


def malformed_result(exc: MalformedError) -> VerificationResult:
    reason = Reason.UNSUPPORTED_VERSION if isinstance(exc, UnsupportedVersionError) else Reason.MALFORMED
    return _reject(reason, exc.index, str(exc))


def verify_structure(
    path: Path, *, registry: Registry, now_ms: int, policy: VerifierPolicy = DEFAULT_POLICY
) -> VerificationResult:
    """Every check except the output binding and the durable state: is this path sound evidence up to
    its leaf? (A signer checks a parent path this way before building on it.)"""
    result = _walk(path, registry, now_ms, policy, primary=True, edges=[], signatures=SERIAL)
    return VerificationResult.accept() if result is None else result


def walk(
    path: Path,
    *,
    registry: Registry,
    now_ms: int,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: SignatureBatch = SERIAL,
) -> tuple[VerificationResult, list[ChildEdge]]:
    """Step W alone, with the primary signatures: its verdict, and the edges step S would count."""
    edges: list[ChildEdge] = []
    result = _walk(path, registry, now_ms, policy, primary=True, edges=edges, signatures=signatures)
    return (VerificationResult.accept() if result is None else result), edges


def is_receipt_edge(parent: NodeRecord, child: NodeRecord) -> bool:
    """An output receipt under the agent that emitted it: counted apart from ``max_children`` (ADR 0018).

    A receipt is a same-deployer record with an output section that can have no children
    (``max_children`` 0), under a record without one; anything else is a delegation and is counted.
    """
    return (
        child.output is not None
        and child.max_children == 0
        and child.deployer == parent.deployer
        and parent.output is None
    )


def check_lineage(
    path: Path, *, registry: Registry, now_ms: int, policy: VerifierPolicy = DEFAULT_POLICY
) -> VerificationResult:
    """Lineage-only check, as the paper measures it: every lineage and co-signature check, without
    the primary signatures, the output binding and the durable state. Not a verdict to act on."""
    result = _walk(path, registry, now_ms, policy, primary=False, edges=[], signatures=SERIAL)
    return VerificationResult.accept() if result is None else result


# Steps inside one record, in the normative order of docs/spec.md section 6.
_STEP_CONSTRUCTION, _STEP_KEY, _STEP_SIGNATURE, _STEP_WINDOW = 0, 1, 2, 3
_STEP_PARENT, _STEP_DEPTH, _STEP_SYSTEM, _STEP_EXPIRY, _STEP_ALLOWED = 4, 5, 6, 7, 8
_STEP_COSIGNERS, _STEP_PARENT_COSIG_KEY, _STEP_PARENT_COSIG = 9, 10, 11
_STEP_CHILD_COSIG_KEY, _STEP_CHILD_COSIG, _STEP_MAX_DEPTH, _STEP_NONCE = 12, 13, 14, 15


@dataclass(frozen=True, slots=True)
class EdgeViolation:
    reason: Reason
    step: int
    detail: str


def edge_violation(
    parent: NodeRecord, expected_link: str | None, child: NodeRecord, position: int
) -> EdgeViolation | None:
    """The first lineage rule the edge ``parent`` -> ``child`` breaks, in normative order, or None.

    ``expected_link`` is what ``child.parent`` must equal (the parent envelope's digest, the Merkle
    root of the prefix, or None under NO-CHAIN); ``position`` is the child's index in its path. The
    verifier applies it to every edge of a presented path; a parent's signer applies it before it
    co-signs an edge.
    """
    if child.parent != expected_link:
        return EdgeViolation(Reason.PARENT_MISMATCH, _STEP_PARENT, "parent reference does not match")
    if child.depth != position:
        return EdgeViolation(Reason.DEPTH_MISMATCH, _STEP_DEPTH, f"depth {child.depth} at position {position}")
    if child.agent.system != parent.agent.system:
        return EdgeViolation(Reason.SYSTEM_MISMATCH, _STEP_SYSTEM, "record belongs to another agent system")
    if child.expires_ms > parent.expires_ms:
        return EdgeViolation(Reason.EXPIRY_EXCEEDS_PARENT, _STEP_EXPIRY, "child outlives its parent")
    allowed = parent.policy.allowed_children
    if allowed is not None and child.deployer != parent.deployer and child.deployer not in allowed:
        return EdgeViolation(Reason.POLICY_VIOLATION, _STEP_ALLOWED, f"{child.deployer} is not an allowed child")
    return None


class _Failure(Exception):
    """A structural violation found while walking; carries its place in the normative order."""

    def __init__(self, index: int, step: int, reason: Reason, detail: str) -> None:
        self.order = (index, step)
        self.result = VerificationResult.reject(reason, index, detail)


def _walk(
    path: Path,
    registry: Registry,
    now_ms: int,
    policy: VerifierPolicy,
    *,
    primary: bool,
    edges: list[ChildEdge],
    signatures: SignatureBatch,
    cache: PrefixCache | None = None,
) -> VerificationResult | None:
    """Run every check of the path walk; return the first violation in normative order, or None.

    Structural checks run as the walk goes; signature checks are collected and verified at the end,
    only those ordered before the first structural violation, so the verdict is exactly what a
    strictly sequential walk would return.

    With ``cache``, the longest prefix of the path the cache holds is not walked again (only its
    records' time windows are checked: if one fails, the whole path is walked as without a cache, so
    the reason and index are the same), and a path that passes leaves its own prefix and itself in
    the cache. A cached prefix's signatures all held, so leaving them out changes no verdict.
    """
    checks: list[SignatureCheck] = []
    failure: _Failure | None = None
    plan: _CachePlan | None = None
    if cache is not None and primary:
        plan = _CachePlan.look_up(cache, path, registry, policy, now_ms)
    try:
        _collect(path, registry, now_ms, policy, primary, edges, checks, plan)
    except _Failure as found:
        failure = found
        checks = [check for check in checks if check.order < found.order]
    bad = signatures.first_failure(checks)
    if bad is not None:
        return VerificationResult.reject(bad.reason, bad.order[0], bad.detail)
    if failure is not None:
        return failure.result
    if plan is not None:
        plan.store()
    return None


@dataclass(slots=True)
class _CachePlan:
    """One walk's use of the prefix cache: the envelopes' digests, the prefix to resume from, and the
    prefix states to store once the whole walk (signatures included) has passed."""

    cache: PrefixCache
    path: Path
    epoch: tuple[object, ...]
    digests: tuple[str, ...]
    resume: PrefixState | None
    store_lengths: tuple[int, ...]
    snapshots: dict[int, PrefixState] = field(default_factory=dict)

    @classmethod
    def look_up(
        cls, cache: PrefixCache, path: Path, registry: Registry, policy: VerifierPolicy, now_ms: int
    ) -> _CachePlan:
        epoch = cache.epoch(registry, policy)
        digests = tuple(envelope.digest() for envelope in path.envelopes)
        resume: PrefixState | None = None
        for length in range(len(digests), 0, -1):
            state = cache.get((epoch, digests[:length]))
            if state is not None:
                skew = policy.clock_skew_ms
                in_window = state.latest_created_ms <= now_ms + skew and state.earliest_expires_ms + skew > now_ms
                resume = state if in_window else None
                break
        total = len(digests)
        # Store the path and its prefix (a sibling shares the prefix; the same path may come again),
        # unless the cache already proved them.
        known = 0 if resume is None else resume.length
        lengths = tuple(length for length in (total - 1, total) if length > known)
        return cls(cache, path, epoch, digests, resume, lengths)

    def store(self) -> None:
        for length, state in self.snapshots.items():
            self.cache.put((self.epoch, self.digests[:length]), state)
        if self.snapshots:
            # A receipt (a record with an output) is new for every output: remembering it would fill the
            # bound with envelopes seen once (issue 29: the verifier's memory under a stream of outputs).
            envelopes = self.path.envelopes
            self.cache.remember_envelopes(envelopes[:-1] if envelopes[-1].record.output is not None else envelopes)


def _collect(
    path: Path,
    registry: Registry,
    now_ms: int,
    policy: VerifierPolicy,
    primary: bool,
    edges: list[ChildEdge],
    checks: list[SignatureCheck],
    plan: _CachePlan | None = None,
) -> None:
    envelopes = path.envelopes
    root = envelopes[0].record
    construction = root.construction
    if construction not in policy.constructions:
        raise _Failure(0, _STEP_CONSTRUCTION, Reason.CONSTRUCTION_NOT_ALLOWED, f"{construction} is not accepted")
    skew = policy.clock_skew_ms
    check_primary = primary and construction.signed
    links_parent = construction.links_parent
    cosigns_edges = construction.cosigns_edges
    enforces_fanout = construction.enforces_fanout
    merkle = MerkleAccumulator() if construction is Construction.MERKLE else None
    nonces: set[str] = set()
    depth_limit = MAX_DEPTH
    parent: Envelope | None = None
    parent_digest = ""
    last = len(envelopes) - 1
    start = 0
    digests: tuple[str, ...] | None = None
    store_lengths: tuple[int, ...] = ()
    latest_created, earliest_expires = 0, MAX_SAFE_TIME
    if plan is not None:
        digests, store_lengths = plan.digests, plan.store_lengths
        resume = plan.resume
        if resume is not None:
            start = resume.length
            parent = envelopes[start - 1]
            parent_digest = resume.parent_digest
            if merkle is not None:
                assert resume.merkle_subtrees is not None
                merkle = MerkleAccumulator.resumed(resume.merkle_subtrees)
            nonces = set(resume.nonces)
            depth_limit = resume.depth_limit
            edges.extend(resume.edges)
            latest_created, earliest_expires = resume.latest_created_ms, resume.earliest_expires_ms
    for index in range(start, last + 1):
        envelope = envelopes[index]
        record = envelope.record
        if record.construction is not construction:
            raise _Failure(index, _STEP_CONSTRUCTION, Reason.MALFORMED, "records of one path share a construction")
        record_bytes = envelope.record_bytes()

        if check_primary:
            key = _resolve(registry, record.deployer, record.key_id, record.created_ms, index, _STEP_KEY, None)
            assert envelope.sig is not None
            message = record_signing_input(construction, envelope)
            checks.append(
                SignatureCheck(
                    (index, _STEP_SIGNATURE),
                    key,
                    message,
                    envelope.sig,
                    Reason.BAD_SIGNATURE,
                    "primary signature does not verify",
                )
            )

        if record.created_ms > now_ms + skew:
            raise _Failure(index, _STEP_WINDOW, Reason.NOT_YET_VALID, "record created in the future")
        if record.expires_ms + skew <= now_ms:
            raise _Failure(index, _STEP_WINDOW, Reason.EXPIRED, "record expired")

        if parent is None:
            if record.parent is not None:
                raise _Failure(index, _STEP_PARENT, Reason.PARENT_MISMATCH, "the root must not reference a parent")
            if record.depth != 0:
                raise _Failure(index, _STEP_DEPTH, Reason.DEPTH_MISMATCH, "the root must have depth 0")
            if record.cosigs:
                raise _Failure(index, _STEP_COSIGNERS, Reason.MALFORMED, "a root has no edge to co-sign")
        else:
            if not links_parent:
                expected: str | None = None
            elif merkle is not None:
                expected = merkle.root()
            else:
                expected = parent_digest
            violation = edge_violation(parent.record, expected, record, index)
            if violation is not None:
                raise _Failure(index, violation.step, violation.reason, violation.detail)
            parent_record = parent.record
            cross = record.deployer != parent_record.deployer
            if cosigns_edges:
                _collect_cosignatures(
                    parent_record.deployer, parent_digest, record_bytes, envelope, index, cross, registry, checks
                )
            if enforces_fanout and not is_receipt_edge(parent_record, record):
                edges.append(
                    new_child_edge(
                        parent_digest,
                        replay_key(record.deployer, record.nonce),
                        parent_record.max_children,
                        parent_record.expires_ms + skew,
                        index,
                    )
                )
        if record.policy.max_depth is not None and record.policy.max_depth < depth_limit:
            depth_limit = record.policy.max_depth
        if index > depth_limit:
            raise _Failure(index, _STEP_MAX_DEPTH, Reason.POLICY_VIOLATION, "a max_depth policy forbids this depth")
        if record.nonce in nonces:
            raise _Failure(index, _STEP_NONCE, Reason.DUPLICATE_NONCE, "nonce repeats inside the path")
        nonces.add(record.nonce)

        if digests is not None:  # the cache's walk: every digest is known, and prefixes are remembered
            parent_digest = digests[index]
            if merkle is not None:
                merkle.append(envelope.canonical_bytes(record_bytes))
            latest_created = max(latest_created, record.created_ms)
            earliest_expires = min(earliest_expires, record.expires_ms)
            if index + 1 in store_lengths and plan is not None:
                plan.snapshots[index + 1] = PrefixState(
                    index + 1,
                    parent_digest,
                    None if merkle is None else merkle.snapshot(),
                    frozenset(nonces),
                    depth_limit,
                    tuple(edges),
                    latest_created,
                    earliest_expires,
                )
        elif index < last:
            canonical = envelope.canonical_bytes(record_bytes)
            parent_digest = sha256_digest(canonical)
            if merkle is not None:
                merkle.append(canonical)
        parent = envelope


def _resolve(
    registry: Registry, deployer: str, key_id: str, at_ms: int, index: int, step: int, role: CoSignerRole | None
) -> PublicKey:
    """The key, or the failure naming it (and the co-signer's role, for a co-signature's key)."""
    key = registry.resolve(deployer, key_id, at_ms)
    if isinstance(key, KeyProblem):
        raise _Failure(index, step, key.reason, key.detail if role is None else f"{role} co-signer: {key.detail}")
    return key


def _collect_cosignatures(
    parent_deployer: str,
    parent_digest: str,
    record_bytes: bytes,
    envelope: Envelope,
    index: int,
    cross: bool,
    registry: Registry,
    checks: list[SignatureCheck],
) -> None:
    """SIGNED-DAG: a cross-deployer edge carries parent and child co-signatures over τ."""
    record = envelope.record
    if not cross:
        if record.cosigs:
            raise _Failure(index, _STEP_COSIGNERS, Reason.MALFORMED, "a same-deployer edge carries no co-signatures")
        return
    if not record.cosigs:
        raise _Failure(index, _STEP_COSIGNERS, Reason.MISSING_COSIGNATURE, "cross-deployer edge without co-signatures")
    parent_cosig, child_cosig = record.cosigs
    if parent_cosig.deployer != parent_deployer or child_cosig.deployer != record.deployer:
        raise _Failure(index, _STEP_COSIGNERS, Reason.MISSING_COSIGNATURE, "co-signers are not the edge's deployers")
    message = edge_signing_input(edge_manifest(parent_digest, record_bytes, record.cosigs))
    for cosig, key_step, sig_step in (
        (parent_cosig, _STEP_PARENT_COSIG_KEY, _STEP_PARENT_COSIG),
        (child_cosig, _STEP_CHILD_COSIG_KEY, _STEP_CHILD_COSIG),
    ):
        key = _resolve(registry, cosig.deployer, cosig.key_id, record.created_ms, index, key_step, cosig.role)
        checks.append(
            SignatureCheck(
                (index, sig_step), key, message, cosig.sig, Reason.BAD_COSIGNATURE, _COSIGNATURE_FAILS[cosig.role]
            )
        )


# What a failed co-signature check says, by role: written once, not for every co-signature checked.
_COSIGNATURE_FAILS: Final = {role: f"{role} co-signature does not verify" for role in CoSignerRole}
