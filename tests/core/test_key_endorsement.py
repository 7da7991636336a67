"""Key endorsements (spec 7.4, ADR 0026): the committed rotation vector folds to its custody chain,
every rule of endorse_key refuses its own mutation, the statement's member set is exact, and the
custody chain is continuous exactly back to the enrolment key through never-revoked keys."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from countersign.admission import (
    PAYLOAD_TYPE_KEY_ENDORSEMENT,
    AdmissionError,
    AdmissionLog,
    KeyEndorsement,
    SignedEndorsement,
    SignedStatement,
    StatementKind,
    custody_chain,
    endorse_key,
    sign_statement,
)
from countersign.canonical import b64url_decode, b64url_encode, canonicalize
from countersign.errors import MalformedError
from countersign.keys import Ed25519Signer, PublicKey

pytestmark = pytest.mark.offline

VECTOR = json.loads((Path(__file__).parents[1] / "vectors" / "rotation.json").read_text())
DEPLOYER = "deployer-a"


def vector_log(count: int) -> AdmissionLog:
    log = AdmissionLog(PublicKey(b64url_decode(VECTOR["operator_public_key"], 32)))
    log.extend([SignedStatement.from_bytes(canonicalize(s)) for s in VECTOR["log"][:count]])
    return log


def test_the_vector_folds_to_its_custody_chain() -> None:
    log = vector_log(len(VECTOR["log"]))
    assert [s.statement.kind for s in log.entries] == [
        StatementKind.ENROL_DEPLOYER, StatementKind.ADD_KEY, StatementKind.ENDORSE_KEY, StatementKind.RETIRE_KEY,
    ]  # fmt: skip
    assert custody_chain(log, DEPLOYER).to_json() == VECTOR["custody"]
    signed = SignedEndorsement.from_json(VECTOR["endorsement"])
    assert signed.endorsement.signing_input().hex() == VECTOR["endorsement_signing_input_hex"]
    assert bytes.fromhex(VECTOR["endorsement_signing_input_hex"]).startswith(
        b"DSSEv1 %d %s " % (len(PAYLOAD_TYPE_KEY_ENDORSEMENT), PAYLOAD_TYPE_KEY_ENDORSEMENT.encode())
    )
    # Each statement's bytes survive a parse (the endorsement member included).
    for statement in VECTOR["log"]:
        assert SignedStatement.from_bytes(canonicalize(statement)).to_json() == statement


@pytest.mark.parametrize("case", VECTOR["invalid_at_sequence_2"], ids=lambda c: c["why"][:40])
def test_the_vectors_invalid_endorsements_are_refused(case: dict[str, Any]) -> None:
    log = vector_log(2)
    with pytest.raises(AdmissionError) as refused:
        log.append(SignedStatement.from_bytes(canonicalize(case["signed_statement"])))
    assert refused.value.code == "INVALID_STATEMENT"
    assert log.head_sequence == 2


# --- a mutation matrix over one good endorse_key statement --------------------------------------

OPERATOR, OLD, NEW, THIRD = (Ed25519Signer(bytes([n]) * 32) for n in (1, 2, 3, 4))


def rotated(*, retire_old_at: int | None = None, revoke_old: bool = False, third: bool = False) -> AdmissionLog:
    log = AdmissionLog(PublicKey(OPERATOR.public_key))

    def add(kind: StatementKind, key: Ed25519Signer, at_ms: int) -> None:
        public = b64url_encode(key.public_key)
        log.append(sign_statement(log.next_statement(kind, DEPLOYER, key.key_id, issued_ms=at_ms, public_key=public, at_ms=at_ms), OPERATOR))  # fmt: skip  # noqa: E501

    add(StatementKind.ENROL_DEPLOYER, OLD, 100)
    add(StatementKind.ADD_KEY, NEW, 200)
    if third:
        add(StatementKind.ADD_KEY, THIRD, 300)
    if retire_old_at is not None:
        log.append(sign_statement(log.next_statement(StatementKind.RETIRE_KEY, DEPLOYER, OLD.key_id, issued_ms=400, at_ms=retire_old_at), OPERATOR))  # fmt: skip  # noqa: E501
    if revoke_old:
        log.append(sign_statement(log.next_statement(StatementKind.REVOKE_KEY, DEPLOYER, OLD.key_id, issued_ms=400), OPERATOR))  # fmt: skip  # noqa: E501
    return log


def endorse_statement(log: AdmissionLog, endorsement: SignedEndorsement | None, **fields: Any) -> SignedStatement:
    key_id = fields.pop("key_id", NEW.key_id)
    statement = log.next_statement(StatementKind.ENDORSE_KEY, DEPLOYER, key_id, issued_ms=500, endorsement=endorsement)
    return sign_statement(replace(statement, **fields), OPERATOR)


GOOD = endorse_key(OLD, DEPLOYER, PublicKey(NEW.public_key), 250)


def resigned(endorsement: KeyEndorsement, by: Ed25519Signer = OLD) -> SignedEndorsement:
    return SignedEndorsement(endorsement, b64url_encode(by.sign(endorsement.signing_input())))


MUTATIONS: dict[str, tuple[dict[str, Any], Any]] = {
    "no endorsement": ({}, None),
    "signed by the new key": ({}, resigned(GOOD.endorsement, NEW)),
    "signed by a third key": ({"third": True}, resigned(GOOD.endorsement, THIRD)),
    "signature of another body": ({}, SignedEndorsement(replace(GOOD.endorsement, issued_ms=251), GOOD.sig)),
    "names another deployer": ({}, resigned(replace(GOOD.endorsement, deployer="deployer-b"))),
    "names another new key than the statement": (
        {"third": True},
        resigned(replace(GOOD.endorsement, new_key_id=THIRD.key_id)),
    ),
    "endorses a public key other than the registered one": (
        {},
        resigned(replace(GOOD.endorsement, new_public_key=b64url_encode(THIRD.public_key))),
    ),
    "endorses itself": ({}, resigned(replace(GOOD.endorsement, old_key_id=NEW.key_id), NEW)),
    "old key unknown": ({}, resigned(replace(GOOD.endorsement, old_key_id=THIRD.key_id), THIRD)),
    "old key revoked": ({"revoke_old": True}, GOOD),
    "old key retired before it endorsed": ({"retire_old_at": 250}, GOOD),
    "endorsed before the old key was valid": ({}, resigned(replace(GOOD.endorsement, issued_ms=99))),
}


def test_the_good_endorsement_applies_and_links_the_chain() -> None:
    log = rotated(retire_old_at=251)  # retired after it endorsed: still a valid endorsement
    log.append(endorse_statement(log, GOOD))
    chain = custody_chain(log, DEPLOYER)
    assert chain.unbroken
    assert [(link.key_id, link.endorsed_by) for link in chain.links] == [(OLD.key_id, None), (NEW.key_id, OLD.key_id)]


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_rule_refuses_its_mutation(name: str) -> None:
    setup, endorsement = MUTATIONS[name]
    log = rotated(**setup)
    before = log.head_sequence
    key_id = THIRD.key_id if name.startswith("names another new key") else NEW.key_id
    with pytest.raises(AdmissionError) as refused:
        log.append(endorse_statement(log, endorsement, key_id=key_id))
    assert refused.value.code == "INVALID_STATEMENT", name
    assert log.head_sequence == before


@pytest.mark.parametrize("field", ["public_key", "at_ms"])
def test_endorse_key_carries_no_public_key_or_time_of_its_own(field: str) -> None:
    log = rotated()
    value = b64url_encode(NEW.public_key) if field == "public_key" else 5
    with pytest.raises(AdmissionError):
        log.append(endorse_statement(log, GOOD, **{field: value}))


def test_the_member_set_is_exact() -> None:
    log = rotated()
    good = endorse_statement(log, GOOD).to_json()
    assert SignedStatement.from_bytes(canonicalize(good)).to_json() == good
    without = json.loads(json.dumps(good))
    del without["statement"]["endorsement"]
    extra_inner = json.loads(json.dumps(good))
    extra_inner["statement"]["endorsement"]["endorsement"]["note"] = "x"
    other_kind = json.loads(json.dumps(good))
    other_kind["statement"]["kind"] = "add_key"  # an endorsement member on any other kind
    for bad in (without, extra_inner, other_kind):
        with pytest.raises(MalformedError):
            SignedStatement.from_bytes(canonicalize(bad))


def test_a_revoked_link_breaks_the_chain_after_it() -> None:
    """A revoked key is never continuous, and neither is what only it endorsed: its holder may
    have been anyone."""
    log = rotated(third=True)
    log.append(endorse_statement(log, GOOD))
    log.append(
        endorse_statement(log, endorse_key(NEW, DEPLOYER, PublicKey(THIRD.public_key), 350), key_id=THIRD.key_id)
    )
    assert custody_chain(log, DEPLOYER).unbroken
    log.append(
        sign_statement(log.next_statement(StatementKind.REVOKE_KEY, DEPLOYER, NEW.key_id, issued_ms=600), OPERATOR)
    )
    chain = custody_chain(log, DEPLOYER)
    assert [link.continuous for link in chain.links] == [True, False, False]
    assert not chain.unbroken
