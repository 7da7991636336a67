"""The signer's grant and co-signing rules (countersign/cosigning.py), driven directly: no daemon,
no store, no clock. Properties hold over generated requests; examples pin each code and message."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.constructions import EdgeProposal, RecordFields, cosign, draft_record, issue
from countersign.cosigning import (
    CONSTRUCTION,
    AgentRequest,
    EarlierAnswer,
    ReceiptRequest,
    Refusal,
    SignerPolicy,
    StoredGrant,
    delegation_parent_key,
    delegation_request_refusal,
    depth_limit,
    edge_refusal,
    fanout_refusal,
    grant_request_refusal,
    local_child_refusal,
    open_grant,
    parent_cosignature,
    parent_failure,
    peer_certificate_refusal,
    peer_refusal,
    proposal_refusal,
    receipt_fields,
    record_fields,
    runtime_refusal,
    spend_grant,
)
from countersign.errors import ErrorCode
from countersign.keys import Ed25519Signer, PublicKey
from countersign.records import (
    MAX_CHILDREN_LIMIT,
    AgentRef,
    BindingScope,
    Construction,
    CoSignature,
    CoSignerRole,
    Envelope,
    LifecycleEvent,
    Path,
    Policy,
)
from countersign.samples import SampleMesh

pytestmark = pytest.mark.offline

PARENT, CHILD, OTHER, UNENROLLED = "deployer-a", "deployer-b", "deployer-c", "deployer-z"
DEPLOYERS = (PARENT, CHILD, OTHER, UNENROLLED)
MESH = SampleMesh.create((PARENT, CHILD, OTHER), seed=b"cosigning-rules")
NOW = 1_780_000_000_000
SKEW = 60_000
PARENT_TTL = 3_600_000
POLICY = SignerPolicy(
    deployer=PARENT,
    allowed_children=frozenset({CHILD}),
    max_depth=16,
    max_ttl_ms=24 * 3_600_000,
    max_grant_ttl_ms=600_000,
    clock_skew_ms=SKEW,
)
DEPTH_REFUSED = Refusal(ErrorCode.DEPTH_LIMIT, "the depth limit forbids another level here")


@dataclass(frozen=True)
class Caller:
    role: str
    deployer: str | None = None


def parent_path(
    levels: int = 1,
    *,
    allowed: tuple[str, ...] | None = None,
    root_max_depth: int | None = None,
    max_children: int = 4,
    deployer: str = PARENT,
) -> Path:
    """``levels`` records of ``deployer`` (root first): the root carries ``root_max_depth``, the leaf
    ``allowed`` as its signed ``allowed_children``."""
    envelopes: list[Envelope] = []
    for index in range(levels):
        policy = Policy(allowed if index == levels - 1 else None, root_max_depth if index == 0 else None)
        fields = RecordFields(
            deployer=deployer, agent=AgentRef(f"agent-{index}", "system-1"), created_ms=NOW - 1_000,
            expires_ms=NOW + PARENT_TTL - index, max_children=max_children, policy=policy,
        )  # fmt: skip
        envelopes.append(issue(CONSTRUCTION, fields, MESH.signers[deployer], envelopes))
    return Path(tuple(envelopes))


def child_edge(
    parent: Path,
    *,
    deployer: str = CHILD,
    created_ms: int = NOW,
    expires_ms: int | None = None,
    signer: Ed25519Signer | None = None,
    construction: Construction = CONSTRUCTION,
) -> tuple[EdgeProposal, CoSignature]:
    """A child record of ``deployer`` drafted under ``parent``, and its honest child co-signature."""
    key = signer or MESH.signers[deployer]
    fields = RecordFields(
        deployer=deployer, agent=AgentRef("child", parent.leaf.record.agent.system), created_ms=created_ms,
        expires_ms=parent.leaf.record.expires_ms if expires_ms is None else expires_ms, max_children=2,
    )  # fmt: skip
    record = draft_record(construction, fields, key.key_id, parent.envelopes)
    proposal = EdgeProposal(parent.leaf, record, MESH.signers[parent.leaf.record.deployer].key_id)
    return proposal, cosign(proposal, key, CoSignerRole.CHILD)


def decide_edge(
    parent: Path, proposal: EdgeProposal, cosig: CoSignature, policy: SignerPolicy = POLICY
) -> Refusal | None:
    return edge_refusal(policy, parent, parent.leaf.digest(), proposal, cosig, MESH.registry, NOW)


# --- the edge check ------------------------------------------------------------------------------


def deployer_sets() -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(st.sampled_from((PARENT, CHILD, OTHER)), unique=True).map(tuple)


@given(
    signer_allows=deployer_sets(),
    record_allows=st.none() | deployer_sets(),
    child=st.sampled_from((CHILD, OTHER)),
    levels=st.integers(1, 3),
    max_depth=st.integers(0, 4),
    root_max_depth=st.none() | st.integers(0, 4),
    clock_offset=st.integers(-2 * SKEW, 2 * SKEW) | st.sampled_from((-SKEW - 1, -SKEW, SKEW, SKEW + 1)),
    outlives_by=st.integers(-3, 3),
)
def test_the_edge_check_refuses_every_child_the_rules_do_not_allow_and_says_the_first_rule_broken(
    signer_allows: tuple[str, ...],
    record_allows: tuple[str, ...] | None,
    child: str,
    levels: int,
    max_depth: int,
    root_max_depth: int | None,
    clock_offset: int,
    outlives_by: int,
) -> None:
    parent = parent_path(levels, allowed=record_allows, root_max_depth=root_max_depth)
    proposal, cosig = child_edge(
        parent, deployer=child, created_ms=NOW + clock_offset, expires_ms=parent.leaf.record.expires_ms + outlives_by
    )
    policy = replace(POLICY, allowed_children=frozenset(signer_allows), max_depth=max_depth)
    limit = min(max_depth, root_max_depth if root_max_depth is not None else max_depth)
    # Every rule the edge breaks, in the order the signer checks them, with the refusal it earns.
    broken = [
        refusal
        for breaks, refusal in (
            (outlives_by > 0,
             Refusal(ErrorCode.EXPIRY_EXCEEDS_PARENT, "EXPIRY_EXCEEDS_PARENT: child outlives its parent")),
            (record_allows is not None and child not in record_allows,
             Refusal(ErrorCode.POLICY_REFUSED, f"POLICY_VIOLATION: {child} is not an allowed child")),
            (child not in signer_allows, Refusal(ErrorCode.POLICY_REFUSED, f"{PARENT} does not delegate to {child}")),
            (levels > limit, DEPTH_REFUSED),
            (abs(clock_offset) > SKEW, Refusal(
                ErrorCode.POLICY_REFUSED, "the child record's creation time is too far from this signer's clock")),
        )
        if breaks
    ]  # fmt: skip
    refusal = decide_edge(parent, proposal, cosig, policy)
    assert refusal == (broken[0] if broken else None)


def test_an_edge_that_keeps_every_rule_is_allowed() -> None:
    parent = parent_path()
    assert decide_edge(parent, *child_edge(parent)) is None


def test_the_edge_check_refuses_a_child_that_is_not_a_plain_signed_dag_draft() -> None:
    parent = parent_path()
    invalid = Refusal(ErrorCode.INVALID_ARGUMENT, "the child must be a SIGNED-DAG record without co-signatures")
    proposal, cosig = child_edge(parent, construction=Construction.NAIVE_SIG)
    assert decide_edge(parent, proposal, cosig) == invalid
    proposal, cosig = child_edge(parent)
    already_cosigned = replace(proposal, child=replace(proposal.child, cosigs=(cosig,)))
    assert decide_edge(parent, already_cosigned, cosig) == invalid


def test_the_edge_check_refuses_a_child_under_another_parent_record() -> None:
    parent, elsewhere = parent_path(), parent_path(2)
    proposal, cosig = child_edge(elsewhere)
    moved = replace(proposal, parent=parent.leaf)  # the record names another parent than the one asked
    refusal = decide_edge(parent, moved, cosig)
    assert refusal is not None and refusal.code is ErrorCode.POLICY_REFUSED
    assert refusal.message.startswith("PARENT_MISMATCH: ")


def test_the_child_cosignature_must_be_the_child_deployers_and_verify() -> None:
    parent = parent_path()
    proposal, cosig = child_edge(parent)
    not_childs = Refusal(ErrorCode.BAD_COSIGNATURE, "the child co-signature must be the child deployer's")
    assert decide_edge(parent, proposal, replace(cosig, role=CoSignerRole.PARENT)) == not_childs
    assert decide_edge(parent, proposal, replace(cosig, deployer=OTHER)) == not_childs
    _, other_edge = child_edge(parent, created_ms=NOW - 1)  # a co-signature over another edge
    assert decide_edge(parent, proposal, other_edge) == Refusal(
        ErrorCode.BAD_COSIGNATURE, "the child's co-signature over the edge manifest does not verify"
    )


def test_the_child_keys_must_be_registered() -> None:
    parent = parent_path()
    stranger = Ed25519Signer.generate()
    proposal, cosig = child_edge(parent, signer=stranger)
    assert decide_edge(parent, proposal, cosig) == Refusal(
        ErrorCode.NOT_AUTHORISED, f"child key: {stranger.key_id} is not a key of '{CHILD}'"
    )


# --- the grant spend decision --------------------------------------------------------------------

PARENT_DIGEST = "sha256:" + "a" * 64
EDGE, OTHER_EDGE = "sha256:" + "1" * 64, "sha256:" + "2" * 64
ANSWER = '{"role": "parent"}'


@dataclass(frozen=True)
class Spend:
    """One ask to spend a grant: each precondition holds unless its flag says otherwise."""

    missing: bool = False
    wrong_child: bool = False
    wrong_parent: bool = False
    spent_on: str | None = None  # the edge the grant was spent on already (None: unspent)
    answered: bool = True  # a spent grant recorded its answer
    expired: bool = False
    full: bool = False
    max_children: int = 4
    late_by: int = 1

    def decide(self) -> Refusal | EarlierAnswer | None:
        expires = NOW - self.late_by if self.expired else NOW + self.late_by - 1  # equal to now is in time
        parent = "sha256:" + "b" * 64 if self.wrong_parent else PARENT_DIGEST
        answer = ANSWER if self.spent_on is not None and self.answered else None
        grant = StoredGrant("grant-1", parent, OTHER if self.wrong_child else CHILD, expires, self.spent_on, answer)
        count = self.max_children + self.late_by - 1 if self.full else self.max_children - 1
        return spend_grant(
            None if self.missing else grant, child_deployer=CHILD, parent_digest=PARENT_DIGEST, manifest_digest=EDGE,
            max_children=self.max_children, child_count=count, now_ms=NOW,
        )  # fmt: skip


spends = st.builds(
    Spend,
    missing=st.booleans(),
    wrong_child=st.booleans(),
    wrong_parent=st.booleans(),
    spent_on=st.none() | st.sampled_from((EDGE, OTHER_EDGE)),
    answered=st.booleans(),
    expired=st.booleans(),
    full=st.booleans(),
    max_children=st.integers(1, MAX_CHILDREN_LIMIT),
    late_by=st.integers(1, 10**9),
)

SPEND_REFUSALS = {
    "missing": Refusal(ErrorCode.GRANT_NOT_FOUND, "no such grant"),
    "wrong_child": Refusal(ErrorCode.GRANT_WRONG_CHILD, f"the grant names {OTHER}, not {CHILD}"),
    "wrong_parent": Refusal(ErrorCode.GRANT_WRONG_CHILD, "the grant is for another parent record"),
    "spent_on": Refusal(ErrorCode.GRANT_USED, "the grant was already used for another edge"),
    "expired": Refusal(ErrorCode.GRANT_EXPIRED, "the grant has expired"),
}


@given(spends)
def test_a_grant_is_spent_iff_every_precondition_holds(spend: Spend) -> None:
    holds = not (spend.missing or spend.wrong_child or spend.wrong_parent or spend.spent_on or spend.expired)
    assert (spend.decide() is None) == (holds and not spend.full)


@given(spends)
def test_the_spend_decision_answers_with_the_first_precondition_broken(spend: Spend) -> None:
    decision = spend.decide()
    for flag in ("missing", "wrong_child", "wrong_parent"):
        if getattr(spend, flag):
            assert decision == SPEND_REFUSALS[flag]
            return
    if spend.spent_on is not None:
        retry = spend.spent_on == EDGE and spend.answered
        assert decision == (EarlierAnswer(ANSWER) if retry else SPEND_REFUSALS["spent_on"])
    elif spend.expired:
        assert decision == SPEND_REFUSALS["expired"]
    elif spend.full:
        assert decision == Refusal(ErrorCode.FANOUT_EXCEEDED, f"the parent already has {spend.max_children} children")
    else:
        assert decision is None


@pytest.mark.parametrize(
    ("broken", "refusal"),
    [
        *[({flag: True if flag != "spent_on" else OTHER_EDGE}, r) for flag, r in SPEND_REFUSALS.items()],
        ({"spent_on": EDGE, "answered": False}, SPEND_REFUSALS["spent_on"]),
        ({"full": True}, Refusal(ErrorCode.FANOUT_EXCEEDED, "the parent already has 4 children")),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else "",
)
def test_each_precondition_broken_alone_yields_exactly_its_code(broken: dict[str, object], refusal: Refusal) -> None:
    assert Spend(**broken).decide() == refusal  # type: ignore[arg-type]


@given(
    asks=st.lists(st.sampled_from((EDGE, OTHER_EDGE)), min_size=1, max_size=12),
    later=st.lists(st.integers(0, 2 * 600_000), min_size=12, max_size=12),
)
def test_a_grant_is_spent_once_and_a_retry_of_that_edge_gets_the_earlier_answer(
    asks: list[str], later: list[int]
) -> None:
    """The store as the servicer keeps it: a spend writes the edge and the answer and takes a slot.
    Asked again, at any later time (expired or not), the same edge gets the first answer back and
    nothing is spent again; any other edge is GRANT_USED."""
    grant, children, spent = StoredGrant("grant-1", PARENT_DIGEST, CHILD, NOW + 600_000), 0, []
    for index, edge in enumerate(asks):
        now = NOW + (sorted(later)[index] if index else 0)
        decision = spend_grant(
            grant, child_deployer=CHILD, parent_digest=PARENT_DIGEST, manifest_digest=edge, max_children=4,
            child_count=children, now_ms=now,
        )  # fmt: skip
        if decision is None:
            grant, children = replace(grant, manifest_digest=edge, parent_cosig=f"answer-{index}"), children + 1
            spent.append(edge)
        elif isinstance(decision, EarlierAnswer):
            assert (edge, decision.parent_cosig) == (asks[0], "answer-0")
        else:
            assert decision == SPEND_REFUSALS["spent_on"] and edge != asks[0]
    assert spent == [asks[0]] and children == 1


# --- opening a grant -----------------------------------------------------------------------------


@given(
    child=st.sampled_from(DEPLOYERS),
    signer_allows=st.lists(st.sampled_from(DEPLOYERS), unique=True),
    record_allows=st.none() | deployer_sets(),
    levels=st.integers(1, 3),
    max_depth=st.integers(0, 3),
    ttl_ms=st.integers(0, 10**7),
)
def test_a_grant_opens_iff_the_child_is_allowed_everywhere_enrolled_and_within_the_depth_limit(
    child: str,
    signer_allows: list[str],
    record_allows: tuple[str, ...] | None,
    levels: int,
    max_depth: int,
    ttl_ms: int,
) -> None:
    parent = parent_path(levels, allowed=record_allows)
    policy = replace(POLICY, allowed_children=frozenset(signer_allows), max_depth=max_depth)
    broken = [
        refusal
        for breaks, refusal in (
            (child == PARENT, Refusal(ErrorCode.POLICY_REFUSED, "use IssueLocalChild for a same-deployer child")),
            (child not in signer_allows, Refusal(ErrorCode.POLICY_REFUSED, f"{PARENT} does not delegate to {child}")),
            (record_allows is not None and child not in record_allows,
             Refusal(ErrorCode.POLICY_REFUSED, f"the parent record does not allow {child} as a child")),
            (child == UNENROLLED, Refusal(ErrorCode.POLICY_REFUSED, f"{child} is not an enrolled deployer")),
            (levels > max_depth, DEPTH_REFUSED),
        )
        if breaks
    ]  # fmt: skip
    outcome = open_grant(policy, parent, parent.leaf.digest(), child, ttl_ms, MESH.registry, NOW, "grant-1")
    if broken:
        assert outcome == broken[0]
    else:
        assert isinstance(outcome, StoredGrant)
        assert (outcome.grant_id, outcome.parent, outcome.child_deployer) == ("grant-1", parent.leaf.digest(), child)
        assert (outcome.manifest_digest, outcome.parent_cosig) == (None, None)  # open: not spent


@given(ttl_ms=st.integers(0, 10**8), parent_left=st.integers(1, 10**8), max_grant_ttl=st.integers(1, 10**8))
def test_a_grant_lasts_its_ttl_or_the_longest_allowed_and_never_outlives_its_parent(
    ttl_ms: int, parent_left: int, max_grant_ttl: int
) -> None:
    parent = parent_path()
    now = parent.leaf.record.expires_ms - parent_left
    policy = replace(POLICY, max_grant_ttl_ms=max_grant_ttl)
    grant = open_grant(policy, parent, parent.leaf.digest(), CHILD, ttl_ms, MESH.registry, now, "grant-1")
    assert isinstance(grant, StoredGrant)
    assert grant.expires_ms == min(now + min(ttl_ms or max_grant_ttl, max_grant_ttl), parent.leaf.record.expires_ms)


def test_a_grant_request_must_not_have_a_negative_ttl() -> None:
    assert grant_request_refusal(0) is None and grant_request_refusal(1) is None
    assert grant_request_refusal(-1) == Refusal(
        ErrorCode.INVALID_ARGUMENT, "ttl_ms must not be negative (0: the default)"
    )


# --- local children, receipts, record fields -----------------------------------------------------


@given(levels=st.integers(1, 5), max_depth=st.integers(0, 6), root_max_depth=st.none() | st.integers(0, 6))
def test_a_local_child_keeps_the_least_depth_limit_along_the_path(
    levels: int, max_depth: int, root_max_depth: int | None
) -> None:
    parent = parent_path(levels, root_max_depth=root_max_depth)
    limit = min(max_depth, max_depth if root_max_depth is None else root_max_depth)
    assert depth_limit(parent, max_depth) == limit
    refusal = local_child_refusal(replace(POLICY, max_depth=max_depth), parent)
    assert refusal == (DEPTH_REFUSED if levels > limit else None)


@given(max_children=st.integers(0, MAX_CHILDREN_LIMIT), count=st.integers(0, MAX_CHILDREN_LIMIT + 1))
def test_a_parent_takes_a_child_only_below_its_max_children(max_children: int, count: int) -> None:
    parent = replace(parent_path().leaf.record, max_children=max_children)
    expected = Refusal(ErrorCode.FANOUT_EXCEEDED, f"the parent already has {max_children} children")
    assert fanout_refusal(parent, count) == (expected if count >= max_children else None)


def agent(**changes: object) -> AgentRequest:
    return replace(AgentRequest(instance="worker", system="system-1", ttl_ms=60_000, max_children=2), **changes)


@given(
    ttl_ms=st.integers(-5, 10**9),
    max_ttl=st.integers(1, 10**9),
    ceiling=st.none() | st.integers(-1_000, 10**9),
    max_children=st.integers(-2, MAX_CHILDREN_LIMIT + 2),
)
def test_record_fields_live_within_the_ttl_caps_and_the_parent_and_refuse_what_cannot(
    ttl_ms: int, max_ttl: int, ceiling: int | None, max_children: int
) -> None:
    policy = replace(POLICY, max_ttl_ms=max_ttl)
    ceiling_ms = None if ceiling is None else NOW + ceiling
    fields = record_fields(policy, agent(ttl_ms=ttl_ms, max_children=max_children), ceiling_ms, LifecycleEvent.NEW, NOW)
    if ttl_ms <= 0:
        assert fields == Refusal(ErrorCode.INVALID_ARGUMENT, "ttl_ms must be positive")
        return
    expires = min(NOW + min(ttl_ms, max_ttl), ceiling_ms if ceiling_ms is not None else NOW + ttl_ms)
    if expires <= NOW:
        assert fields == Refusal(ErrorCode.EXPIRY_EXCEEDS_PARENT, "the parent expires before a child could be valid")
    elif not 0 <= max_children <= MAX_CHILDREN_LIMIT:
        assert fields == Refusal(ErrorCode.INVALID_ARGUMENT, "max_children out of range")
    else:
        assert isinstance(fields, RecordFields)
        assert (fields.deployer, fields.created_ms, fields.expires_ms) == (PARENT, NOW, expires)
        assert fields.max_children == max_children and fields.event is LifecycleEvent.NEW


def test_record_fields_take_the_requested_event_and_signed_policy() -> None:
    fields = record_fields(
        POLICY, agent(event="reload", allowed_children=(CHILD,), max_depth=3), None, LifecycleEvent.NEW, NOW
    )
    assert isinstance(fields, RecordFields)
    assert (fields.event, fields.policy, fields.agent) == (
        LifecycleEvent.RELOAD,
        Policy((CHILD,), 3),
        AgentRef("worker", "system-1"),
    )
    default = record_fields(POLICY, agent(), None, LifecycleEvent.BRANCH, NOW)
    assert isinstance(default, RecordFields) and (default.event, default.policy) == (LifecycleEvent.BRANCH, Policy())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"event": "rebirth"}, "unknown lifecycle event 'rebirth'"),
        ({"instance": ""}, "agent.instance"),
        ({"system": "has space"}, "agent.system"),
        ({"allowed_children": (CHILD, CHILD)}, "policy.allowed_children has duplicates"),
        ({"allowed_children": ("Not A Deployer",)}, "policy.allowed_children[]"),
        ({"max_depth": -1}, "policy.max_depth"),
    ],
)
def test_record_fields_refuse_a_malformed_agent(changes: dict[str, object], message: str) -> None:
    refusal = record_fields(POLICY, agent(**changes), None, LifecycleEvent.NEW, NOW)
    assert isinstance(refusal, Refusal) and refusal.code is ErrorCode.INVALID_ARGUMENT
    assert message in refusal.message


def test_a_receipt_takes_its_parents_instance_session_and_the_default_ttl_and_scope() -> None:
    parent = parent_path().leaf.record
    fields = receipt_fields(POLICY, parent, ReceiptRequest(b"\x01" * 32), NOW)
    assert isinstance(fields, RecordFields) and fields.output is not None
    assert (fields.agent, fields.max_children, fields.expires_ms) == (parent.agent, 0, NOW + 3_600_000)
    assert (fields.output.session, fields.output.binding_scope) == (parent.agent.instance, BindingScope.PER_TURN)
    assert (fields.output.sha256, fields.output.seq, fields.output.prev) == ("sha256:" + "01" * 32, 0, None)
    chosen = receipt_fields(POLICY, parent, ReceiptRequest(b"\x02" * 32, "per_session", "chat-7", "tool", 5), NOW)
    assert isinstance(chosen, RecordFields) and chosen.output is not None
    assert (chosen.agent.instance, chosen.expires_ms, chosen.output.session) == ("tool", NOW + 5, "chat-7")


@pytest.mark.parametrize(
    ("receipt", "message"),
    [
        (ReceiptRequest(b"\x01" * 31), "output_sha256 must be the 32 raw bytes of SHA-256"),
        (ReceiptRequest(b"\x01" * 32, binding_scope="per_year"), "unknown binding scope 'per_year'"),
        (ReceiptRequest(b"\x01" * 32, session="has space"), "output.session"),
        (ReceiptRequest(b"\x01" * 32, instance="has space"), "agent.instance"),
    ],
)
def test_a_malformed_receipt_is_refused(receipt: ReceiptRequest, message: str) -> None:
    refusal = receipt_fields(POLICY, parent_path().leaf.record, receipt, NOW)
    assert isinstance(refusal, Refusal) and refusal.code is ErrorCode.INVALID_ARGUMENT
    assert message in refusal.message


def test_a_receipt_cannot_outlive_its_parent() -> None:
    parent = parent_path().leaf.record
    refusal = receipt_fields(POLICY, parent, ReceiptRequest(b"\x01" * 32), parent.expires_ms)
    assert refusal == Refusal(ErrorCode.EXPIRY_EXCEEDS_PARENT, "the parent expires before a child could be valid")


# --- the child's side ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grant_id", "parent_key_id", "message"),
    [
        ("", "key", "grant_id is required (at most 64 characters)"),
        ("g" * 65, "key", "grant_id is required (at most 64 characters)"),
        ("g" * 64, "", "parent_key_id is required (the key the grant names)"),
    ],
)
def test_a_delegation_request_names_its_grant_and_key(grant_id: str, parent_key_id: str, message: str) -> None:
    assert delegation_request_refusal(grant_id, parent_key_id) == Refusal(ErrorCode.INVALID_ARGUMENT, message)
    assert delegation_request_refusal("g" * 64, "key") is None


def test_a_delegation_crosses_deployers_under_a_registered_parent_key() -> None:
    child_side = replace(POLICY, deployer=CHILD)
    parent = parent_path().leaf.record
    key_id = MESH.signers[PARENT].key_id
    assert delegation_parent_key(child_side, parent, key_id, MESH.registry, NOW) == PublicKey(
        MESH.signers[PARENT].public_key
    )
    assert delegation_parent_key(POLICY, parent, key_id, MESH.registry, NOW) == Refusal(
        ErrorCode.POLICY_REFUSED, "a delegation crosses deployers; use IssueLocalChild"
    )
    unknown = MESH.signers[CHILD].key_id
    assert delegation_parent_key(child_side, parent, unknown, MESH.registry, NOW) == Refusal(
        ErrorCode.PARENT_REFUSED, f"parent key: {unknown} is not a key of '{PARENT}'"
    )


def test_a_grant_keeps_the_parent_it_was_first_proposed_under() -> None:
    assert proposal_refusal(PARENT_DIGEST, PARENT_DIGEST) is None
    assert proposal_refusal(PARENT_DIGEST, "sha256:" + "b" * 64) == Refusal(
        ErrorCode.GRANT_WRONG_CHILD, "this grant was already proposed for another parent record"
    )


@given(code=st.sampled_from(list(ErrorCode)), retryable=st.booleans(), message=st.text(max_size=40))
def test_a_parent_failure_fails_the_delegation_closed_naming_the_parent_and_its_code(
    code: ErrorCode, retryable: bool, message: str
) -> None:
    refusal = parent_failure(PARENT, code, message, retryable=retryable)
    assert refusal.code is (ErrorCode.PARENT_UNREACHABLE if retryable else ErrorCode.PARENT_REFUSED)
    assert refusal.message == f"parent signer {PARENT}: {code.value}: {message}"


def test_the_parent_cosignature_is_accepted_only_from_the_parent_under_the_granted_key_over_this_edge() -> None:
    parent = parent_path()
    proposal, child_cosig = child_edge(parent)
    key = PublicKey(MESH.signers[PARENT].public_key)
    honest = cosign(proposal, MESH.signers[PARENT], CoSignerRole.PARENT)
    assert parent_cosignature(proposal, _json(honest), key) == honest
    does_not_verify = Refusal(ErrorCode.BAD_COSIGNATURE, "the parent's co-signature does not verify")
    other_proposal, _ = child_edge(parent, created_ms=NOW - 1)
    for bad in (
        child_cosig,  # the child's own
        replace(honest, role=CoSignerRole.CHILD),
        replace(honest, deployer=OTHER),
        replace(honest, key_id=MESH.signers[OTHER].key_id),  # signed by the granted key, naming another
        cosign(proposal, MESH.signers[OTHER], CoSignerRole.PARENT),  # another key than the grant named
        cosign(other_proposal, MESH.signers[PARENT], CoSignerRole.PARENT),  # another edge
    ):
        assert parent_cosignature(proposal, _json(bad), key) == does_not_verify
    malformed = parent_cosignature(proposal, '{"role": "parent"}', key)
    assert isinstance(malformed, Refusal) and malformed.code is ErrorCode.BAD_COSIGNATURE
    assert malformed.message.startswith("parent sent a malformed co-signature: ")


def _json(cosig: CoSignature) -> str:
    return json.dumps(cosig.to_json())


# --- who may ask ---------------------------------------------------------------------------------


def test_only_this_deployers_runtime_may_make_runtime_calls() -> None:
    refused = Refusal(ErrorCode.NOT_AUTHORISED, "only this deployer's runtime may ask")
    assert runtime_refusal(POLICY, Caller("runtime", PARENT)) is None
    for caller in (None, Caller("runtime", CHILD), Caller("signer", PARENT), Caller("client")):
        assert runtime_refusal(POLICY, caller) == refused


def test_only_an_enrolled_other_deployers_own_signer_may_ask_for_a_cosignature() -> None:
    assert peer_refusal(POLICY, CHILD, MESH.registry) is None
    for deployer in (PARENT, UNENROLLED):
        assert peer_refusal(POLICY, deployer, MESH.registry) == Refusal(
            ErrorCode.NOT_AUTHORISED, f"{deployer} is not an enrolled peer"
        )
    refused = Refusal(ErrorCode.NOT_AUTHORISED, "the peer certificate does not name the child deployer's signer")
    assert peer_certificate_refusal(CHILD, Caller("signer", CHILD)) is None
    for caller in (None, Caller("runtime", CHILD), Caller("signer", OTHER), Caller("verifier")):
        assert peer_certificate_refusal(CHILD, caller) == refused
