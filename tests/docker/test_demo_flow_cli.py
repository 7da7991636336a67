"""The demo job's command line (docker/dev-mesh/demo_flow.py), run as a child process without a mesh:
usage errors are one line, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.conftest import DOCKER_DIR

pytestmark = pytest.mark.daemons  # runs the script as a child process


def test_replay_without_the_saved_file_says_so_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(DOCKER_DIR / "dev-mesh" / "demo_flow.py"), "--verifiers", "127.0.0.1:1",
         "--tls-dir", str(tmp_path), "--replay", str(tmp_path / "missing.bin")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("cannot read the saved path") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_demo_needs_signers_unless_it_replays(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(DOCKER_DIR / "dev-mesh" / "demo_flow.py"), "--verifiers", "127.0.0.1:1",
         "--tls-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and "--signers is required" in result.stderr, result.stderr
