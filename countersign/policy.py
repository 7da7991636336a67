"""Consumer policy: the deterministic gate a consumer puts after verification (docs/spec.md section 16).

Verification says what a path proves; a consumer policy says whether this consumer acts on it
("only these deployers, SIGNED-DAG on every cross-deployer edge, no older than an hour"). Policies
are data: a JSON document parsed strictly into the clauses below, composed with :class:`AllOf` and
:class:`AnyOf`. Evaluation is pure and total: the same path, attribution and clock always give the
same answer, and an :class:`AllOf` answers the same whatever the order of its clauses. It fails
closed: an empty composition allows nothing, a clause that cannot be proven (a closed session)
refuses, unsigned records prove no deployer or key, and the only clause that allows everything is
named :class:`UnsafeAllowAll`.

:func:`countersign.verify.verify_path` applies the policy after every check of the path and its
output and before the durable state is touched, so a path a policy refuses consumes no nonce.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

from countersign.canonical import SAFE_INTEGER_MAX, JsonValue
from countersign.errors import CountersignError, MalformedError
from countersign.reasons import Attribution
from countersign.records import (
    DEPLOYER_ID_PATTERN,
    KEY_ID_PATTERN,
    MAX_DEPTH,
    BindingScope,
    Construction,
    Path,
    parse_json,
)

POLICY_FORMAT_VERSION: Final = 1
POLICY_DOCUMENT_KEYS: Final = frozenset({"v", "policy"})
MAX_POLICY_BYTES: Final = 65_536
MAX_POLICY_NESTING: Final = 8
MAX_POLICY_CLAUSES: Final = 256
MAX_POLICY_LIST: Final = 1_024
POLICY_NAME_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class PolicyError(CountersignError, ValueError):
    """A policy document that is not well-formed (its message names the offending member)."""


@dataclass(frozen=True, slots=True)
class PolicyViolation:
    """Why a policy refuses a verified path: the failing clause, the record it concerns (``None``
    when no single record is at fault) and a sentence for people."""

    clause: str
    index: int | None
    detail: str

    def describe(self) -> str:
        """The verdict's detail: the clause name first, so that it can be read at a glance."""
        return f"{self.clause}: {self.detail}"

    def order(self) -> tuple[str, int, str]:
        """A total order on violations, so that a composition reports the same one in any order."""
        return (self.clause, -1 if self.index is None else self.index, self.detail)


class ConsumerPolicy(abc.ABC):
    """A clause of a consumer policy. Implementations are immutable values, compared by content."""

    __slots__ = ()
    clause: ClassVar[str]

    @abc.abstractmethod
    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        """The reason this policy refuses the verified ``path`` (whose ``attribution`` it is) at
        ``now_ms``, or ``None`` when it allows it. ``session_closed``: the path's leaf is one receipt
        of a verified session that ends with its close receipt (docs/spec.md 16.3); a single path
        proves no such thing. Pure: never raises for any verified path."""

    @abc.abstractmethod
    def to_json(self) -> dict[str, JsonValue]:
        """The clause as its JSON object (lists sorted, so equal policies serialise equally)."""

    def allows(self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False) -> bool:
        return self.violation(path, attribution, now_ms, session_closed=session_closed) is None

    def document(self) -> dict[str, JsonValue]:
        """The policy as a whole policy document (what :func:`parse_policy` reads)."""
        return {"v": POLICY_FORMAT_VERSION, "policy": self.to_json()}


# --- clauses ------------------------------------------------------------------------------------


def _sorted(items: Iterable[str]) -> list[JsonValue]:
    ordered: list[JsonValue] = [*sorted(items)]
    return ordered


def _unsigned(clause: str, path: Path) -> PolicyViolation | None:
    """Unsigned baseline records name a deployer and a key but prove neither: identity clauses refuse."""
    construction = path.envelopes[0].record.construction
    if construction.signed:
        return None
    return PolicyViolation(clause, 0, f"{construction} records are unsigned: they prove no deployer or key")


@dataclass(frozen=True, slots=True)
class AllowedDeployers(ConsumerPolicy):
    """Every record of the path is issued by one of ``deployers``. (The co-signers of an edge are
    its two records' deployers, so they are covered too.)"""

    deployers: frozenset[str]
    clause: ClassVar[str] = "allowed_deployers"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        unsigned = _unsigned(self.clause, path)
        if unsigned is not None:
            return unsigned
        for index, envelope in enumerate(path.envelopes):
            deployer = envelope.record.deployer
            if deployer not in self.deployers:
                return PolicyViolation(self.clause, index, f"record {index} is issued by {deployer}, not allowed")
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: _sorted(self.deployers)}


@dataclass(frozen=True, slots=True)
class AllowedKeys(ConsumerPolicy):
    """Every signature the path relies on (each record's primary signature, each co-signature) is
    made with one of ``key_ids``."""

    key_ids: frozenset[str]
    clause: ClassVar[str] = "allowed_keys"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        unsigned = _unsigned(self.clause, path)
        if unsigned is not None:
            return unsigned
        for index, envelope in enumerate(path.envelopes):
            record = envelope.record
            if record.key_id not in self.key_ids:
                return PolicyViolation(
                    self.clause, index, f"record {index} is signed with {record.key_id}, not an allowed key"
                )
            for cosig in record.cosigs:
                if cosig.key_id not in self.key_ids:
                    return PolicyViolation(
                        self.clause, index, f"the {cosig.role} co-signature of record {index} uses {cosig.key_id}"
                    )
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: _sorted(self.key_ids)}


@dataclass(frozen=True, slots=True)
class MaxDepth(ConsumerPolicy):
    """The emitter sits at most ``max_depth`` delegations below the root."""

    max_depth: int
    clause: ClassVar[str] = "max_depth"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        depth = attribution.emitter.index
        if depth > self.max_depth:
            return PolicyViolation(self.clause, depth, f"the emitter is at depth {depth}, beyond {self.max_depth}")
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: self.max_depth}


@dataclass(frozen=True, slots=True)
class CrossDeployerConstruction(ConsumerPolicy):
    """Every cross-deployer edge is of one of ``constructions`` (say SIGNED-DAG: both deployers
    co-signed it). Same-deployer edges are not concerned; a path without cross edges passes."""

    constructions: frozenset[Construction]
    clause: ClassVar[str] = "cross_deployer_construction"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        for edge in attribution.edges:
            if edge.cross_deployer and edge.construction not in self.constructions:
                return PolicyViolation(
                    self.clause,
                    edge.index,
                    f"the edge {edge.parent_deployer} -> {edge.deployer} at record {edge.index} is "
                    f"{edge.construction}, not one of {sorted(self.constructions)}",
                )
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: _sorted(c.value for c in self.constructions)}


@dataclass(frozen=True, slots=True)
class MaxEvidenceAge(ConsumerPolicy):
    """The output receipt (the emitter's record) was created at most ``max_age_ms`` before ``now_ms``.
    Its ``created_ms`` is issuer-asserted (spec 11.2): the clause bounds staleness, not back-dating."""

    max_age_ms: int
    clause: ClassVar[str] = "max_evidence_age_ms"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        age = now_ms - attribution.emitter.created_ms
        if age > self.max_age_ms:
            return PolicyViolation(
                self.clause, attribution.emitter.index, f"the output receipt is {age} ms old, beyond {self.max_age_ms}"
            )
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: self.max_age_ms}


@dataclass(frozen=True, slots=True)
class RequireClosedSession(ConsumerPolicy):
    """The emitter's session is proven closed (no output can follow the one presented).

    Only a verified session that ends with its close receipt proves that (docs/spec.md 17.2), so the
    clause allows a receipt of such a session and refuses every single path: one receipt, even a
    close receipt shown alone, proves nothing of the receipts around it. It fails closed rather than
    pass unproven."""

    clause: ClassVar[str] = "require_closed_session"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        if session_closed:
            return None
        emitter = attribution.emitter
        return PolicyViolation(
            self.clause,
            emitter.index,
            f"session {emitter.session} is not proven closed (only a closed session verified whole proves it)",
        )

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: True}


@dataclass(frozen=True, slots=True)
class AllowedBindingScopes(ConsumerPolicy):
    """The output receipt binds its bytes in one of ``scopes`` (per session, turn, tool call, ...)."""

    scopes: frozenset[BindingScope]
    clause: ClassVar[str] = "allowed_binding_scopes"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        emitter = attribution.emitter
        if emitter.binding_scope not in self.scopes:
            return PolicyViolation(
                self.clause,
                emitter.index,
                f"the output is bound {emitter.binding_scope}, not one of {sorted(self.scopes)}",
            )
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: _sorted(s.value for s in self.scopes)}


@dataclass(frozen=True, slots=True)
class AllOf(ConsumerPolicy):
    """Every policy of ``policies`` allows the path. Empty: allows nothing (fails closed).

    All clauses are evaluated and the smallest violation (by clause name, index, detail) is
    reported, so the answer does not depend on the order the clauses are listed in.
    """

    policies: tuple[ConsumerPolicy, ...]
    clause: ClassVar[str] = "all_of"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        if not self.policies:
            return PolicyViolation(self.clause, None, "an empty all_of allows nothing (fails closed)")
        found = [
            v
            for p in self.policies
            if (v := p.violation(path, attribution, now_ms, session_closed=session_closed)) is not None
        ]
        return min(found, key=PolicyViolation.order) if found else None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: [p.to_json() for p in self.policies]}


@dataclass(frozen=True, slots=True)
class AnyOf(ConsumerPolicy):
    """At least one policy of ``policies`` allows the path. Empty: allows nothing (fails closed).

    When every alternative refuses, a single alternative's violation is reported as it is; several
    are reported together (sorted) under ``any_of``.
    """

    policies: tuple[ConsumerPolicy, ...]
    clause: ClassVar[str] = "any_of"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        if not self.policies:
            return PolicyViolation(self.clause, None, "an empty any_of allows nothing (fails closed)")
        found = []
        for policy in self.policies:
            refused = policy.violation(path, attribution, now_ms, session_closed=session_closed)
            if refused is None:
                return None
            found.append(refused)
        if len(found) == 1:
            return found[0]
        reasons = "; ".join(v.describe() for v in sorted(found, key=PolicyViolation.order))
        return PolicyViolation(self.clause, None, f"no alternative allows the path ({reasons})")

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: [p.to_json() for p in self.policies]}


@dataclass(frozen=True, slots=True)
class UnsafeAllowAll(ConsumerPolicy):
    """Allows every verified path: a policy that checks nothing, named so that nobody mistakes it
    for a gate. (Verification itself still applies in full.)"""

    clause: ClassVar[str] = "unsafe_allow_all"

    def violation(
        self, path: Path, attribution: Attribution, now_ms: int, *, session_closed: bool = False
    ) -> PolicyViolation | None:
        return None

    def to_json(self) -> dict[str, JsonValue]:
        return {self.clause: True}


# --- parsing ------------------------------------------------------------------------------------


def clause_identity(policy: ConsumerPolicy) -> object:
    """What makes two clauses the same (docs/spec.md 16.1): their JSON with every list read as a set,
    since no list's order carries meaning (member lists are sorted by ``to_json``; a composition's
    clauses are distinct, so they form a set too). Equal identities: a repeat in a list."""
    if isinstance(policy, AllOf | AnyOf):
        return (policy.clause, frozenset(clause_identity(p) for p in policy.policies))
    return json.dumps(policy.to_json(), sort_keys=True, separators=(",", ":"))


_E = TypeVar("_E")


def parse_policy(data: bytes | str) -> ConsumerPolicy:
    """Parse a policy document (``{"v": 1, "policy": <clause>}``, strict JSON). Raises PolicyError."""
    try:
        value = parse_json(data, max_bytes=MAX_POLICY_BYTES)
    except MalformedError as exc:
        raise PolicyError(f"policy is not valid JSON: {exc}") from None
    return policy_from_json(value)


def policy_from_json(value: object) -> ConsumerPolicy:
    """A policy document already decoded from JSON. Raises PolicyError."""
    if type(value) is not dict or value.keys() != POLICY_DOCUMENT_KEYS:
        raise PolicyError(f"a policy document is an object with exactly the fields {sorted(POLICY_DOCUMENT_KEYS)}")
    if type(value["v"]) is not int or value["v"] != POLICY_FORMAT_VERSION:
        raise PolicyError(f"policy.v must be {POLICY_FORMAT_VERSION}")
    budget = [MAX_POLICY_CLAUSES]
    return _clause(value["policy"], "policy", 0, budget)


def _clause(value: object, where: str, nesting: int, budget: list[int]) -> ConsumerPolicy:
    if type(value) is not dict or len(value) != 1:
        raise PolicyError(f"{where} must be an object with exactly one clause, one of {CLAUSE_NAMES}")
    budget[0] -= 1
    if budget[0] < 0:
        raise PolicyError(f"a policy holds at most {MAX_POLICY_CLAUSES} clauses")
    ((name, argument),) = value.items()
    here = f"{where}.{name}"
    composition = _COMPOSITIONS.get(name)
    if composition is not None:
        if nesting >= MAX_POLICY_NESTING:
            raise PolicyError(f"{here}: compositions nest at most {MAX_POLICY_NESTING} deep")
        if type(argument) is not list:
            raise PolicyError(f"{here} must be a list of clauses")
        clauses = tuple(_clause(item, f"{here}[{i}]", nesting + 1, budget) for i, item in enumerate(argument))
        first_of: dict[object, int] = {}
        for i, clause in enumerate(clauses):
            earlier = first_of.setdefault(clause_identity(clause), i)
            if earlier != i:
                raise PolicyError(f"{here}[{i}] repeats {here}[{earlier}]: a list holds distinct clauses")
        return composition(clauses)
    parser = _PARSERS.get(name)
    if parser is None:
        raise PolicyError(f"{where}: unknown clause {name!r}; clauses are {CLAUSE_NAMES}")
    return parser(argument, here)


def _true(value: object, where: str) -> None:
    # ``false`` would be a clause that silently checks nothing: leave the clause out instead.
    if value is not True:
        raise PolicyError(f"{where} must be true (omit the clause to drop it)")


def _integer(value: object, where: str, high: int) -> int:
    if type(value) is not int or not 0 <= value <= high:
        raise PolicyError(f"{where} must be an integer in [0, {high}]")
    return value


def _members(value: object, where: str, read: Callable[[Any], _E | None]) -> frozenset[_E]:
    """A list of distinct items, each read by ``read`` (``None``: not a valid item)."""
    if type(value) is not list or len(value) > MAX_POLICY_LIST:
        raise PolicyError(f"{where} must be a list of at most {MAX_POLICY_LIST} items")
    items = []
    for item in value:
        parsed = read(item) if type(item) is str else None
        if parsed is None:
            raise PolicyError(f"{where}: {item!r} is not a valid item")
        items.append(parsed)
    members = frozenset(items)
    if len(members) != len(items):
        raise PolicyError(f"{where} lists an item twice")
    return members


def _pattern(pattern: re.Pattern[str]) -> Callable[[str], str | None]:
    return lambda text: text if pattern.fullmatch(text) else None


def _enum_member(kind: Iterable[_E]) -> Callable[[str], _E | None]:
    members = {str(member): member for member in kind}
    return members.get


def _closed_session(value: object, where: str) -> ConsumerPolicy:
    _true(value, where)
    return RequireClosedSession()


def _allow_all(value: object, where: str) -> ConsumerPolicy:
    _true(value, where)
    return UnsafeAllowAll()


_PARSERS: dict[str, Callable[[object, str], ConsumerPolicy]] = {
    AllowedDeployers.clause: lambda v, w: AllowedDeployers(_members(v, w, _pattern(DEPLOYER_ID_PATTERN))),
    AllowedKeys.clause: lambda v, w: AllowedKeys(_members(v, w, _pattern(KEY_ID_PATTERN))),
    MaxDepth.clause: lambda v, w: MaxDepth(_integer(v, w, MAX_DEPTH)),
    CrossDeployerConstruction.clause: lambda v, w: CrossDeployerConstruction(
        _members(v, w, _enum_member(Construction))
    ),
    MaxEvidenceAge.clause: lambda v, w: MaxEvidenceAge(_integer(v, w, SAFE_INTEGER_MAX)),
    RequireClosedSession.clause: _closed_session,
    AllowedBindingScopes.clause: lambda v, w: AllowedBindingScopes(_members(v, w, _enum_member(BindingScope))),
    UnsafeAllowAll.clause: _allow_all,
}
_COMPOSITIONS: dict[str, Callable[[tuple[ConsumerPolicy, ...]], ConsumerPolicy]] = {
    AllOf.clause: AllOf,
    AnyOf.clause: AnyOf,
}
CLAUSE_NAMES: Final = sorted((*_PARSERS, *_COMPOSITIONS))
