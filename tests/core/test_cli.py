"""The command line as a user runs it: real processes, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.records import Construction

pytestmark = pytest.mark.daemons  # runs the command line in child processes


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample")
    result = cli("sample-path", "--construction", "signed-dag", "--depth", "5", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def verify(sample: Path, *extra: str, output: Path | None = None) -> subprocess.CompletedProcess[str]:
    return cli(
        "verify",
        "--path", str(sample / "path.json"),
        "--output", str(output or sample / "output.bin"),
        "--registry", str(sample / "registry.json"),
        *extra,
    )  # fmt: skip


def test_keygen_writes_a_0600_key_and_prints_its_id(tmp_path: Path) -> None:
    key = tmp_path / "k.jwk"
    result = cli("keygen", "--out", str(key))
    assert result.returncode == 0
    assert result.stdout.strip().startswith("ed25519:")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert json.loads(key.read_text())["kid"] == result.stdout.strip()
    again = cli("keygen", "--out", str(key))
    assert again.returncode == 2
    assert "refusing to overwrite" in again.stderr


def test_sample_path_writes_path_output_registry_and_0600_keys(sample: Path) -> None:
    assert {p.name for p in sample.iterdir()} == {"path.json", "output.bin", "registry.json", "keys"}
    keys = sorted((sample / "keys").iterdir())
    assert [k.name for k in keys] == ["deployer-a.jwk", "deployer-b.jwk", "deployer-c.jwk"]
    assert all(stat.S_IMODE(k.stat().st_mode) == 0o600 for k in keys)
    assert len(json.loads((sample / "path.json").read_text())["envelopes"]) == 5


def test_verify_accepts_then_rejects_a_replay_with_durable_state(sample: Path, tmp_path: Path) -> None:
    state = f"sqlite:///{tmp_path / 'state.db'}"
    first = verify(sample, "--state", state)
    assert first.returncode == 0, first.stderr
    accepted = json.loads(first.stdout)
    assert {k: accepted[k] for k in ("verdict", "reason", "index", "detail")} == {
        "verdict": "ACCEPT",
        "reason": None,
        "index": None,
        "detail": "",
    }
    assert accepted["emitter"]["deployer"] == "deployer-b"  # depth 5 over three deployers: a b c a b
    assert accepted["emitter"]["index"] == 4
    assert [e["cross_deployer"] for e in accepted["edges"]] == [True] * 4
    assert accepted["registry_sequence"] == 0
    second = verify(sample, "--state", state)
    assert second.returncode == 1
    replayed = json.loads(second.stdout)
    assert replayed["reason"] == "NONCE_REPLAYED"
    assert replayed["emitter"] == accepted["emitter"]  # a replay is still proven evidence of its emitter
    audit = verify(sample, "--state", state, "--audit")
    assert audit.returncode == 0


def test_verify_rejects_substituted_output(sample: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.bin"
    other.write_bytes(b"not what the writer emitted")
    result = verify(sample, output=other)
    assert result.returncode == 1
    assert json.loads(result.stdout) | {"detail": ""} == {
        "verdict": "REJECT",
        "reason": "OUTPUT_MISMATCH",
        "index": 4,
        "detail": "",
        "emitter": None,  # the output binding failed: nothing about the emitter is proven
        "edges": None,
        "registry_sequence": None,
    }


@pytest.mark.parametrize("construction", [c.value for c in Construction])
def test_every_construction_samples_and_verifies(construction: str, tmp_path: Path) -> None:
    result = cli("sample-path", "--construction", construction, "--depth", "4", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    plain = verify(tmp_path)
    if Construction(construction).signs_lineage:
        assert plain.returncode == 0, plain.stdout
    else:
        assert json.loads(plain.stdout)["reason"] == "CONSTRUCTION_NOT_ALLOWED"
        assert verify(tmp_path, "--unsafe-allow-baselines").returncode == 0


@pytest.mark.parametrize(
    "content", [b"", b"{", b"\xff\xfe", b"[" * 100_000, b'{"v":1,"envelopes":[{"record":1}]}', b"null"]
)
def test_garbage_path_is_a_malformed_verdict(sample: Path, tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    result = cli(
        "verify",
        "--path",
        str(bad),
        "--output",
        str(sample / "output.bin"),
        "--registry",
        str(sample / "registry.json"),
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["reason"] == "MALFORMED"


@pytest.mark.parametrize("content", [b"", b"{}", b"[]", b'{"v":1,"sequence":0,"deployers":{"X":{"keys":[]}}}', b"\xff"])
def test_garbage_registry_is_a_usage_error(sample: Path, tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "registry.json"
    bad.write_bytes(content)
    result = cli(
        "verify", "--path", str(sample / "path.json"), "--output", str(sample / "output.bin"), "--registry", str(bad)
    )
    assert result.returncode == 2
    assert "is not a registry" in result.stderr
    assert result.stdout == ""


def test_missing_files_and_bad_arguments_are_usage_errors(sample: Path) -> None:
    missing = cli(
        "verify",
        "--path",
        "/nonexistent/path.json",
        "--output",
        str(sample / "output.bin"),
        "--registry",
        str(sample / "registry.json"),
    )
    assert missing.returncode == 2
    assert "cannot read path" in missing.stderr
    assert cli("verify").returncode == 2
    assert cli("sample-path", "--construction", "bogus", "--depth", "2", "--out", "x").returncode == 2
    assert cli("sample-path", "--construction", "merkle", "--depth", "0", "--out", "x").returncode == 2
    bad_state = verify(sample, "--state", "redis://localhost")
    assert bad_state.returncode == 2
    assert "unknown store URL scheme" in bad_state.stderr


def test_inspect_prints_a_tree_with_cosigners(sample: Path) -> None:
    result = cli("inspect", str(sample / "path.json"))
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("path v1 · signed-dag · 5 records")
    assert sum("co-signed by parent deployer-" in line for line in lines) == 4
    assert "output sha256:" in result.stdout


def test_conformance_json_reports_every_cell_and_the_pattern() -> None:
    result = cli("conformance", "--trials", "2", "--session-trials", "2", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the progress lines went to stderr, not into the JSON
    progress = result.stderr.splitlines()
    assert progress[0] == "conformance: 108 cells..." and progress[-1].startswith("conformance: 108/108 cells")
    assert report["pattern_matches"] is True
    assert len(report["cells"]) == 14 * 6
    assert len(report["session_cells"]) == 8 * 3
    assert all(c["matches"] for c in report["session_cells"])
    dag_graft = next(
        c for c in report["cells"] if c["attack"] == "CHILD_KEY_GRAFT" and c["construction"] == "signed-dag"
    )
    assert dag_graft["accepted"] == 0
    assert dag_graft["expected"] == "reject"


def test_offline_demo_runs_and_exits_zero() -> None:
    result = cli("demo", "--offline")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all outcomes as expected" in result.stdout
    assert "BAD_COSIGNATURE" in result.stdout


def test_key_material_never_reaches_stdout_or_stderr(sample: Path) -> None:
    seeds = [json.loads(k.read_text())["d"] for k in (sample / "keys").iterdir()]
    outputs = [verify(sample, "--audit"), cli("inspect", str(sample / "path.json"))]
    for result in outputs:
        for seed in seeds:
            assert seed not in result.stdout + result.stderr


def test_accept_mode_without_durable_state_says_it_keeps_nothing(sample: Path, tmp_path: Path) -> None:
    """A second run of the same path is accepted again with the default memory: store: say so."""
    first, second = verify(sample), verify(sample)
    assert (first.returncode, second.returncode) == (0, 0)
    assert "keeps nothing" in first.stderr and "--state sqlite:///state.db" in first.stderr
    assert "keeps nothing" not in verify(sample, "--audit").stderr
    durable = verify(sample, "--state", f"sqlite:///{tmp_path}/state.db")
    assert "keeps nothing" not in durable.stderr


def test_version_names_the_installed_package() -> None:
    from importlib.metadata import version

    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"countersign {version('countersign-mesh')}"


@pytest.mark.parametrize(
    "command",
    [
        ["verify", "--audit"],  # one verdict line, written at the end
        ["conformance", "--trials", "1", "--session-trials", "1", "--json"],  # a long one
    ],
    ids=["verify", "conformance"],
)
def test_a_reader_that_goes_away_ends_the_command_quietly(sample: Path, command: list[str]) -> None:
    """Issue 29: `countersign verify ... | head -c 10` printed a BrokenPipeError traceback. Here the
    reader has gone before the command writes anything, so every write fails."""
    if command[0] == "verify":
        command = [*command, "--path", str(sample / "path.json"), "--output", str(sample / "output.bin")]
        command += ["--registry", str(sample / "registry.json")]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "countersign_cli", *command],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (done.returncode, "Traceback" in done.stderr, "Broken pipe" in done.stderr) == (141, False, False)
    assert "Exception ignored" not in done.stderr, done.stderr
