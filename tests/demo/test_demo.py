"""The README's first command: the mesh demo runs as real processes, exits 0, and its export checks offline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemons


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=180, cwd=cwd
    )


def test_mesh_demo_shows_every_outcome_and_exports_checkable_evidence(tmp_path: Path) -> None:
    export = tmp_path / "export"
    # Relative paths, as a user types them: they used to resolve against / in the daemons.
    result = run("demo", "--export", "export", "--workdir", "work", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    out = result.stdout
    for line in (
        "final output of the Writer",
        "REJECT NONCE_REPLAYED",
        "REJECT OUTPUT_MISMATCH",
        "REJECT BAD_COSIGNATURE",
        "known limit",
        "REJECT KEY_REVOKED",
        "all outcomes as expected",
    ):
        assert line in out, line
    # The Writer's session, through the verifier's VerifySession: accepted closed and consumed (shown
    # again it is a replay), then each rearrangement rejected with its reason and index.
    scene = out.split("Session: the Writer's three turns", 1)[1].split("Revocation without restart", 1)[0]
    verdicts = [line.split("  ")[-1].strip() for line in scene.splitlines() if line.startswith("  ok ")]
    assert verdicts == [
        "ACCEPT",
        "REJECT NONCE_REPLAYED at receipt 0",
        "REJECT SESSION_REORDERED at receipt 0",
        "REJECT SESSION_GAP at receipt 1",
        "REJECT SESSION_TRUNCATED at the end",
    ]
    # deployer-c's first replica is SIGKILLed after the second turn; the other signs turn 3 and the
    # close receipt as seq 2 and 3 of the same session (accepted above), and the killed one restarts.
    assert "SIGKILLed deployer-c (pid" in scene
    assert "turn 3 and the close receipt signed by deployer-c-r1: seq 2 and 3" in scene
    assert "deployer-c restarted on the same state" in scene
    assert "BAD " not in out
    shutdown = next(line for line in out.splitlines() if line.startswith("shut down:"))
    assert shutdown.count("exit 0") == 6  # a coordinator, four signer processes (two of deployer-c), a verifier
    assert {p.name for p in export.iterdir()} == {
        "path.json", "output.bin", "registry.json", "registry-log.json", "operator.pub.json", "verifier-state.db",
    }  # fmt: skip
    offline = run(
        "verify", "--path", str(export / "path.json"), "--output", str(export / "output.bin"),
        "--registry", str(export / "registry.json"), "--audit",
    )  # fmt: skip
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert json.loads(offline.stdout)["verdict"] == "ACCEPT"
    statements = json.loads((export / "registry-log.json").read_text())["statements"]
    assert [s["statement"]["kind"] for s in statements][-1] == "revoke_key"


def test_plaintext_demo_needs_no_certificates(tmp_path: Path) -> None:
    result = run("demo", "--plaintext", "--workdir", str(tmp_path / "work"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plaintext" in result.stdout
    assert not (tmp_path / "work" / "mesh" / "pki" / "ca.pem").exists()
