"""The offline audit commands as a user runs them: export, registry verify, verify --registry-log
--at-evidence-time, inspect and inspect --verify."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path as FilePath

import pytest

from countersign.records import Construction, Path
from tests.audit.material import CREATED_MS, OUTPUT, cli, mesh, registry_log, sample_path, write_evidence, write_log

pytestmark = pytest.mark.daemons  # runs the command line as a child process


@pytest.fixture
def evidence(tmp_path: FilePath) -> FilePath:
    """A SIGNED-DAG path made on 2026-01-01 (long expired), its output, and the operator's log."""
    m = mesh()
    write_evidence(tmp_path, sample_path(m))
    write_log(tmp_path, registry_log(m))
    (tmp_path / "registry.json").write_text(json.dumps(m.registry.to_json()))
    return tmp_path


def verify(directory: FilePath, *extra: str) -> tuple[int, dict[str, object]]:
    result = cli(
        "verify", "--path", str(directory / "path.json"), "--output", str(directory / "output.bin"), *extra
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def log_args(directory: FilePath) -> tuple[str, ...]:
    return ("--registry-log", str(directory / "registry-log.json"), "--operator", str(directory / "operator.pub.json"))


# --- registry verify --------------------------------------------------------------------------


def test_registry_verify_checks_the_log_and_prints_the_registry(evidence: FilePath) -> None:
    result = cli("registry", "verify", "--log", str(evidence / "registry-log.json"),
                 "--operator", str(evidence / "operator.pub.json"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["verified"] is True
    assert report["statements"] == 3
    assert sorted(report["registry"]["deployers"]) == ["deployer-a", "deployer-b", "deployer-c"]


def test_registry_verify_at_a_time_shows_the_registry_then(tmp_path: FilePath) -> None:
    m = mesh()
    write_log(tmp_path, registry_log(m, revoke="deployer-b"))
    base = ("registry", "verify", "--log", str(tmp_path / "registry-log.json"),
            "--operator", str(tmp_path / "operator.pub.json"))  # fmt: skip

    def revoked(*extra: str) -> object:
        result = cli(*base, *extra)
        assert result.returncode == 0, result.stderr
        (key,) = json.loads(result.stdout)["registry"]["deployers"]["deployer-b"]["keys"]
        return key["revoked_ms"]

    assert revoked() == CREATED_MS + 86_400_000
    assert revoked("--at", "2026-01-01T12:00:00Z") is None  # the revocation was issued a day later
    assert revoked("--at", str(CREATED_MS + 86_400_000)) == CREATED_MS + 86_400_000
    before = cli(*base, "--at", "2025-01-01T00:00:00+00:00")
    assert json.loads(before.stdout)["registry"]["deployers"] == {}
    assert cli(*base, "--at", "yesterday").returncode == 2
    assert "time zone" in cli(*base, "--at", "2026-01-01T00:00:00").stderr


@pytest.mark.parametrize(
    ("tamper", "code", "position"),
    [
        ("signature", "BAD_STATEMENT_SIGNATURE", 1),
        ("drop", "SEQUENCE_CONFLICT", 1),
        ("note", "BAD_STATEMENT_SIGNATURE", 2),
        ("relink", "CHAIN_MISMATCH", 2),
    ],
)
def test_registry_verify_refuses_a_tampered_log(tmp_path: FilePath, tamper: str, code: str, position: int) -> None:
    from countersign.admission import sign_statement
    from tests.audit.material import operator

    statements = registry_log(mesh(), revoke="deployer-b")
    if tamper == "signature":
        sig = statements[1].sig
        statements[1] = replace(statements[1], sig=("A" if sig[0] != "A" else "B") + sig[1:])
    elif tamper == "drop":
        del statements[1]
    elif tamper == "note":
        statements[2] = replace(statements[2], statement=replace(statements[2].statement, note="edited"))
    else:  # re-signed by the operator, but chained to another head: the chain, not the signature, fails
        bad = replace(statements[2].statement, prev="sha256:" + "0" * 64)
        statements[2] = sign_statement(bad, operator())
    write_log(tmp_path, statements)
    result = cli("registry", "verify", "--log", str(tmp_path / "registry-log.json"),
                 "--operator", str(tmp_path / "operator.pub.json"))  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report == {"verified": False, "code": code, "at": f"statement {position}", "detail": report["detail"]}


def test_registry_verify_pins_the_given_operator_key_not_one_the_log_names(evidence: FilePath) -> None:
    from countersign.canonical import b64url_encode
    from countersign.keys import Ed25519Signer

    stranger = Ed25519Signer.generate()
    other = {"key_id": stranger.key_id, "public_key": b64url_encode(stranger.public_key)}
    (evidence / "stranger.pub.json").write_text(json.dumps(other))
    log = json.loads((evidence / "registry-log.json").read_text())
    log["operator_public_key"] = other["public_key"]
    (evidence / "registry-log.json").write_text(json.dumps(log))
    result = cli("registry", "verify", "--log", str(evidence / "registry-log.json"),
                 "--operator", str(evidence / "stranger.pub.json"))  # fmt: skip
    assert result.returncode == 1
    assert json.loads(result.stdout)["code"] == "BAD_STATEMENT_SIGNATURE"
    (evidence / "bad.pub.json").write_text(json.dumps({**other, "key_id": "ed25519:" + "0" * 32}))
    bad = cli("registry", "verify", "--log", str(evidence / "registry-log.json"),
              "--operator", str(evidence / "bad.pub.json"))  # fmt: skip
    assert bad.returncode == 2
    assert "does not match the public key" in bad.stderr


def test_registry_verify_reports_a_malformed_log_without_a_traceback(evidence: FilePath) -> None:
    log = json.loads((evidence / "registry-log.json").read_text())
    log["statements"][0]["statement"]["kind"] = "grant_everything"
    (evidence / "registry-log.json").write_text(json.dumps(log))
    result = cli("registry", "verify", "--log", str(evidence / "registry-log.json"),
                 "--operator", str(evidence / "operator.pub.json"))  # fmt: skip
    assert result.returncode == 1
    assert json.loads(result.stdout)["code"] == "INVALID_ARGUMENT"
    (evidence / "registry-log.json").write_text("[1, 2")
    assert cli("registry", "verify", "--log", str(evidence / "registry-log.json"),
               "--operator", str(evidence / "operator.pub.json")).returncode == 1  # fmt: skip


# --- verify at evidence time ----------------------------------------------------------------------


def test_old_evidence_is_expired_now_and_verifies_at_evidence_time(evidence: FilePath) -> None:
    code, now = verify(evidence, *log_args(evidence))
    assert (code, now["reason"]) == (1, "EXPIRED")
    code, then = verify(evidence, *log_args(evidence), "--at-evidence-time")
    assert (code, then["verdict"]) == (0, "ACCEPT"), then
    again = verify(evidence, *log_args(evidence), "--at-evidence-time")  # audit mode: nothing consumed
    assert again[1]["verdict"] == "ACCEPT"
    code, by_file = verify(evidence, "--registry", str(evidence / "registry.json"), "--at-evidence-time")
    assert by_file["verdict"] == "ACCEPT"


def test_revocations_made_since_still_apply_at_evidence_time(tmp_path: FilePath) -> None:
    m = mesh()
    write_evidence(tmp_path, sample_path(m))
    write_log(tmp_path, registry_log(m, revoke="deployer-b"))
    code, verdict = verify(tmp_path, *log_args(tmp_path), "--at-evidence-time")
    assert (code, verdict["reason"], verdict["index"]) == (1, "KEY_REVOKED", 1)


def test_keys_enrolled_after_the_evidence_are_not_valid_for_it(tmp_path: FilePath) -> None:
    m = mesh()
    write_evidence(tmp_path, sample_path(m))
    write_log(tmp_path, registry_log(m, enrol_at_ms=CREATED_MS + 60_000))
    code, verdict = verify(tmp_path, *log_args(tmp_path), "--at-evidence-time")
    assert (code, verdict["reason"], verdict["index"]) == (1, "KEY_NOT_VALID", 0)


def test_verify_registry_options_are_checked(evidence: FilePath) -> None:
    base = ("verify", "--path", str(evidence / "path.json"), "--output", str(evidence / "output.bin"))
    both = cli(*base, "--registry", str(evidence / "registry.json"), *log_args(evidence))
    assert both.returncode == 2
    assert "not both" in both.stderr
    alone = cli(*base, "--registry-log", str(evidence / "registry-log.json"))
    assert alone.returncode == 2
    assert "--operator" in alone.stderr
    clash = cli(*base, *log_args(evidence), "--at-evidence-time", "--now-ms", "5")
    assert clash.returncode == 2
    assert cli(*base).returncode == 2
    remote = cli(*base, "--verifier", "127.0.0.1:1", "--insecure-loopback", "--at-evidence-time")
    assert remote.returncode == 2
    assert "offline" in remote.stderr


# --- inspect ---------------------------------------------------------------------------------------


def test_plain_inspect_says_it_checks_nothing(evidence: FilePath) -> None:
    result = cli("inspect", str(evidence / "path.json"))
    assert result.returncode == 0
    assert "nothing above was checked" in result.stdout
    assert "verified" not in result.stdout


def test_inspect_verify_marks_every_signature_and_gives_the_verdict(evidence: FilePath) -> None:
    result = cli("inspect", str(evidence / "path.json"), "--verify", *log_args(evidence), "--at-evidence-time",
                 "--output", str(evidence / "output.bin"))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    marks = [line for line in result.stdout.splitlines() if line.startswith("  [")]
    assert len(marks) == 4 + 2 * 3  # four primary signatures, three co-signed edges
    assert all(" verified " in line for line in marks)
    assert result.stdout.rstrip().endswith("audit mode: ACCEPT")


def test_inspect_verify_marks_a_forged_cosignature_and_a_revoked_key(tmp_path: FilePath) -> None:
    m = mesh()
    path = sample_path(m)
    parent_cosig, child_cosig = path.envelopes[2].record.cosigs
    borrowed = path.envelopes[1].record.cosigs[0]  # deployer-a's co-signature of another edge
    from countersign.constructions import seal

    forged = seal(replace(path.envelopes[2].record, cosigs=(replace(parent_cosig, sig=borrowed.sig), child_cosig)),
                  m.signers["deployer-c"])  # fmt: skip
    write_evidence(tmp_path, Path((*path.envelopes[:2], forged)), b"")
    write_log(tmp_path, registry_log(m, revoke="deployer-a"))
    result = cli("inspect", str(tmp_path / "path.json"), "--verify", *log_args(tmp_path), "--at-evidence-time")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    not_verified = [line for line in lines if "NOT verified" in line]
    assert any("[2] NOT verified" in line and "parent co-signature" in line and "BAD_COSIGNATURE" in line
               for line in not_verified)  # fmt: skip
    assert any("[0] NOT verified" in line and "KEY_REVOKED" in line for line in not_verified)
    assert any("[2] verified" in line and "child co-signature" in line for line in lines)
    assert "REJECT KEY_REVOKED at record 0" in lines[-1]  # the verdict names the first failure in order


def test_inspect_options_need_verify(evidence: FilePath) -> None:
    result = cli("inspect", str(evidence / "path.json"), "--verify")
    assert result.returncode == 2
    assert "--registry" in result.stderr
    plain = cli("inspect", str(evidence / "path.json"), "--registry", str(evidence / "registry.json"))
    assert plain.returncode == 2
    assert "--registry only make sense with --verify" in plain.stderr
    assert cli("inspect", str(evidence / "path.json"), "--at-evidence-time").returncode == 2


# --- export ------------------------------------------------------------------------------------


def test_export_writes_stdout_or_a_file_and_checks_the_output(evidence: FilePath) -> None:
    base = ("export", "--path", str(evidence / "path.json"))
    for fmt in ("dsse", "in-toto", "prov-json", "prov-n", "prov-o"):
        out = evidence / f"export.{fmt}"
        to_file = cli(*base, "--format", fmt, "--output", str(evidence / "output.bin"), "--out", str(out))
        assert to_file.returncode == 0, to_file.stderr
        to_stdout = cli(*base, "--format", fmt, "--output", str(evidence / "output.bin"))
        assert to_stdout.stdout.encode() == out.read_bytes()
    statement = json.loads((evidence / "export.in-toto").read_text())
    assert statement["subject"][0]["name"] == "output.bin"
    (evidence / "other.bin").write_bytes(OUTPUT + b"tampered")
    wrong = cli(*base, "--format", "in-toto", "--output", str(evidence / "other.bin"))
    assert wrong.returncode == 2
    assert "differs from the leaf's signed output hash" in wrong.stderr
    assert cli(*base, "--format", "pdf").returncode == 2


def test_export_refuses_unsigned_baselines_as_dsse(tmp_path: FilePath) -> None:
    path_file, _ = write_evidence(tmp_path, sample_path(mesh(), Construction.HASH_ONLY))
    result = cli("export", "--format", "dsse", "--path", str(path_file))
    assert result.returncode == 2
    assert "no signature" in result.stderr
