"""Operator checkpoints in the pure core (spec 7.5): the vector, the schema, the signature domain, and
the freshness rule, with property tests over logs and clocks and a mutation matrix over every field."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from countersign.admission import AdmissionLog, StatementKind, sign_statement
from countersign.canonical import b64url_encode, canonicalize, pae
from countersign.checkpoint import (
    MAX_CHECKPOINT_LIFETIME_MS,
    PAYLOAD_TYPE_REGISTRY_CHECKPOINT,
    Checkpoint,
    CheckpointError,
    SignedCheckpoint,
    check_served,
    checkpoint_of,
    covers,
    fresh,
    sign_checkpoint,
)
from countersign.errors import MalformedError
from countersign.keys import Ed25519Signer, PublicKey
from countersign.records import UnsupportedVersionError

pytestmark = pytest.mark.offline

VECTOR = json.loads((Path(__file__).parents[1] / "vectors" / "checkpoint.json").read_text())
OPERATOR = Ed25519Signer(b"\x07" * 32)


def log_of(length: int, operator: Ed25519Signer = OPERATOR) -> AdmissionLog:
    log = AdmissionLog(PublicKey(operator.public_key))
    for index in range(length):
        key = Ed25519Signer(bytes([index + 1]) * 32)
        statement = log.next_statement(
            StatementKind.ENROL_DEPLOYER, f"deployer-{index}", key.key_id, issued_ms=1_000 + index,
            public_key=b64url_encode(key.public_key), at_ms=0,
        )  # fmt: skip
        log.append(sign_statement(statement, operator))
    return log


def outcome(log: AdmissionLog, signed: SignedCheckpoint, now_ms: int) -> str:
    """What a follower holding ``log`` makes of ``signed`` at ``now_ms``: fresh, stale, or a code."""
    if signed.checkpoint.sequence > log.head_sequence:
        return "stale"  # the follower waits for the statements; it does not take the checkpoint
    try:
        check_served(log, signed, None)
    except CheckpointError as exc:
        return exc.code.value
    return "fresh" if fresh(log, signed, now_ms) else "stale"


# --- the vector -----------------------------------------------------------------------------------


def vector_log(held: int) -> AdmissionLog:
    from countersign.admission import SignedStatement

    operator = PublicKey(base64.urlsafe_b64decode(VECTOR["operator"]["public_key"] + "="))
    log = AdmissionLog(operator)
    log.extend([SignedStatement.from_bytes(canonicalize(s)) for s in VECTOR["log"][:held]])
    return log


def test_the_vector_bytes_signing_input_and_signature() -> None:
    body = Checkpoint.from_json(VECTOR["checkpoint"])
    assert canonicalize(body.to_json()).decode() == VECTOR["canonical"]
    assert body.signing_input() == pae(VECTOR["payload_type"], VECTOR["canonical"].encode())
    assert base64.b64decode(VECTOR["signing_input_base64"]) == body.signing_input()
    signed = SignedCheckpoint.from_bytes(canonicalize(VECTOR["signed_checkpoint"]))
    assert signed.digest() == VECTOR["signed_checkpoint_digest"]
    assert (body.sequence, body.head) == (len(VECTOR["log"]), VECTOR["log_digests"][-1])
    signed.verify(vector_log(2).operator_key)


@pytest.mark.parametrize("case", VECTOR["checks"], ids=lambda c: c["name"])
def test_vector_check(case: dict[str, Any]) -> None:
    signed = SignedCheckpoint.from_bytes(canonicalize(case["signed_checkpoint"]))
    assert outcome(vector_log(case["held_statements"]), signed, case["now_ms"]) == case["outcome"]


# --- the schema and the signature domain ------------------------------------------------------------


def signed_bytes(log: AdmissionLog, **changes: Any) -> bytes:
    signed = sign_checkpoint(checkpoint_of(log, issued_ms=5_000, lifetime_ms=60_000), OPERATOR)
    body = signed.to_json()
    inner = dict(body["checkpoint"])  # type: ignore[arg-type]
    inner.update(changes)
    body["checkpoint"] = inner
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"extra": 1}, MalformedError),
        ({"v": 2}, UnsupportedVersionError),
        ({"v": True}, UnsupportedVersionError),
        ({"sequence": -1}, MalformedError),
        ({"sequence": 2**53}, MalformedError),
        ({"sequence": "2"}, MalformedError),
        ({"head": None}, MalformedError),  # sequence 2 needs a head
        ({"head": "sha256:" + "A" * 64}, MalformedError),
        ({"issued_ms": 1.5}, MalformedError),
        ({"expires_ms": 5_000}, MalformedError),  # not after issued_ms
        ({"expires_ms": 5_000 + MAX_CHECKPOINT_LIFETIME_MS + 1}, MalformedError),
        ({"sequence": 0}, MalformedError),  # an empty log has a null head
    ],
    ids=repr,
)
def test_malformed_checkpoints_are_refused_at_parse(changes: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        SignedCheckpoint.from_bytes(signed_bytes(log_of(2), **changes))


def test_a_missing_field_is_refused() -> None:
    body = json.loads(signed_bytes(log_of(1)))
    del body["checkpoint"]["expires_ms"]
    with pytest.raises(MalformedError):
        SignedCheckpoint.from_bytes(json.dumps(body).encode())


# Every field changed to another valid value: the signature no longer verifies (mutation matrix).
MUTATIONS = {
    "sequence": 1,
    "head": "sha256:" + "0" * 64,
    "issued_ms": 5_001,
    "expires_ms": 65_001,
}


@pytest.mark.parametrize("field", sorted(MUTATIONS))
def test_every_field_is_covered_by_the_signature(field: str) -> None:
    log = log_of(2)
    mutated = SignedCheckpoint.from_bytes(signed_bytes(log, **{field: MUTATIONS[field]}))
    with pytest.raises(CheckpointError) as refused:
        mutated.verify(log.operator_key)
    assert refused.value.code == "BAD_STATEMENT_SIGNATURE"
    assert sorted(MUTATIONS) == sorted(set(mutated.checkpoint.to_json()) - {"v"})


def test_the_payload_type_separates_checkpoints_from_everything_else() -> None:
    body = checkpoint_of(log_of(1), issued_ms=1, lifetime_ms=10)
    payload = canonicalize(body.to_json())
    assert body.signing_input() == pae(PAYLOAD_TYPE_REGISTRY_CHECKPOINT, payload)
    assert b"registry-statement" not in body.signing_input()


def test_another_key_never_signs_a_checkpoint() -> None:
    log = log_of(1)
    impostor = sign_checkpoint(checkpoint_of(log, issued_ms=1, lifetime_ms=10), Ed25519Signer(b"\x09" * 32))
    assert outcome(log, impostor, 2) == "BAD_STATEMENT_SIGNATURE"


# --- the freshness rule, for all logs and clocks ------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 6), named=st.integers(0, 8), issued=st.integers(0, 10**12),
    lifetime=st.integers(1, MAX_CHECKPOINT_LIFETIME_MS), offset=st.integers(-10**6, 2 * MAX_CHECKPOINT_LIFETIME_MS),
)  # fmt: skip
def test_fresh_exactly_while_unexpired_and_covering(
    length: int, named: int, issued: int, lifetime: int, offset: int
) -> None:
    log, longer = log_of(length), log_of(max(length, named))
    body = checkpoint_of(
        AdmissionLog(longer.operator_key, longer.entries[:named]), issued_ms=issued, lifetime_ms=lifetime
    )
    signed = sign_checkpoint(body, OPERATOR)
    now = issued + offset
    expected = named <= length and now < issued + lifetime
    assert fresh(log, signed, now) is expected
    assert covers(log, body) is (named <= length)
    assert SignedCheckpoint.from_bytes(signed.to_bytes()) == signed


@settings(max_examples=40, deadline=None)
@given(
    held_issued=st.integers(0, 10**6),
    served_issued=st.integers(0, 10**6),
    held_seq=st.integers(0, 3),
    served_seq=st.integers(0, 3),
)
def test_an_older_checkpoint_never_replaces_a_newer(
    held_issued: int, served_issued: int, held_seq: int, served_seq: int
) -> None:
    log = log_of(3)

    def at(sequence: int, issued: int) -> SignedCheckpoint:
        prefix = AdmissionLog(log.operator_key, log.entries[:sequence])
        return sign_checkpoint(checkpoint_of(prefix, issued_ms=issued, lifetime_ms=1_000), OPERATOR)

    held, served = at(held_seq, held_issued), at(served_seq, served_issued)
    older = served_seq < held_seq or served_issued < held_issued
    if older:
        with pytest.raises(CheckpointError) as refused:
            check_served(log, served, held)
        assert refused.value.code == "ROLLBACK"
    else:
        check_served(log, served, held)


def test_the_coordinator_needs_the_exact_head() -> None:
    log = log_of(3)
    prefix = sign_checkpoint(
        checkpoint_of(AdmissionLog(log.operator_key, log.entries[:2]), issued_ms=1, lifetime_ms=10), OPERATOR
    )
    check_served(log, prefix, None)  # a follower may hold more than the checkpoint names
    with pytest.raises(CheckpointError) as refused:
        check_served(log, prefix, None, exact=True)
    assert refused.value.code == "SEQUENCE_CONFLICT"


def test_no_checkpoint_is_never_fresh() -> None:
    assert fresh(log_of(0), None, 0) is False
