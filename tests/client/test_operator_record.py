"""What the operator's side keeps (spec 7.5, issue 29): every statement it signs or submits, so that no
checkpoint vouches for a log without one of them, whichever command signed or submitted it.

The checkpoint loop against a withholding coordinator, with real daemons, is in
tests/mesh/test_dishonest_coordinator.py; here the record itself and the offline signing command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.admission import AdmissionLog, SignedStatement, StatementKind, sign_statement
from countersign.canonical import b64url_encode
from countersign.client.errors import ServiceError
from countersign.client.operator import KnownHead, check_chains_onto, check_reaches
from countersign.keys import Ed25519Signer, PublicKey
from countersign_cli.main import main

pytestmark = pytest.mark.offline

OPERATOR = Ed25519Signer.generate()
DEPLOYERS = [Ed25519Signer.generate() for _ in range(8)]


def chain(length: int, *, fork_at: int | None = None) -> list[SignedStatement]:
    """``length`` enrolments signed by OPERATOR, each onto the one before; ``fork_at``: from there on a
    different chain (another note), as a second statement signed at the same position would make."""
    log = AdmissionLog(PublicKey(OPERATOR.public_key))
    signed: list[SignedStatement] = []
    for position in range(length):
        key = DEPLOYERS[position]
        note = "fork" if fork_at is not None and position >= fork_at else None
        statement = log.next_statement(
            StatementKind.ENROL_DEPLOYER, f"deployer-{position}", key.key_id, issued_ms=1_000 + position,
            public_key=b64url_encode(key.public_key), at_ms=0, note=note,
        )  # fmt: skip
        signed.append(sign_statement(statement, OPERATOR))
        log.append(signed[-1])
    return signed


def served(statements: list[SignedStatement]) -> AdmissionLog:
    log = AdmissionLog(PublicKey(OPERATOR.public_key))
    log.extend(statements)
    return log


MAIN = chain(6)
FORKS = {position: chain(6, fork_at=position) for position in range(6)}


@given(
    recorded=st.sets(st.integers(0, 5), min_size=1),
    length=st.integers(0, 6),
    fork_at=st.one_of(st.none(), st.integers(0, 5)),
)
def test_no_checkpoint_for_a_served_log_without_a_statement_the_operator_signed(
    recorded: set[int], length: int, fork_at: int | None
) -> None:
    """For every set of recorded statements and every served log (a prefix of the chain, or of a fork
    of it): the loop's check passes exactly when the served log holds each recorded one at its position."""
    known = KnownHead()
    for position in sorted(recorded):
        known.record(MAIN[position])
    log = (MAIN if fork_at is None else FORKS[fork_at])[:length]
    holds_all = all(p < length and (fork_at is None or p < fork_at) for p in recorded)
    if holds_all:
        check_reaches(served(log), known)
    else:
        with pytest.raises(ServiceError) as refused:
            check_reaches(served(log), known)
        assert refused.value.code == "NOT_SERVED"


def test_a_second_statement_at_a_recorded_position_is_refused_unless_it_names_the_one_it_replaces() -> None:
    known = KnownHead()
    known.record(MAIN[0])
    known.record(MAIN[0])  # the same statement again: submitted after it was signed
    with pytest.raises(ServiceError) as conflict:
        known.record(FORKS[0][0])
    assert conflict.value.code == "SEQUENCE_CONFLICT"
    known.record(MAIN[1])
    with pytest.raises(ServiceError) as off_chain:
        known.record(FORKS[1][2])  # chains onto a statement 1 the operator did not sign
    assert off_chain.value.code == "CHAIN_MISMATCH"
    known.record(FORKS[0][0], replaces=MAIN[0].digest())
    assert known.statements() == {0: FORKS[0][0].digest(), 1: MAIN[1].digest()}


def test_signing_onto_a_log_needs_every_recorded_statement_below_and_a_free_position() -> None:
    known = KnownHead()
    known.record(MAIN[0])
    known.record(MAIN[1])
    check_chains_onto(served(MAIN[:2]), known, 2)
    with pytest.raises(ServiceError) as lacking:
        check_chains_onto(served(MAIN[:1]), known, 1)  # statement 1 is recorded: refused as taken
    assert lacking.value.code == "SEQUENCE_CONFLICT"
    check_chains_onto(served(MAIN[:1]), known, 1, replaces=MAIN[1].digest())
    with pytest.raises(ServiceError) as behind:
        check_chains_onto(served(FORKS[0][:2]), known, 2)  # a log that lacks statement 0 as signed
    assert behind.value.code == "NOT_SERVED"


def test_the_record_is_one_file_shared_by_every_command_and_reads_an_earlier_release(tmp_path: Path) -> None:
    path = tmp_path / "operator.head.json"
    KnownHead(path).record(MAIN[0])
    KnownHead(path).record(MAIN[1])
    assert KnownHead(path).statements() == {0: MAIN[0].digest(), 1: MAIN[1].digest()}
    body = json.loads(path.read_text())
    assert (body["sequence"], body["head"]) == (2, MAIN[1].digest())
    path.write_text(json.dumps({"sequence": 3, "head": MAIN[2].digest()}))  # an earlier release's file
    assert KnownHead(path).get() == (3, MAIN[2].digest())
    with pytest.raises(ServiceError):
        check_reaches(served(MAIN[:2]), KnownHead(path))
    path.write_text("{not json")
    with pytest.raises(ServiceError) as unusable:
        KnownHead(path).statements()
    assert unusable.value.code == "INVALID_ARGUMENT"


def test_signing_offline_records_the_statement_and_refuses_a_second_one_at_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "operator.jwk"
    assert main(["operator", "init", "--out", str(key)]) == 0
    capsys.readouterr()
    deployer = b64url_encode(DEPLOYERS[0].public_key)
    enrol = ["operator", "enrol", "--key", str(key), "--deployer", "deployer-a", f"--public-key={deployer}"]
    assert main([*enrol, "--first", "--out", str(tmp_path / "s0.json")]) == 0
    first = json.loads(capsys.readouterr().out)
    head_file = key.with_suffix(".head.json")
    assert KnownHead(head_file).statements() == {0: first["digest"]}

    # Signed again onto the empty log: it could never be served beside the first.
    assert main([*enrol, "--first", "--out", str(tmp_path / "again.json")]) == 2
    assert "SEQUENCE_CONFLICT" in capsys.readouterr().err
    assert not (tmp_path / "again.json").exists()
    # Unless the operator names the first as abandoned: then the record holds the new one only.
    assert main([*enrol, "--first", "--out", str(tmp_path / "again.json"), "--replaces", first["digest"]]) == 0
    again = json.loads(capsys.readouterr().out)
    assert KnownHead(head_file).statements() == {0: again["digest"]}
    assert SignedStatement.from_bytes((tmp_path / "again.json").read_bytes()).digest() == again["digest"]
