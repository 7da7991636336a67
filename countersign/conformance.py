"""The mutation matrix: every construction against every structural and key-compromise attack.

One adversary for all constructions. It holds honest material (other chains by the same deployers),
its own unenrolled key, and, for the key-compromise attacks, some deployers' keys. Each attack makes a
structural edit and then *relinks* the path the only way the adversary can: it rewrites every lineage
field (parent reference, depth, agent system, expiry) to be consistent again, re-signs whatever it
holds the key for, and leaves every other signature as it was. Whether that yields an accepted path is
then up to the verifier: a construction stops an attack exactly when an edit or relink touches bytes
that an uncompromised key signed. Nothing in this module knows which construction "should" win; the
expected pattern (docs/conformance.md) is only compared afterwards.

Pure: randomness comes from an injected ``random.Random``; an unexpected exception propagates and
aborts the run (it is a bug, never counted as a rejection).
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from countersign.canonical import b64url_encode, sha256_digest
from countersign.constructions import (
    EdgeProposal,
    cosign,
    parent_link,
    record_signing_input,
    seal,
)
from countersign.keys import Ed25519Signer, Signer
from countersign.records import (
    AgentRef,
    BindingScope,
    Construction,
    CoSignature,
    CoSignerRole,
    Envelope,
    LifecycleEvent,
    NodeRecord,
    OutputReceipt,
    Path,
    Policy,
)
from countersign.registry import Registry
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c", "deployer-d")
NOW_MS = 1_800_000_000_000
TTL_MS = 3_600_000

T = TypeVar("T")


class Attack(enum.StrEnum):
    HONEST = "honest path (control)"
    B1_ORPHAN = "B1 orphan insertion"
    B2_DELETE = "B2 delete intermediate, relink"
    B3_TRANSPLANT = "B3 cross-chain transplant"
    B4_MODIFY_ANCESTOR = "B4 modify ancestor"
    B5_FANOUT = "B5 sibling fan-out"
    TRUNCATE = "truncate head"
    SUBSTITUTE_OUTPUT = "substitute output"
    REPLAY = "replay"
    CHILD_KEY_GRAFT = "child key: bind arbitrary parent"
    PARENT_KEY_REWRITE = "parent key: rewrite referenced parent"
    OWN_SUFFIX_REWRITE = "one key: rewrite own suffix"
    BOTH_KEYS_FORGE = "both keys: forge cross edge"
    REVOKED_CHILD_GRAFT = "revoked child key: bind parent"


A, R = True, False
_ORDER = (
    Construction.NO_CHAIN,
    Construction.HASH_ONLY,
    Construction.NAIVE_SIG,
    Construction.LINKED_LIST,
    Construction.MERKLE,
    Construction.SIGNED_DAG,
)

EXPECTED_ACCEPTED: dict[Attack, dict[Construction, bool]] = {
    attack: dict(zip(_ORDER, row, strict=True))
    for attack, row in {
        # NO-CHAIN, HASH-ONLY, NAIVE-SIG, LINKED-LIST, MERKLE, SIGNED-DAG (True: the attack is accepted)
        Attack.HONEST: (A, A, A, A, A, A),
        Attack.B1_ORPHAN: (A, A, R, R, R, R),
        Attack.B2_DELETE: (A, A, A, R, R, R),
        Attack.B3_TRANSPLANT: (A, A, R, R, R, R),
        Attack.B4_MODIFY_ANCESTOR: (A, A, R, R, R, R),
        Attack.B5_FANOUT: (A, A, A, R, R, R),
        Attack.TRUNCATE: (A, A, A, R, R, R),
        Attack.SUBSTITUTE_OUTPUT: (A, A, R, R, R, R),
        Attack.REPLAY: (A, A, R, R, R, R),
        Attack.CHILD_KEY_GRAFT: (A, A, A, A, A, R),
        Attack.PARENT_KEY_REWRITE: (A, A, A, R, R, R),
        Attack.OWN_SUFFIX_REWRITE: (A, A, A, A, A, A),
        Attack.BOTH_KEYS_FORGE: (A, A, A, A, A, A),
        Attack.REVOKED_CHILD_GRAFT: (A, A, R, R, R, R),
    }.items()
}
"""The expected pattern of docs/conformance.md, for every construction of docs/spec.md section 5 and attack."""


@dataclass(frozen=True, slots=True)
class Presentation:
    path: Path
    output: bytes


@dataclass
class Scenario:
    """Honest presentations that must be accepted first, then the adversary's attempts.

    The attack succeeds when any attempt is accepted.
    """

    setup: list[Presentation]
    attempts: list[Presentation]
    registry: Registry


class HarnessError(AssertionError):
    """The harness built something it did not mean to (an honest setup path was rejected)."""


@dataclass
class Adversary:
    """Keys and material for one construction's trials."""

    construction: Construction
    mesh: SampleMesh
    rng: random.Random
    outsider: Signer = field(default_factory=Ed25519Signer.generate)

    # --- honest material -------------------------------------------------------------------

    def nonce(self) -> str:
        return self.rng.getrandbits(128).to_bytes(16, "big").hex()

    def output(self) -> bytes:
        return b"output %d" % self.rng.getrandbits(64)

    def route(self, length: int, *, same_deployer_tail: int = 0) -> list[str]:
        """A random route of ``length`` deployers; the last ``same_deployer_tail`` hops stay with one."""
        route = [self.rng.choice(DEPLOYERS)]
        while len(route) < length:
            if len(route) >= length - same_deployer_tail:
                route.append(route[-1])
            else:
                # Mostly cross-deployer edges (where constructions differ), sometimes a local hop.
                choices = [d for d in DEPLOYERS if d != route[-1]] if self.rng.random() < 0.8 else [route[-1]]
                route.append(self.rng.choice(choices))
        return route

    def honest_path(
        self,
        route: Sequence[str],
        output: bytes,
        *,
        system: str | None = None,
        prefix: Sequence[Envelope] = (),
        max_children: int | None = None,
    ) -> Path:
        return self.mesh.issue_path(
            self.construction,
            route,
            output,
            now_ms=NOW_MS,
            system=system or (prefix[0].record.agent.system if prefix else f"system-{self.rng.getrandbits(32):08x}"),
            ttl_ms=TTL_MS,
            max_children=self.rng.randint(2, 6) if max_children is None else max_children,
            nonces=[self.nonce() for _ in route],
            prefix=prefix,
        )

    # --- the adversary's one repair technique --------------------------------------------------

    def relink(self, envelopes: Sequence[Envelope], start: int, held: Mapping[str, Signer]) -> list[Envelope]:
        """Make records ``start..`` consistent with what precedes them, re-signing what ``held`` allows."""
        out = list(envelopes[:start])
        system = envelopes[0].record.agent.system
        for index in range(start, len(envelopes)):
            original = envelopes[index]
            record = original.record
            parent = out[-1].record if out else None
            wanted = replace(
                record,
                parent=parent_link(self.construction, out),
                depth=index,
                agent=replace(record.agent, system=system),
                expires_ms=record.expires_ms if parent is None else min(record.expires_ms, parent.expires_ms),
                cosigs=(),
            )
            if self.construction.cosigns_edges and parent is not None and parent.deployer != record.deployer:
                wanted = replace(wanted, cosigs=self._cosignatures(out[-1], wanted, record, held))
            out.append(self._sign_as_possible(original, wanted, held))
        return out

    def _cosignatures(
        self, parent: Envelope, child: NodeRecord, previous: NodeRecord, held: Mapping[str, Signer]
    ) -> tuple[CoSignature, CoSignature]:
        parent_signer = held.get(parent.record.deployer)
        parent_key_id = parent_signer.key_id if parent_signer else self.mesh.signers[parent.record.deployer].key_id
        proposal = EdgeProposal(parent, child, parent_key_id)
        made = []
        for role, deployer, signer in (
            (CoSignerRole.PARENT, parent.record.deployer, parent_signer),
            (CoSignerRole.CHILD, child.deployer, held.get(child.deployer)),
        ):
            if signer is not None:
                made.append(cosign(proposal, signer, role))
                continue
            reused = [c for c in previous.cosigs if c.role is role and c.deployer == deployer]
            if reused:
                made.append(reused[0])
            else:
                # No key, nothing to reuse: the best it can do is sign with its own key under that name.
                key_id = self.mesh.signers[deployer].key_id
                made.append(
                    CoSignature(role, deployer, key_id, b64url_encode(self.outsider.sign(proposal.signing_input())))
                )
        return made[0], made[1]

    def _sign_as_possible(self, original: Envelope, wanted: NodeRecord, held: Mapping[str, Signer]) -> Envelope:
        if not self.construction.signed:
            return seal(wanted, None)
        signer = held.get(wanted.deployer)
        if signer is not None:
            return seal(wanted, signer)
        if wanted == original.record:
            return original
        return Envelope.build(wanted, original.sig)

    def forged(self, record: NodeRecord) -> Envelope:
        """An envelope for ``record`` whose signature the adversary made with its own key."""
        if not self.construction.signed:
            return seal(record, None)
        probe = Envelope.build(record, None)
        message = record_signing_input(self.construction, probe)
        return Envelope.build(record, b64url_encode(self.outsider.sign(message)))

    def new_record(self, template: NodeRecord, deployer: str, *, output: bytes | None) -> NodeRecord:
        """A record the adversary writes from scratch in ``deployer``'s name (relink fixes lineage)."""
        return replace(
            template,
            deployer=deployer,
            key_id=self.mesh.signers[deployer].key_id if self.construction.signed else template.key_id,
            agent=AgentRef(f"forged-{self.rng.getrandbits(32):08x}", template.agent.system),
            nonce=self.nonce(),
            max_children=4,
            event=LifecycleEvent.NEW,
            policy=Policy(),
            output=None
            if output is None
            else OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, "session-forged", 0, None),
            cosigs=(),
        )

    def edited(self, record: NodeRecord) -> NodeRecord:
        """One change to a field the record's issuer decided (not a lineage field)."""
        edits: list[Callable[[NodeRecord], NodeRecord]] = [
            lambda r: replace(r, agent=replace(r.agent, instance=f"rewritten-{self.rng.getrandbits(32):08x}")),
            lambda r: replace(r, max_children=r.max_children + self.rng.randint(1, 100)),
            lambda r: replace(
                r, event=LifecycleEvent.RELOAD if r.event is LifecycleEvent.FINE_TUNE else LifecycleEvent.FINE_TUNE
            ),
            lambda r: replace(r, policy=Policy(max_depth=self.rng.randint(40, 63))),
            lambda r: replace(r, created_ms=r.created_ms - self.rng.randint(1, 10_000)),
        ]
        return self.rng.choice(edits)(record)

    # --- attacks -------------------------------------------------------------------------------

    def scenario(self, attack: Attack) -> Scenario:
        return _BUILDERS[attack](self)


def _present(path: Path | Sequence[Envelope], output: bytes) -> Presentation:
    return Presentation(path if isinstance(path, Path) else Path(tuple(path)), output)


def _honest(adv: Adversary) -> Scenario:
    output = adv.output()
    return Scenario(
        [], [_present(adv.honest_path(adv.route(adv.rng.randint(1, 6)), output), output)], adv.mesh.registry
    )


def _orphan(adv: Adversary) -> Scenario:
    """B1: insert a record no deployer issued; the adversary can only sign it with its own key."""
    output = adv.output()
    path = adv.honest_path(adv.route(adv.rng.randint(3, 6)), output)
    position = adv.rng.randint(1, len(path) - 1)
    deployer = adv.rng.choice(DEPLOYERS)
    fabricated = adv.forged(adv.new_record(path.envelopes[position].record, deployer, output=None))
    envelopes = [*path.envelopes[:position], fabricated, *path.envelopes[position:]]
    return Scenario([], [_present(adv.relink(envelopes, position, {}), output)], adv.mesh.registry)


def _delete(adv: Adversary) -> Scenario:
    """B2: drop an intermediate record and relink its child to its grandparent."""
    output = adv.output()
    path = adv.honest_path(adv.route(adv.rng.randint(3, 6)), output)
    position = adv.rng.randint(1, len(path) - 2)
    envelopes = [*path.envelopes[:position], *path.envelopes[position + 1 :]]
    return Scenario([], [_present(adv.relink(envelopes, position, {}), output)], adv.mesh.registry)


def _transplant(adv: Adversary) -> Scenario:
    """B3: move the suffix of another chain (another agent system) under this chain's prefix."""
    victim = adv.honest_path(adv.route(adv.rng.randint(2, 6)), adv.output())
    output = adv.output()
    donor = adv.honest_path(adv.route(adv.rng.randint(2, 6)), output)
    cut = adv.rng.randint(1, len(victim) - 1)
    graft = adv.rng.randint(1, len(donor) - 1)
    envelopes = [*victim.envelopes[:cut], *donor.envelopes[graft:]]
    return Scenario([], [_present(adv.relink(envelopes, cut, {}), output)], adv.mesh.registry)


def _modify_ancestor(adv: Adversary) -> Scenario:
    """B4: change an ancestor's issuer-decided content after it has children."""
    output = adv.output()
    path = adv.honest_path(adv.route(adv.rng.randint(2, 6)), output)
    position = adv.rng.randint(0, len(path) - 2)
    envelopes = list(path.envelopes)
    envelopes[position] = Envelope.build(adv.edited(envelopes[position].record), envelopes[position].sig)
    return Scenario([], [_present(adv.relink(envelopes, position, {}), output)], adv.mesh.registry)


def _fanout(adv: Adversary) -> Scenario:
    """B5: one more valid child under a parent than its signed max_children allows."""
    limit = adv.rng.randint(1, 3)
    route = adv.route(adv.rng.randint(2, 5))
    trunk = adv.honest_path(route[:-1], adv.output(), max_children=limit)
    siblings = []
    for _ in range(limit + 1):
        output = adv.output()
        siblings.append(_present(adv.honest_path(route[-1:], output, prefix=trunk.envelopes), output))
    return Scenario(siblings[:-1], siblings[-1:], adv.mesh.registry)


def _truncate(adv: Adversary) -> Scenario:
    """Drop the head of the path and present the rest as if it started there."""
    output = adv.output()
    path = adv.honest_path(adv.route(adv.rng.randint(2, 6)), output)
    envelopes = list(path.envelopes[adv.rng.randint(1, len(path) - 1) :])
    return Scenario([], [_present(adv.relink(envelopes, 0, {}), output)], adv.mesh.registry)


def _substitute_output(adv: Adversary) -> Scenario:
    """Present other bytes: as they are, and with the leaf's output hash rewritten to match."""
    path = adv.honest_path(adv.route(adv.rng.randint(1, 6)), adv.output())
    claimed = adv.output()
    leaf = path.leaf.record
    assert leaf.output is not None
    rewritten = replace(leaf, output=replace(leaf.output, sha256=sha256_digest(claimed)))
    envelopes = [*path.envelopes[:-1], Envelope.build(rewritten, path.leaf.sig)]
    attempts = [_present(path, claimed), _present(adv.relink(envelopes, len(envelopes) - 1, {}), claimed)]
    return Scenario([], attempts, adv.mesh.registry)


def _replay(adv: Adversary) -> Scenario:
    """Present an accepted path again: verbatim, and with a fresh leaf nonce."""
    output = adv.output()
    path = adv.honest_path(adv.route(adv.rng.randint(1, 6)), output)
    refreshed = [*path.envelopes[:-1], Envelope.build(replace(path.leaf.record, nonce=adv.nonce()), path.leaf.sig)]
    attempts = [_present(path, output), _present(adv.relink(refreshed, len(refreshed) - 1, {}), output)]
    return Scenario([_present(path, output)], attempts, adv.mesh.registry)


def _graft(adv: Adversary, keys_held: Callable[[str, str], Sequence[str]], registry: Registry) -> Scenario:
    """Attach a new record of a child deployer under a parent record (another deployer's) that never
    delegated to it. ``keys_held(parent_deployer, child_deployer)`` names the compromised deployers."""
    path = adv.honest_path(adv.route(adv.rng.randint(1, 5)), adv.output())
    position = adv.rng.randint(0, len(path) - 1)
    parent = path.envelopes[position].record
    child_deployer = adv.rng.choice([d for d in DEPLOYERS if d != parent.deployer])
    output = adv.output()
    held = {d: adv.mesh.signers[d] for d in keys_held(parent.deployer, child_deployer)}
    child = adv.new_record(parent, child_deployer, output=output)
    envelopes = [*path.envelopes[: position + 1], adv.forged(child)]
    return Scenario([], [_present(adv.relink(envelopes, position + 1, held), output)], registry)


def _parent_key_rewrite(adv: Adversary) -> Scenario:
    """With the parent's key: rewrite a parent record after a child (of another deployer) references it."""
    length = adv.rng.randint(2, 6)
    position = adv.rng.randint(0, length - 2)
    route = adv.route(length)
    if route[position + 1] == route[position]:
        route[position + 1] = adv.rng.choice([d for d in DEPLOYERS if d != route[position]])
    output = adv.output()
    path = adv.honest_path(route, output)
    envelopes = list(path.envelopes)
    envelopes[position] = Envelope.build(adv.edited(envelopes[position].record), envelopes[position].sig)
    held = {route[position]: adv.mesh.signers[route[position]]}
    return Scenario([], [_present(adv.relink(envelopes, position, held), output)], adv.mesh.registry)


def _own_suffix_rewrite(adv: Adversary) -> Scenario:
    """With one deployer's key: rewrite the records it issued below its own same-deployer hop."""
    tail = adv.rng.randint(2, 3)
    route = adv.route(adv.rng.randint(tail, 6), same_deployer_tail=tail)
    path = adv.honest_path(route, adv.output())
    start = len(route) - tail
    owner = route[-1]
    claimed = adv.output()
    envelopes = list(path.envelopes)
    for index in range(start, len(envelopes)):
        record = adv.edited(envelopes[index].record)
        if index == len(envelopes) - 1:
            assert record.output is not None
            record = replace(record, output=replace(record.output, sha256=sha256_digest(claimed)))
        envelopes[index] = Envelope.build(record, envelopes[index].sig)
    held = {owner: adv.mesh.signers[owner]}
    return Scenario([], [_present(adv.relink(envelopes, start, held), claimed)], adv.mesh.registry)


def _revoked(registry: Registry, deployer: str) -> Registry:
    keys = {key_id: replace(entry, revoked_ms=NOW_MS - 1) for key_id, entry in registry.deployers[deployer].items()}
    return Registry({**registry.deployers, deployer: keys}, registry.sequence + 1)


def _child_key_graft(adv: Adversary) -> Scenario:
    return _graft(adv, lambda parent, child: [child], adv.mesh.registry)


def _both_keys_forge(adv: Adversary) -> Scenario:
    return _graft(adv, lambda parent, child: [parent, child], adv.mesh.registry)


def _revoked_child_graft(adv: Adversary) -> Scenario:
    victim = adv.rng.choice(DEPLOYERS)
    registry = _revoked(adv.mesh.registry, victim)
    # Pick a parent of another deployer so that the revoked deployer is the child.
    path = adv.honest_path(
        [d for d in adv.route(adv.rng.randint(1, 5)) if d != victim] or [_other(victim)], adv.output()
    )
    position = adv.rng.randint(0, len(path) - 1)
    output = adv.output()
    child = adv.new_record(path.envelopes[position].record, victim, output=output)
    envelopes = [*path.envelopes[: position + 1], adv.forged(child)]
    held = {victim: adv.mesh.signers[victim]}
    return Scenario([], [_present(adv.relink(envelopes, position + 1, held), output)], registry)


def _other(deployer: str) -> str:
    return next(d for d in DEPLOYERS if d != deployer)


_BUILDERS: dict[Attack, Callable[[Adversary], Scenario]] = {
    Attack.HONEST: _honest,
    Attack.B1_ORPHAN: _orphan,
    Attack.B2_DELETE: _delete,
    Attack.B3_TRANSPLANT: _transplant,
    Attack.B4_MODIFY_ANCESTOR: _modify_ancestor,
    Attack.B5_FANOUT: _fanout,
    Attack.TRUNCATE: _truncate,
    Attack.SUBSTITUTE_OUTPUT: _substitute_output,
    Attack.REPLAY: _replay,
    Attack.CHILD_KEY_GRAFT: _child_key_graft,
    Attack.PARENT_KEY_REWRITE: _parent_key_rewrite,
    Attack.OWN_SUFFIX_REWRITE: _own_suffix_rewrite,
    Attack.BOTH_KEYS_FORGE: _both_keys_forge,
    Attack.REVOKED_CHILD_GRAFT: _revoked_child_graft,
}


# --- running the matrix --------------------------------------------------------------------------


def wilson_upper(successes: int, trials: int, z: float = 1.959964) -> float:
    """Upper end of the Wilson score interval (95% by default) for a binomial proportion."""
    if trials == 0:
        return 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return min(1.0, (centre + spread) / denominator)


@dataclass(frozen=True, slots=True)
class Cell:
    construction: Construction
    attack: Attack
    accepted: int
    trials: int
    reasons: dict[str, int]

    @property
    def expected_accepted(self) -> bool:
        return EXPECTED_ACCEPTED[self.attack][self.construction]

    @property
    def matches(self) -> bool:
        """An expected-accept cell must accept every trial; an expected-reject cell none."""
        return self.accepted == (self.trials if self.expected_accepted else 0)

    @property
    def wilson_upper(self) -> float:
        return wilson_upper(self.accepted, self.trials)


def run_cell(construction: Construction, attack: Attack, trials: int, mesh: SampleMesh, seed: int) -> Cell:
    """Run ``trials`` independent scenarios of one attack against one construction."""
    rng = random.Random(f"{seed}:{construction}:{attack}")  # noqa: S311 (scenario shapes, not keys)
    adversary = Adversary(construction, mesh, rng, Ed25519Signer(rng.randbytes(32)))
    policy = VerifierPolicy.unsafe_allow_baselines()
    accepted = 0
    reasons: dict[str, int] = {}
    for _ in range(trials):
        scenario = adversary.scenario(attack)
        state = InMemoryState()

        def present(p: Presentation, registry: Registry = scenario.registry, state: InMemoryState = state) -> bool:
            result = verify_path(
                p.path, p.output, registry=registry, state=state, mode=Mode.ACCEPT, now_ms=NOW_MS, policy=policy
            )
            if not result:
                key = str(result.reason)
                reasons[key] = reasons.get(key, 0) + 1
            return bool(result)

        for honest in scenario.setup:
            if not verify_path(
                honest.path,
                honest.output,
                registry=scenario.registry,
                state=state,
                mode=Mode.ACCEPT,
                now_ms=NOW_MS,
                policy=policy,
            ):
                raise HarnessError(f"{construction}/{attack}: an honest setup path was rejected")
        # Every attempt is presented (not short-circuited), so the reject reasons are all counted.
        outcomes = [present(p) for p in scenario.attempts]
        if True in outcomes:
            accepted += 1
    return Cell(construction, attack, accepted, trials, reasons)


def run_matrix(
    trials: int,
    *,
    seed: int = 2026,
    constructions: Sequence[Construction] = _ORDER,
    attacks: Sequence[Attack] = tuple(Attack),
    progress: Callable[[], None] | None = None,
) -> list[Cell]:
    """Every cell of the matrix; ``progress`` is called after each cell (for a progress bar)."""
    mesh = SampleMesh.create(DEPLOYERS, seed=b"conformance-%d" % seed)
    return [_noted(run_cell(c, a, trials, mesh, seed), progress) for a in attacks for c in constructions]


def _noted(cell: T, progress: Callable[[], None] | None) -> T:
    if progress is not None:
        progress()
    return cell


CONSTRUCTION_ORDER = _ORDER


# --- session attacks (docs/spec.md section 17) ---------------------------------------------------


class SessionAttack(enum.StrEnum):
    HONEST = "honest closed session (control)"
    REORDER = "reorder"
    DROP = "drop"
    DUPLICATE = "duplicate"
    CROSS_SESSION = "cross-session splice"
    CROSS_AGENT = "cross-agent splice"
    TRUNCATE_CLOSED = "truncate closed session"
    SUBSTITUTE_CHUNK = "substituted chunk"


SESSION_CONSTRUCTIONS = (Construction.LINKED_LIST, Construction.MERKLE, Construction.SIGNED_DAG)


@dataclass(frozen=True, slots=True)
class _SessionMaterial:
    """An agent, one of its closed streamed sessions with the chunks' bytes, the same agent's other
    session, and another agent's session of the same id (what the adversary splices from)."""

    agent: Path
    receipts: tuple[Envelope, ...]
    outputs: tuple[bytes | None, ...]
    other_session: tuple[Envelope, ...]
    other_agent: tuple[Envelope, ...]


@dataclass(frozen=True, slots=True)
class SessionCell:
    construction: Construction
    attack: SessionAttack
    accepted: int
    trials: int
    reasons: dict[str, int]

    @property
    def expected_accepted(self) -> bool:
        return self.attack is SessionAttack.HONEST

    @property
    def matches(self) -> bool:
        return self.accepted == (self.trials if self.expected_accepted else 0)

    @property
    def wilson_upper(self) -> float:
        return wilson_upper(self.accepted, self.trials)


def _session_material(construction: Construction, mesh: SampleMesh, rng: random.Random, index: int) -> _SessionMaterial:
    from countersign.records import StreamUnit

    depth = rng.randint(1, 3)
    route = [DEPLOYERS[rng.randrange(len(DEPLOYERS))] for _ in range(depth)]
    agent = Path(mesh.issue_path(construction, [*route, route[-1]], b"", now_ms=NOW_MS).envelopes[:depth])
    other = Path(mesh.issue_path(construction, [*route, route[-1]], b"", now_ms=NOW_MS).envelopes[:depth])
    chunks = rng.randint(2, 5)
    n = rng.randint(2, 8)
    data = rng.randbytes(n * chunks - rng.randint(0, n - 1))
    pieces = [data[i : i + n] for i in range(0, len(data), n)]
    session = f"session-{index}"
    stream = (StreamUnit.BYTES, n)

    def issue(on: Path, name: str) -> tuple[Envelope, ...]:
        return mesh.issue_session(on, pieces, now_ms=NOW_MS, session=name, closed=True, stream=stream)

    return _SessionMaterial(
        agent, issue(agent, session), (*pieces, None), issue(agent, session + "-b"), issue(other, session)
    )


def _session_attempt(
    attack: SessionAttack, m: _SessionMaterial, rng: random.Random
) -> tuple[list[Envelope], list[bytes | None]]:
    receipts, outputs = list(m.receipts), list(m.outputs)
    last = len(receipts) - 1  # the close receipt
    if attack is SessionAttack.REORDER:
        order = list(range(len(receipts)))
        while order == sorted(order):
            rng.shuffle(order)
        return [receipts[i] for i in order], [outputs[i] for i in order]
    if attack is SessionAttack.DROP:
        dropped = set(rng.sample(range(last), rng.randint(1, last)))
        kept = [i for i in range(len(receipts)) if i not in dropped]
        return [receipts[i] for i in kept], [outputs[i] for i in kept]
    if attack is SessionAttack.DUPLICATE:
        copied, at = rng.randint(0, last), rng.randint(0, len(receipts))
        receipts.insert(at, receipts[copied])
        outputs.insert(at, outputs[copied])
    elif attack in (SessionAttack.CROSS_SESSION, SessionAttack.CROSS_AGENT):
        source = m.other_session if attack is SessionAttack.CROSS_SESSION else m.other_agent
        at = rng.randint(0, last)
        receipts[at] = source[at]  # the same position of the other chain: its seq fits
    elif attack is SessionAttack.TRUNCATE_CLOSED:
        end = rng.randint(1, last)
        return receipts[:end], outputs[:end]
    elif attack is SessionAttack.SUBSTITUTE_CHUNK:
        at = rng.randint(0, last - 1)
        original = outputs[at]
        assert original is not None
        while outputs[at] == original:
            outputs[at] = rng.randbytes(len(original))
    return receipts, outputs


def run_session_cell(
    construction: Construction, attack: SessionAttack, trials: int, mesh: SampleMesh, seed: int, pool: int = 8
) -> SessionCell:
    """``trials`` attempts of one session attack, each on one of ``pool`` honest sessions issued for
    the cell, checked as a consumer that requires a closed session."""
    from countersign.sessions import SessionEvidence, check_session_evidence

    rng = random.Random(f"{seed}:{construction}:session:{attack}")  # noqa: S311 (scenario shapes, not keys)
    materials = [_session_material(construction, mesh, rng, i) for i in range(pool)]
    for material in materials:
        honest = SessionEvidence(material.agent, material.receipts)
        if not check_session_evidence(
            honest, material.outputs, registry=mesh.registry, now_ms=NOW_MS, require_closed=True
        ).result:
            raise HarnessError(f"{construction}/{attack}: an honest session was rejected")
    accepted = 0
    reasons: dict[str, int] = {}
    for _ in range(trials):
        material = materials[rng.randrange(pool)]
        receipts, outputs = _session_attempt(attack, material, rng)
        session = SessionEvidence(material.agent, tuple(receipts))
        result = check_session_evidence(
            session, outputs, registry=mesh.registry, now_ms=NOW_MS, require_closed=True
        ).result
        if result:
            accepted += 1
        else:
            reasons[str(result.reason)] = reasons.get(str(result.reason), 0) + 1
    return SessionCell(construction, attack, accepted, trials, reasons)


def run_session_matrix(
    trials: int,
    *,
    seed: int = 2026,
    constructions: Sequence[Construction] = SESSION_CONSTRUCTIONS,
    progress: Callable[[], None] | None = None,
) -> list[SessionCell]:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"conformance-sessions-%d" % seed)
    return [_noted(run_session_cell(c, a, trials, mesh, seed), progress) for a in SessionAttack for c in constructions]
