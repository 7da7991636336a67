"""The committed gRPC code is exactly what ``proto/generate.py`` produces from ``proto/`` today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemons  # runs proto/generate.py in a child process

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "countersign" / "_proto"


def files_under(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    out = tmp_path / "_proto"
    done = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    fresh, committed = files_under(out), files_under(COMMITTED)
    assert sorted(fresh) == sorted(committed)
    assert any(name.endswith("_pb2_grpc.py") for name in fresh)
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"regenerate with `make proto`: {stale}"
