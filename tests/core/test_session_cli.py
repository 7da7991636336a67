"""`countersign sample-session` and `countersign verify-session` (offline): the verdict object of
`verify`, exit 0 on accept and 1 on reject, each rearrangement with its reason."""

from __future__ import annotations

import base64
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


# --- the same rules as the verifier: nesting (spec 2.1) and the state step (17.4) ---------------

VECTORS = Path(__file__).parents[1] / "vectors" / "sessions"


def laid_out_vector(name: str, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A session vector as sample-session lays a session out: agent.json, receipts/, outputs/, registry.json."""
    vector = json.loads((VECTORS / name).read_text())
    out = tmp_path / Path(name).stem
    (out / "receipts").mkdir(parents=True)
    (out / "outputs").mkdir()
    session = vector["session"]
    (out / "agent.json").write_text(json.dumps(session["agent"]))
    (out / "registry.json").write_text(json.dumps(vector["registry"]))
    for index, receipt in enumerate(session["receipts"]):
        (out / "receipts" / f"{index:06d}.json").write_text(json.dumps(receipt))
        output = vector["outputs_base64"][index]
        if output is not None:
            (out / "outputs" / f"{index:06d}.bin").write_bytes(base64.b64decode(output))
    return out, vector


def verify_vector(
    capsys: pytest.CaptureFixture[str], out: Path, vector: dict[str, object], *extra: str
) -> tuple[int, dict[str, object]]:
    return verify(capsys, out, out / "receipts", "--now-ms", str(vector["now_ms"]), *extra)


def _nest(levels: int) -> str:
    return "[" * levels + "0" + "]" * levels


@pytest.mark.parametrize(("levels", "index"), [(27, 1), (28, None), (998, None)])
def test_a_receipt_file_nested_too_deep_is_malformed_at_index_null(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int, index: int | None
) -> None:
    """Issue 29: 33 levels gave MALFORMED at the receipt, about 1,000 "maximum recursion depth
    exceeded". In the session evidence a receipt's agent instance sits five levels down (session,
    receipts, envelope, record, agent), so 27 arrays are 32 levels and 28 are 33."""
    out, vector = laid_out_vector("valid/turns-open.json", tmp_path)
    receipt = out / "receipts" / "000001.json"
    value = json.loads(receipt.read_text())
    value["record"]["agent"]["instance"] = "PLACEHOLDER"
    receipt.write_text(json.dumps(value).replace('"PLACEHOLDER"', _nest(levels)))
    code, verdict = verify_vector(capsys, out, vector)
    assert (code, verdict["reason"], verdict["index"]) == (1, "MALFORMED", index), verdict
    if index is None:
        assert verdict["detail"] == "input is nested deeper than 32 levels"


@pytest.mark.parametrize("levels", [27, 998])
def test_an_agent_file_nested_too_deep_is_malformed_for_its_depth_not_the_stack(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int
) -> None:
    # session, agent, envelopes, envelope, record, agent: the instance sits six levels down
    out, vector = laid_out_vector("valid/turns-open.json", tmp_path)
    value = json.loads((out / "agent.json").read_text())
    value["envelopes"][2]["record"]["agent"]["instance"] = "PLACEHOLDER"
    (out / "agent.json").write_text(json.dumps(value).replace('"PLACEHOLDER"', _nest(levels)))
    code, verdict = verify_vector(capsys, out, vector)
    assert (code, verdict["reason"], verdict["index"]) == (1, "MALFORMED", None), verdict
    assert verdict["detail"] == "input is nested deeper than 32 levels"


def test_receipts_that_share_a_nonce_are_refused_as_a_verifier_refuses_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: offline verify-session skipped spec 17.4 and accepted this session."""
    out, vector = laid_out_vector("state/nonce-repeated.json", tmp_path)
    code, verdict = verify_vector(capsys, out, vector)
    assert (code, verdict["reason"], verdict["index"]) == (1, "NONCE_REPLAYED", 2), verdict
    assert verdict["emitter"] is not None
    code, verdict = verify_vector(capsys, out, vector, "--audit")  # audit mode refuses no nonce
    assert (code, verdict["verdict"]) == (0, "ACCEPT")


def test_an_agent_path_beyond_max_children_is_refused_as_verify_refuses_a_receipt_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: verify-session accepted a session whose agent path exceeds max_children, while
    verify of one receipt's path gave FANOUT_EXCEEDED."""
    out, vector = laid_out_vector("state/fanout-exceeded.json", tmp_path)
    code, verdict = verify_vector(capsys, out, vector)
    assert (code, verdict["reason"], verdict["index"]) == (1, "FANOUT_EXCEEDED", 0), verdict
    assert str(verdict["detail"]).startswith("path envelope 2: ")
    agent = json.loads((out / "agent.json").read_text())
    first = json.loads((out / "receipts" / "000000.json").read_text())
    (out / "path.json").write_text(json.dumps({**agent, "envelopes": [*agent["envelopes"], first]}))
    code, single = run(
        capsys, "verify", "--path", str(out / "path.json"), "--output", str(out / "outputs" / "000000.bin"),
        "--registry", str(out / "registry.json"), "--now-ms", str(vector["now_ms"]), "--audit",
    )  # fmt: skip
    assert (code, single["reason"], single["index"]) == (1, "FANOUT_EXCEEDED", 2)
