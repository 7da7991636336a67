"""Consumer policy on the command line: ``countersign verify --policy FILE``, run as a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path as FilePath

import pytest

pytestmark = pytest.mark.daemons  # runs the command line as a child process


# --- the command line -----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> FilePath:
    out = tmp_path_factory.mktemp("policy-sample")
    assert cli("sample-path", "--construction", "signed-dag", "--depth", "3", "--out", str(out)).returncode == 0
    return out


def cli_verify(sample: FilePath, document: object, tmp_path: FilePath) -> subprocess.CompletedProcess[str]:
    policy_file = tmp_path / "policy.json"
    policy_file.write_text(document if isinstance(document, str) else json.dumps(document))
    return cli(
        "verify", "--path", str(sample / "path.json"), "--output", str(sample / "output.bin"),
        "--registry", str(sample / "registry.json"), "--audit", "--policy", str(policy_file),
    )  # fmt: skip


def test_cli_policy_allows_and_refuses_naming_the_clause(sample: FilePath, tmp_path: FilePath) -> None:
    allowed = cli_verify(sample, {"v": 1, "policy": {"cross_deployer_construction": ["signed-dag"]}}, tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert json.loads(allowed.stdout)["emitter"]["deployer"] == "deployer-c"
    refused = cli_verify(sample, {"v": 1, "policy": {"allowed_deployers": ["deployer-a", "deployer-b"]}}, tmp_path)
    assert refused.returncode == 1
    verdict = json.loads(refused.stdout)
    assert (verdict["reason"], verdict["index"]) == ("CONSUMER_POLICY_VIOLATION", 2)
    assert verdict["detail"].startswith("allowed_deployers: ")


def test_cli_bad_policy_is_a_one_line_usage_error(sample: FilePath, tmp_path: FilePath) -> None:
    bad = cli_verify(sample, '{"v":1,"policy":{"all_of":[]', tmp_path)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "is not a valid policy" in bad.stderr
    remote = cli(
        "verify", "--path", str(sample / "path.json"), "--output", str(sample / "output.bin"),
        "--verifier", "127.0.0.1:1", "--insecure-loopback", "--policy", str(tmp_path / "policy.json"),
    )  # fmt: skip
    # With --verifier the file is read here before any call (spec 16.4): a bad one is the same usage error.
    assert remote.returncode == 2
    assert len(remote.stderr.strip().splitlines()) == 1 and "is not a valid policy" in remote.stderr
