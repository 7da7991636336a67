"""Configuration errors: exit code 2, one clear line on stderr, no traceback, nothing served."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.canonical import b64url_encode
from countersign.keys import Ed25519Signer
from countersign.service.localmesh import write_toml

pytestmark = pytest.mark.daemons


def base(daemon: str, tmp_path: Path) -> dict[str, object]:
    """A configuration of ``daemon`` that would be valid with a [tls] table."""
    body: dict[str, object] = {
        "operator_public_key": b64url_encode(Ed25519Signer.generate().public_key),
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "ready_file": str(tmp_path / "ready"),
    }
    if daemon in ("signer", "verifier"):
        body |= {"coordinator": "127.0.0.1:1", "registry_cache": str(tmp_path / "registry.json")}
    if daemon == "signer":
        body |= {"deployer": "deployer-a", "signer_key": f"file:{tmp_path / 'missing.jwk'}"}
    return body


LOOPBACK_PLAINTEXT = {"insecure_loopback": True}
CASES = {
    "unknown-key": ({"retention_days": 7, "tls": LOOPBACK_PLAINTEXT}, "unknown setting(s) retention_days"),
    "unknown-tls-key": ({"tls": {"insecure_loopback": True, "cipher": "x"}}, "unknown setting(s) cipher"),
    "wrong-type": ({"listen": 7402, "tls": LOOPBACK_PLAINTEXT}, "listen must be a string"),
    "wrong-type-bool": ({"tls": {"insecure_loopback": "yes"}}, "insecure_loopback must be true or false"),
    "tls-missing": ({}, "tls.ca (or tls.ca_pem) is required, or tls.insecure_loopback"),
    "tls-file-missing": ({"tls": {"ca": "/nonexistent/ca.pem"}}, "tls.ca /nonexistent/ca.pem is not a readable file"),
    "plaintext-off-loopback": (
        {"listen": "0.0.0.0:0", "tls": LOOPBACK_PLAINTEXT},
        "tls.insecure_loopback is only allowed on loopback; listen is 0.0.0.0:0",
    ),
    "no-lanes": ({"lanes_per_client": 0, "tls": LOOPBACK_PLAINTEXT}, "lanes_per_client must be between 1 and"),
    "lanes-over-total": (
        {"lanes_per_client": 9, "max_lanes": 8, "tls": LOOPBACK_PLAINTEXT},
        "lanes_per_client must be between 1 and max_lanes",
    ),
    "signature-threads": (
        {"signature_threads": 0, "tls": LOOPBACK_PLAINTEXT},
        "signature_threads must be between 1 and 16",
    ),
}
SIGNER_CASES = {
    "no-peer-lanes": ({"lanes_per_peer": 0, "tls": LOOPBACK_PLAINTEXT}, "lanes_per_peer must be between 1 and 64"),
    "lane-idle": ({"lane_idle_ms": 0, "tls": LOOPBACK_PLAINTEXT}, "lane_idle_ms must be positive"),
}


def serve(daemon: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")}
    argv = [sys.executable, "-m", "countersign", daemon, "serve", "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


# Every case for the verifier; the main ones for the other two daemons (the loader is shared).
PAIRS = (
    [("verifier", case) for case in CASES]
    + [
        (daemon, case)
        for daemon in ("signer", "coordinator")
        for case in ("unknown-key", "wrong-type", "tls-missing", "plaintext-off-loopback")
    ]
    + [("signer", case) for case in SIGNER_CASES]
)
CASES |= SIGNER_CASES


@pytest.mark.parametrize(("daemon", "case"), PAIRS)
def test_bad_configuration_exits_2_with_one_line(tmp_path: Path, daemon: str, case: str) -> None:
    changes, expected = CASES[case]
    config = tmp_path / f"{case}.toml"
    write_toml(config, base(daemon, tmp_path) | changes)
    done = serve(daemon, config)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"countersign {daemon}: bad configuration: "), lines[0]
    assert expected in lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "ready").exists()


def test_missing_config_file(tmp_path: Path) -> None:
    done = serve("verifier", tmp_path / "absent.toml")
    assert done.returncode == 2
    absent = tmp_path / "absent.toml"
    expected = f"countersign verifier: bad configuration: cannot read config {absent}: No such file or directory"
    assert done.stderr.splitlines() == [expected]
