"""`countersign sample-session` and `countersign verify-session` (offline): the verdict object of
`verify`, exit 0 on accept and 1 on reject, each rearrangement with its reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from countersign_cli.main import main

pytestmark = pytest.mark.offline


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(list(args))
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "session"
    code, written = run(capsys, "sample-session", "--outputs", "3", "--closed", "--out", str(out), "--seed", "s")
    assert (code, written["receipts"]) == (0, 4)
    return out


def verify(capsys: pytest.CaptureFixture[str], out: Path, receipts: Path, *extra: str) -> tuple[int, dict[str, object]]:
    return run(
        capsys, "verify-session", "--path", str(out / "agent.json"), "--registry", str(out / "registry.json"),
        "--receipts", str(receipts), "--outputs", str(out / "outputs"), *extra,
    )  # fmt: skip


def test_the_sample_session_verifies_closed(sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, verdict = verify(capsys, sample, sample / "receipts", "--closed")
    assert (code, {k: verdict[k] for k in ("verdict", "reason", "index", "detail")}) == (
        0,
        {"verdict": "ACCEPT", "reason": None, "index": None, "detail": ""},
    )
    # Named as verify names it: the emitter is the session's last receipt (its close receipt here).
    receipts = len(list((sample / "receipts").glob("*.json")))
    emitter = verdict["emitter"]
    assert isinstance(emitter, dict) and emitter["seq"] == receipts - 1 and emitter["session"]


def test_reordered_dropped_and_truncated_sessions_are_rejected(
    sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = sorted((sample / "receipts").glob("*.json"))

    def laid_out(name: str, order: list[int]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for position, index in enumerate(order):  # name order is the order presented
            shutil.copy(files[index], folder / f"{position:03d}-{files[index].stem}.json")
        return folder

    code, verdict = verify(capsys, sample, laid_out("dropped", [0, 2, 3]))
    assert (code, verdict["reason"], verdict["index"]) == (1, "SESSION_GAP", 1)
    code, verdict = verify(capsys, sample, laid_out("truncated", [0, 1, 2]), "--closed")
    assert (code, verdict["reason"], verdict["index"]) == (1, "SESSION_TRUNCATED", None)
    array = tmp_path / "reordered.json"
    array.write_text("[" + ",".join(files[i].read_text() for i in (1, 0, 2, 3)) + "]")
    code, verdict = run(
        capsys, "verify-session", "--path", str(sample / "agent.json"), "--registry", str(sample / "registry.json"),
        "--receipts", str(array),
    )  # fmt: skip
    assert (code, verdict["reason"], verdict["index"]) == (1, "SESSION_REORDERED", 0)


def test_other_bytes_and_a_broken_receipt_file_are_verdicts(sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (sample / "outputs" / "000002.bin").write_bytes(b"not what was emitted\n")
    code, verdict = verify(capsys, sample, sample / "receipts")
    assert (code, verdict["reason"], verdict["index"]) == (1, "SESSION_OUTPUT_MISMATCH", 2)
    (sample / "receipts" / "000001.json").write_text("{not json")
    code, verdict = verify(capsys, sample, sample / "receipts")
    assert (code, verdict["reason"], verdict["index"]) == (1, "MALFORMED", 1)


def test_a_consumer_policy_file_gates_the_session(
    sample: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed_only = tmp_path / "closed-only.json"
    closed_only.write_text(json.dumps({"v": 1, "policy": {"require_closed_session": True}}))
    nobody = tmp_path / "nobody.json"
    nobody.write_text(json.dumps({"v": 1, "policy": {"allowed_deployers": ["deployer-nobody"]}}))
    code, verdict = verify(capsys, sample, sample / "receipts", "--policy", str(closed_only))
    assert (code, verdict["verdict"]) == (0, "ACCEPT")
    code, verdict = verify(capsys, sample, sample / "receipts", "--policy", str(nobody))
    assert (code, verdict["verdict"], verdict["reason"], verdict["index"]) == (
        1,
        "REJECT",
        "CONSUMER_POLICY_VIOLATION",
        0,
    )
    assert "allowed_deployers" in str(verdict["detail"])
    # With --verifier the file is read here before any call (spec 16.4): a bad one is a usage error (exit 2).
    broken = tmp_path / "broken.json"
    broken.write_text('{"v": 1, "policy": {"allowed_deployers": []')
    code = main(["verify-session", "--path", str(sample / "agent.json"), "--receipts", str(sample / "receipts"),
                 "--verifier", "127.0.0.1:1", "--policy", str(broken)])  # fmt: skip
    assert code == 2 and "is not a valid policy" in capsys.readouterr().err
