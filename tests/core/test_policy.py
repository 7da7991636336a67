"""Consumer policy (spec section 16): data, deterministic, failing closed, applied before the state."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.policy import (
    CLAUSE_NAMES,
    MAX_POLICY_NESTING,
    AllOf,
    AllowedBindingScopes,
    AllowedDeployers,
    AllowedKeys,
    AnyOf,
    ConsumerPolicy,
    CrossDeployerConstruction,
    MaxDepth,
    MaxEvidenceAge,
    PolicyError,
    RequireClosedSession,
    UnsafeAllowAll,
    clause_identity,
    parse_policy,
    policy_from_json,
)
from countersign.reasons import Attribution, Reason, Verdict, VerificationResult
from countersign.records import (
    MAX_DEPTH,
    AgentRef,
    BindingScope,
    Construction,
    Envelope,
    OutputReceipt,
    Path,
    Policy,
)
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import (
    Mode,
    VerifierPolicy,
    attribute,
    presented_policy_refusal,
    refusal_after_audit,
    verify_path,
)

from .strategies import DEPLOYERS, MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

BASELINES = VerifierPolicy.unsafe_allow_baselines()
KEYS = tuple(sorted(s.key_id for s in MESH.signers.values()))


# --- strategies ---------------------------------------------------------------------------------


def _subsets(items: Sequence[object]) -> st.SearchStrategy[frozenset]:  # type: ignore[type-arg]
    return st.frozensets(st.sampled_from(list(items)))


leaf_policies: st.SearchStrategy[ConsumerPolicy] = st.one_of(
    _subsets(DEPLOYERS).map(AllowedDeployers),
    _subsets(KEYS).map(AllowedKeys),
    st.integers(0, MAX_DEPTH).map(MaxDepth),
    _subsets(list(Construction)).map(CrossDeployerConstruction),
    st.integers(0, 2 * 10**6).map(MaxEvidenceAge),
    st.just(RequireClosedSession()),
    _subsets(list(BindingScope)).map(AllowedBindingScopes),
    st.just(UnsafeAllowAll()),
)
policies: st.SearchStrategy[ConsumerPolicy] = st.recursive(
    leaf_policies,
    lambda inner: (
        st.lists(inner, max_size=4, unique_by=clause_identity).map(lambda ps: AllOf(tuple(ps)))
        | st.lists(inner, max_size=4, unique_by=clause_identity).map(lambda ps: AnyOf(tuple(ps)))
    ),
    max_leaves=12,
)


@st.composite
def evidence(draw: st.DrawFn) -> tuple[Path, Attribution, int]:
    """A verified path, its attribution, and a clock at which it verifies."""
    path, _ = draw(valid_paths())
    return path, attribute(path, 0), NOW_MS + draw(st.integers(-60_000, 60_000))


# --- composition laws ---------------------------------------------------------------------------


@given(evidence())
def test_empty_compositions_refuse_every_path(case: tuple[Path, Attribution, int]) -> None:
    for empty in (AllOf(()), AnyOf(())):
        found = empty.violation(*case)
        assert found is not None
        assert found.clause == empty.clause
        assert "fails closed" in found.detail or "allows nothing" in found.detail


@given(policies, evidence())
def test_a_composition_of_one_is_that_policy(policy: ConsumerPolicy, case: tuple[Path, Attribution, int]) -> None:
    alone = policy.violation(*case)
    assert AllOf((policy,)).violation(*case) == alone
    assert AnyOf((policy,)).violation(*case) == alone


@given(st.lists(policies, min_size=1, max_size=5), st.randoms(use_true_random=False), evidence())
def test_all_of_is_deterministic_and_independent_of_clause_order(
    clauses: list[ConsumerPolicy], shuffler: object, case: tuple[Path, Attribution, int]
) -> None:
    shuffled = list(clauses)
    shuffler.shuffle(shuffled)  # type: ignore[attr-defined]
    first = AllOf(tuple(clauses)).violation(*case)
    assert AllOf(tuple(clauses)).violation(*case) == first  # the same inputs, the same answer
    assert AllOf(tuple(shuffled)).violation(*case) == first
    # AllOf allows exactly when each clause does; AnyOf when one does (and answers alike in any order).
    allowed = [c.violation(*case) is None for c in clauses]
    assert (first is None) is all(allowed)
    assert (AnyOf(tuple(clauses)).violation(*case) is None) is any(allowed)
    assert AnyOf(tuple(shuffled)).violation(*case) == AnyOf(tuple(clauses)).violation(*case)


@given(evidence())
def test_unsafe_allow_all_allows_and_a_closed_session_is_never_proven(case: tuple[Path, Attribution, int]) -> None:
    assert UnsafeAllowAll().violation(*case) is None
    refused = RequireClosedSession().violation(*case)
    assert refused is not None and refused.clause == "require_closed_session"
    assert refused.index == len(case[0]) - 1


@given(policies)
def test_a_policy_round_trips_through_its_json_document(policy: ConsumerPolicy) -> None:
    document = policy.document()
    assert policy_from_json(document) == policy
    assert parse_policy(json.dumps(document)) == policy
    assert parse_policy(json.dumps(document)).document() == document


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 70) | st.sampled_from(["signed-dag", "deployer-a", "per_turn", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from([*CLAUSE_NAMES, "v", "policy", "other"]), inner, max_size=2)
    ),
    max_leaves=10,
)


@given(policies, st.sampled_from(["all_of", "any_of"]))
def test_a_list_that_repeats_a_clause_is_refused(policy: ConsumerPolicy, composition: str) -> None:
    """Spec 16.1: lists hold distinct items. Issue 29: a repeated clause inside all_of loaded."""
    clause = policy.to_json()
    with pytest.raises(PolicyError, match=r"\[1\] repeats .*\[0\]"):
        policy_from_json({"v": 1, "policy": {composition: [clause, clause]}})
    assert policy_from_json({"v": 1, "policy": {composition: [clause]}}) is not None


@given(JSON)
def test_any_json_is_a_policy_or_a_policy_error(value: object) -> None:
    for candidate in (value, {"v": 1, "policy": value}):
        try:
            parsed = policy_from_json(candidate)
        except PolicyError:
            continue
        assert isinstance(parsed, ConsumerPolicy)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("", "not valid JSON"),
        ('{"v":1,"policy":{"max_depth":1.0}}', "floats are not allowed"),
        ('{"v":1,"policy":{"max_depth":1},"policy":{"max_depth":2}}', "duplicate"),
        ('{"policy":{"max_depth":1}}', "exactly the fields"),
        ('{"v":2,"policy":{"max_depth":1}}', "policy.v must be 1"),
        ('{"v":1,"policy":{}}', "exactly one clause"),
        ('{"v":1,"policy":{"max_depth":1,"allowed_keys":[]}}', "exactly one clause"),
        ('{"v":1,"policy":{"maxdepth":1}}', "unknown clause 'maxdepth'"),
        ('{"v":1,"policy":{"max_depth":64}}', "policy.max_depth must be an integer in [0, 63]"),
        ('{"v":1,"policy":{"max_depth":true}}', "policy.max_depth must be an integer"),
        ('{"v":1,"policy":{"max_evidence_age_ms":-1}}', "max_evidence_age_ms must be an integer"),
        ('{"v":1,"policy":{"allowed_deployers":"deployer-a"}}', "must be a list"),
        ('{"v":1,"policy":{"allowed_deployers":["Deployer-A"]}}', "'Deployer-A' is not a valid item"),
        ('{"v":1,"policy":{"allowed_deployers":["deployer-a","deployer-a"]}}', "lists an item twice"),
        ('{"v":1,"policy":{"allowed_keys":["ed25519:00"]}}', "is not a valid item"),
        ('{"v":1,"policy":{"cross_deployer_construction":["SIGNED-DAG"]}}', "is not a valid item"),
        ('{"v":1,"policy":{"allowed_binding_scopes":["per_day"]}}', "is not a valid item"),
        ('{"v":1,"policy":{"require_closed_session":false}}', "must be true (omit the clause"),
        ('{"v":1,"policy":{"unsafe_allow_all":1}}', "unsafe_allow_all must be true"),
        ('{"v":1,"policy":{"all_of":{"max_depth":1}}}', "policy.all_of must be a list"),
        ('{"v":1,"policy":{"any_of":[{"max_depth":1},{"nope":1}]}}', "policy.any_of[1]: unknown clause"),
        (
            '{"v":1,"policy":{"all_of":[{"unsafe_allow_all":true},{"unsafe_allow_all":true}]}}',
            "policy.all_of[1] repeats policy.all_of[0]",
        ),
        (
            '{"v":1,"policy":{"any_of":[{"max_depth":1},{"max_depth":2},{"max_depth":1}]}}',
            "policy.any_of[2] repeats policy.any_of[0]",
        ),
        (  # the same set of deployers, listed in another order
            '{"v":1,"policy":{"any_of":[{"allowed_deployers":["a","b"]},{"allowed_deployers":["b","a"]}]}}',
            "policy.any_of[1] repeats policy.any_of[0]",
        ),
        (  # the same composition, its clauses in another order
            '{"v":1,"policy":{"all_of":[{"any_of":[{"max_depth":1},{"max_depth":2}]},'
            '{"any_of":[{"max_depth":2},{"max_depth":1}]}]}}',
            "policy.all_of[1] repeats policy.all_of[0]",
        ),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_member(document: str, message: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(document)
    assert message in str(raised.value)


def test_policies_are_bounded_in_nesting_and_size() -> None:
    nested: object = {"max_depth": 1}
    for _ in range(MAX_POLICY_NESTING + 1):
        nested = {"all_of": [nested]}
    with pytest.raises(PolicyError, match="nest at most"):
        policy_from_json({"v": 1, "policy": nested})
    with pytest.raises(PolicyError, match="at most 256 clauses"):
        policy_from_json({"v": 1, "policy": {"any_of": [{"max_depth": 1}] * 300}})
    with pytest.raises(PolicyError, match="not valid JSON"):
        parse_policy(b" " * 70_000)


# --- the mutation matrix: each clause, violated alone, is named ----------------------------------

MATRIX = SampleMesh.create([f"deployer-{c}" for c in "abcde"], seed=b"policy-matrix")
KEY = {d: s.key_id for d, s in MATRIX.signers.items()}
OUTPUT = b"the gated output\n"
BASE_ROUTE = ("deployer-a", "deployer-b", "deployer-b", "deployer-c")


def issue_route(
    route: Sequence[str],
    *,
    construction: Construction = Construction.SIGNED_DAG,
    scope: BindingScope = BindingScope.PER_TURN,
) -> Path:
    envelopes: list[Envelope] = []
    for index, deployer in enumerate(route):
        leaf = index == len(route) - 1
        fields = RecordFields(
            deployer=deployer,
            agent=AgentRef(f"agent-{index}", "matrix-system"),
            created_ms=NOW_MS - 1_000,
            expires_ms=NOW_MS + 3_600_000 - index,
            policy=Policy(),
            output=OutputReceipt(sha256_digest(OUTPUT), scope, "matrix-session", 0, None) if leaf else None,
        )
        parent = MATRIX.signers[envelopes[-1].record.deployer] if envelopes else None
        envelopes.append(
            issue(
                construction,
                fields,
                MATRIX.signers[deployer],
                envelopes,
                parent_key_id=None if parent is None else parent.key_id,
                parent_cosigner=None if parent is None else local_parent_cosigner(parent),
            )
        )
    return Path(tuple(envelopes))


# Deployer e's key is allowed but e is not an allowed deployer; deployer d is allowed, its key is not:
# so each identity clause can be broken while the other holds.
CLAUSES: dict[str, ConsumerPolicy] = {
    "allowed_deployers": AllowedDeployers(frozenset({"deployer-a", "deployer-b", "deployer-c", "deployer-d"})),
    "allowed_keys": AllowedKeys(
        frozenset({KEY["deployer-a"], KEY["deployer-b"], KEY["deployer-c"], KEY["deployer-e"]})
    ),
    "max_depth": MaxDepth(3),
    "cross_deployer_construction": CrossDeployerConstruction(frozenset({Construction.SIGNED_DAG})),
    "max_evidence_age_ms": MaxEvidenceAge(600_000),
    "allowed_binding_scopes": AllowedBindingScopes(frozenset({BindingScope.PER_TURN})),
}
# clause -> (a path and a clock that break that clause and no other)
MUTANTS: dict[str, tuple[Path, int]] = {
    "allowed_deployers": (issue_route(("deployer-a", "deployer-b", "deployer-b", "deployer-e")), NOW_MS),
    "allowed_keys": (issue_route(("deployer-a", "deployer-b", "deployer-b", "deployer-d")), NOW_MS),
    "max_depth": (issue_route((*BASE_ROUTE, "deployer-c")), NOW_MS),
    "cross_deployer_construction": (issue_route(BASE_ROUTE, construction=Construction.LINKED_LIST), NOW_MS),
    "max_evidence_age_ms": (issue_route(BASE_ROUTE), NOW_MS + 700_000),
    "allowed_binding_scopes": (issue_route(BASE_ROUTE, scope=BindingScope.PER_TOOL_CALL), NOW_MS),
    # no path satisfies it: the base path, which satisfies every other clause, is refused by it alone
    "require_closed_session": (issue_route(BASE_ROUTE), NOW_MS),
}
EVERY_CLAUSE = AllOf((*CLAUSES.values(), RequireClosedSession()))


def gate(
    path: Path, policy: ConsumerPolicy, *, now_ms: int = NOW_MS, state: InMemoryState | None = None
) -> VerificationResult:
    return verify_path(
        path,
        OUTPUT,
        registry=MATRIX.registry,
        state=state or InMemoryState(),
        mode=Mode.ACCEPT,
        now_ms=now_ms,
        consumer_policy=policy,
    )


def test_the_base_path_satisfies_every_satisfiable_clause() -> None:
    result = gate(issue_route(BASE_ROUTE), AllOf(tuple(CLAUSES.values())))
    assert result.verdict is Verdict.ACCEPT, result


@pytest.mark.parametrize("clause", sorted(MUTANTS))
def test_a_path_that_breaks_one_clause_is_refused_naming_it(clause: str) -> None:
    path, now = MUTANTS[clause]
    others = AllOf(tuple(p for name, p in CLAUSES.items() if name != clause))
    assert gate(path, others, now_ms=now).verdict is Verdict.ACCEPT, "the mutant must satisfy every other clause"
    for policy in (EVERY_CLAUSE, AllOf(tuple(reversed(EVERY_CLAUSE.policies)))):
        result = gate(path, policy, now_ms=now)
        assert (result.verdict, result.reason) == (Verdict.REJECT, Reason.CONSUMER_POLICY_VIOLATION)
        assert result.detail.startswith(f"{clause}: ")
        assert result.attribution is not None  # the path itself was proven; only the policy refused it


def test_identity_clauses_refuse_unsigned_baselines() -> None:
    unsigned = MESH.issue_path(Construction.HASH_ONLY, ["deployer-a", "deployer-b"], b"o", now_ms=NOW_MS)
    for clause in (AllowedDeployers(frozenset(DEPLOYERS)), AllowedKeys(frozenset(KEYS))):
        result = verify_path(
            unsigned, b"o", registry=MESH.registry, state=InMemoryState(), mode=Mode.ACCEPT, now_ms=NOW_MS,
            policy=BASELINES, consumer_policy=clause,
        )  # fmt: skip
        assert result.reason is Reason.CONSUMER_POLICY_VIOLATION
        assert "unsigned" in result.detail


# --- the gate runs before the durable state -------------------------------------------------------


def test_a_policy_refusal_consumes_no_nonce_and_records_no_edge() -> None:
    path = issue_route(BASE_ROUTE)
    state = InMemoryState()
    refused = gate(path, RequireClosedSession(), state=state)
    assert refused.reason is Reason.CONSUMER_POLICY_VIOLATION
    assert state.entry_count() == 0
    assert gate(path, UnsafeAllowAll(), state=state).verdict is Verdict.ACCEPT
    assert gate(path, UnsafeAllowAll(), state=state).reason is Reason.NONCE_REPLAYED


def test_the_policy_is_decided_before_a_replay() -> None:
    """Order of the steps (spec 16.3): a consumed path that the policy refuses reports the policy."""
    path = issue_route(BASE_ROUTE)
    state = InMemoryState()
    assert gate(path, UnsafeAllowAll(), state=state)
    assert gate(path, MaxDepth(1), state=state).reason is Reason.CONSUMER_POLICY_VIOLATION


def test_no_policy_and_a_bad_path_are_unchanged() -> None:
    path = issue_route(BASE_ROUTE)
    rejected = verify_path(
        path, b"other", registry=MATRIX.registry, state=InMemoryState(), mode=Mode.ACCEPT, now_ms=NOW_MS,
        consumer_policy=UnsafeAllowAll(),
    )  # fmt: skip
    assert rejected.reason is Reason.OUTPUT_MISMATCH  # verification comes first; a policy loosens nothing


# --- a consumer's own policy with a verifier (spec 16.4) ------------------------------------------

MUTATIONS = ("none", "wrong output", "signature of another record", "no output section", "replayed")


def _mutated(path: Path, output: bytes, mutation: str) -> tuple[Path, bytes]:
    if mutation == "wrong output":
        return path, output + b"!"
    if mutation == "signature of another record" and path.leaf.sig is not None and len(path) > 1:
        return Path((*path.envelopes[:-1], path.leaf.with_sig(path.envelopes[0].sig))), output
    if mutation == "no output section":  # re-issued unsigned-looking: the record changes, so its signature fails
        leaf = path.leaf
        record = dataclasses.replace(leaf.record, output=None)
        return Path((*path.envelopes[:-1], Envelope.build(record, leaf.sig))), output
    return path, output


@given(valid_paths(), policies, st.sampled_from(MUTATIONS))
def test_a_policy_judged_before_an_audit_gives_the_verdict_of_the_policy_in_the_verifier(
    presented: tuple[Path, bytes], policy: ConsumerPolicy, mutation: str
) -> None:
    """Spec 16.4: judging the evidence as presented, then asking in audit mode only what the policy
    refuses (refusal_after_audit), reaches the verdict, reason, index and detail that step C in the
    verifier reaches, and leaves the state as it leaves it, over valid and mutated paths."""
    path, output = _mutated(*presented, mutation)
    inside, outside = InMemoryState(), InMemoryState()
    if mutation == "replayed":
        for state in (inside, outside):
            verify_path(path, output, registry=MESH.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW_MS,
                        policy=BASELINES)  # fmt: skip
    in_verifier = verify_path(
        path, output, registry=MESH.registry, state=inside, mode=Mode.ACCEPT, now_ms=NOW_MS, policy=BASELINES,
        consumer_policy=policy,
    )  # fmt: skip
    refusal = presented_policy_refusal(path, policy, NOW_MS)
    asked = verify_path(
        path, output, registry=MESH.registry, state=outside, mode=Mode.AUDIT if refusal is not None else Mode.ACCEPT,
        now_ms=NOW_MS, policy=BASELINES,
    )  # fmt: skip
    by_client = asked if refusal is None else refusal_after_audit(asked, refusal)
    assert (by_client.verdict, by_client.reason, by_client.index, by_client.detail) == (
        in_verifier.verdict, in_verifier.reason, in_verifier.index, in_verifier.detail,
    )  # fmt: skip
    assert by_client.attribution == in_verifier.attribution
    assert inside.entry_count() == outside.entry_count()
