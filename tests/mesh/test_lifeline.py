"""Daemons started by a local mesh end with the process that started them, however it ends: each
inherits the read end of a pipe whose write end only that process holds (``lifeline_fd``), so a test
run or a demo killed outright (SIGKILL, no clean-up) leaves no daemon behind to load the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from countersign._daemon.server import watch_lifeline
from countersign.errors import ConfigError

pytestmark = pytest.mark.daemons

REPO = Path(__file__).parents[2]

# The owner: a mesh of a coordinator, one signer and one verifier, then its daemons' pids, then sleep.
OWNER = """
import json, sys, time
from pathlib import Path
from countersign_cli.localmesh import LocalMesh
mesh = LocalMesh(Path(sys.argv[1]), deployers=("deployer-a",), verifiers=1).setup().start_all()
print(json.dumps({name: daemon.process.pid for name, daemon in mesh.daemons.items()}), flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) has stopped too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_daemons_stop_when_the_process_that_started_them_is_killed(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path / "mesh")], stdout=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    pids: dict[str, int] = {}
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line, "the owner did not start its mesh"
        pids = json.loads(line)
        assert len(pids) == 3 and all(_alive(pid) for pid in pids.values())
        owner.kill()  # SIGKILL: the owner runs no clean-up at all
        owner.wait(10)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [name for name, pid in pids.items() if _alive(pid)] == []
        for name in pids:  # each stopped as on SIGTERM, saying why
            log = (tmp_path / "mesh" / "logs" / f"{name}.log").read_text()
            assert "the process that started this daemon is gone" in log and '"stopped"' in log, log[-2000:]
    finally:
        owner.kill()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_lifeline_that_is_not_a_pipe_is_a_configuration_error() -> None:
    with tempfile.TemporaryFile() as regular, pytest.raises(ConfigError, match="is not an open pipe"):
        watch_lifeline(regular.fileno())
    read, write = os.pipe()
    os.close(read)
    os.close(write)
    with pytest.raises(ConfigError, match="is not an open pipe"):
        watch_lifeline(read)  # closed
