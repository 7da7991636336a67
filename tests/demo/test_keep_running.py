"""`countersign demo --keep-running` (`make mesh`) leaves the local mesh up, prints a producer's and a
consumer's settings ready to paste (and writes them beside the registry and the operator's key), so the
README's `countersign verify --verifier` example can be tried without Docker; SIGTERM stops it cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.daemons, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_kept_mesh_verifies_remotely_and_stops_cleanly(tmp_path: Path) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "countersign_cli", "demo", "--keep-running", "--workdir", "work"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        described = tmp_path / "work" / "mesh.json"
        deadline = time.monotonic() + 180
        while not described.exists():
            assert demo.poll() is None, demo.communicate()
            assert time.monotonic() < deadline, "the mesh never reported it keeps running"
            time.sleep(0.2)
        time.sleep(0.2)  # written by one write_text: let it finish
        mesh = json.loads(described.read_text())
        command = mesh["verify_command"]
        assert command[:2] == ["countersign", "verify"] and "--verifier" in command
        run = [sys.executable, "-m", "countersign_cli", *command[1:]]
        first = subprocess.run(run, capture_output=True, text=True, timeout=60)
        assert first.returncode == 0, first.stdout + first.stderr  # accepted by the running verifier
        assert json.loads(first.stdout)["verdict"] == "ACCEPT"
        again = subprocess.run(run, capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "NONCE_REPLAYED" in again.stdout, again.stdout
        pids = [d["pid"] for d in mesh["daemons"].values()]
        assert len(pids) == 6 and all(_alive(pid) for pid in pids)  # deployer-c runs two signer replicas
        work = tmp_path / "work"
        settings = mesh["settings"]
        assert settings["registry"] == str(work / "registry.json")
        operator = json.loads((work / "operator.pub.json").read_text())
        assert operator["key_id"].startswith("ed25519:")
        # Each .env file, sourced by a POSIX shell, sets exactly its settings and clears the other way.
        for name, expected in (("deployer-b.env", settings["producers"]["deployer-b"]),
                               ("consumer.env", settings["consumer"]),
                               ("consumer-offline.env", settings["consumer_offline"])):  # fmt: skip
            sourced = subprocess.run(
                ["sh", "-c", f". ./{name} && env"], cwd=work, capture_output=True, text=True, check=True,
                env={"COUNTERSIGN_VERIFIER": "stale", "COUNTERSIGN_REGISTRY": "stale", "PATH": "/usr/bin:/bin"},
            ).stdout.splitlines()  # fmt: skip
            assigned = [line.split("=", 1) for line in sourced if line.startswith("COUNTERSIGN_")]
            assert dict(assigned) == expected, name
        assert settings["consumer"]["COUNTERSIGN_VERIFIER"] == mesh["daemons"]["verifier-0"]["address"]
        assert settings["producers"]["deployer-a"]["COUNTERSIGN_SIGNER"] == mesh["daemons"]["deployer-a"]["address"]
        replicas = [mesh["daemons"][name]["address"] for name in ("deployer-c", "deployer-c-r1")]
        assert settings["producers"]["deployer-c"]["COUNTERSIGN_SIGNER"] == ",".join(replicas)
    finally:
        demo.send_signal(signal.SIGTERM)
        out, err = demo.communicate(timeout=60)
    assert demo.returncode == 0, out + err
    assert "SIGTERM: stopping the mesh" in out
    # The settings printed are the files' lines, ready to paste.
    printed = [line.strip() for line in out.splitlines() if line.startswith("  export ") or line.startswith("  unset ")]
    files = [(tmp_path / "work" / name).read_text().splitlines() for name in ("deployer-a.env", "consumer.env")]
    assert printed == files[0] + files[1]
    assert "export COUNTERSIGN_MESH=" in out
    shutdown = next(line for line in out.splitlines() if line.startswith("shut down:"))
    assert shutdown.count("exit 0") == 6, shutdown
    assert not any(_alive(pid) for pid in pids)
    assert "Traceback" not in err
