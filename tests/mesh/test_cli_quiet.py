"""The command line against a verifier whose certificate it cannot trust says so in its own one line:
gRPC's C core logs nothing beside it (issue 29: a wrong CA leaked "I... Handshake failed ..." to stderr)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from countersign._daemon.tls import PeerIdentity, create_ca, issue_certificate
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons

C_CORE_LOG_LINE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./-]+:\d+\]", re.MULTILINE)


def test_a_wrong_ca_is_one_line_of_the_command_and_no_grpc_log(mesh: LocalMesh, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign-pki"
    foreign.mkdir()
    create_ca(foreign)
    issue_certificate(foreign, foreign, "client", PeerIdentity("client", name="demo"))
    sample = tmp_path / "sample"
    made = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "sample-path", "--construction", "signed-dag", "--depth", "2",
         "--out", str(sample)], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    done = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "verify", "--path", str(sample / "path.json"),
         "--output", str(sample / "output.bin"), "--verifier", mesh.daemons["verifier-0"].address,
         "--ca", str(foreign / "ca.pem"), "--cert", str(foreign / "client.pem"),
         "--tls-key", str(foreign / "client.key")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert not C_CORE_LOG_LINE.search(done.stderr), done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("countersign verify: "), done.stderr
