"""The command line against a running verifier, as a new user meets it: every failure is one line on
stderr, in the command line's own words (flags, not config keys), saying what to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("remote-sample")
    assert cli("sample-path", "--construction", "signed-dag", "--depth", "2", "--out", str(out)).returncode == 0
    return out


def verify(sample: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("verify", "--path", str(sample / "path.json"), "--output", str(sample / "output.bin"), *extra)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def test_missing_tls_material_names_the_flags(mesh: LocalMesh, sample: Path) -> None:
    line = one_line(verify(sample, "--verifier", mesh.daemons["verifier-0"].address))
    assert "--ca is required, or --insecure-loopback" in line
    assert "tls." not in line


def test_plaintext_against_an_mtls_verifier_says_so(mesh: LocalMesh, sample: Path) -> None:
    line = one_line(verify(sample, "--verifier", mesh.daemons["verifier-0"].address, "--insecure-loopback"))
    assert "is it serving mTLS?" in line and "--ca, --cert and --tls-key" in line


def test_nothing_listening_says_so(sample: Path) -> None:
    line = one_line(verify(sample, "--verifier", "127.0.0.1:1", "--insecure-loopback"))
    assert "nothing is listening at that address" in line


def test_an_unreachable_postgres_state_is_one_clear_line(sample: Path) -> None:
    line = one_line(
        verify(sample, "--registry", str(sample / "registry.json"), "--state", "postgres://u@127.0.0.1:1/x")
    )
    assert line.startswith("countersign verify: state store unavailable: PostgreSQL")
