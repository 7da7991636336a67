"""Offline operator signing as docs/operations.md ("Signing statements offline") walks it: the first
statement needs no log file (``--first``), later ones chain onto an exported log, and each signed file
is carried to a connected machine and submitted (issue 21, the first hour)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.canonical import b64url_encode
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def ok(*args: str) -> dict[str, object]:
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_sign_the_first_statements_offline_then_submit_them(make_mesh: object, tmp_path: Path) -> None:
    mesh = make_mesh(enrol=False)  # type: ignore[operator]
    assert isinstance(mesh, LocalMesh)
    operator_key = str(mesh.workdir / "keys" / "operator.jwk")
    pki = mesh.workdir / "pki"
    tls = ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "operator.pem"), "--tls-key", str(pki / "operator.key")]
    coordinator = ["--coordinator", mesh.daemons["coordinator"].address, *tls]
    # Where the operator's checkpoint loop reads what was signed: submit records each statement there.
    head = ["--head-file", str(mesh.workdir / "keys" / "operator.head.json")]
    key_a = b64url_encode(mesh.deployer_keys["deployer-a"].public_key)
    key_b = b64url_encode(mesh.deployer_keys["deployer-b"].public_key)

    # Offline: without --log or --first the command says which to give; with --first, no file is needed.
    refused = cli("operator", "enrol", "--key", operator_key, "--deployer", "deployer-a",
                  f"--public-key={key_a}", "--out", str(tmp_path / "s0.json"))  # fmt: skip
    assert refused.returncode == 2 and "--first" in refused.stderr
    first = ok("operator", "enrol", "--key", operator_key, "--deployer", "deployer-a", f"--public-key={key_a}",
               "--first", "--out", str(tmp_path / "s0.json"))  # fmt: skip
    assert (first["sequence"], first["kind"]) == (0, "enrol_deployer")
    assert first["what"] == "admit a new deployer with its first signing key"

    # Connected: submit it, export the log for the next offline signing.
    assert ok("operator", "submit", "--statement", str(tmp_path / "s0.json"), *head, *coordinator)["sequence"] == 0
    export = tmp_path / "export"
    ok("registry", "export", f"--operator-public-key={b64url_encode(mesh.operator.public_key)}",
       "--out", str(export), *coordinator)  # fmt: skip

    # Offline again: --first now would fork the registry. The operator's own record (beside its key)
    # refuses to sign it; signed elsewhere, the coordinator refuses it.
    second = ok("operator", "enrol", "--key", operator_key, "--deployer", "deployer-b", f"--public-key={key_b}",
                "--log", str(export / "registry-log.json"), "--out", str(tmp_path / "s1.json"))  # fmt: skip
    assert second["sequence"] == 1
    refused = cli("operator", "enrol", "--key", operator_key, "--deployer", "deployer-b", f"--public-key={key_b}",
                  "--first", "--out", str(tmp_path / "fork.json"))  # fmt: skip
    assert refused.returncode == 2 and "SEQUENCE_CONFLICT" in refused.stderr, refused.stderr
    assert not (tmp_path / "fork.json").exists()
    elsewhere = ["--head-file", str(tmp_path / "other-host.json")]
    fork = ok("operator", "enrol", "--key", operator_key, "--deployer", "deployer-b", f"--public-key={key_b}",
              "--first", "--out", str(tmp_path / "fork.json"), *elsewhere)  # fmt: skip
    assert fork["sequence"] == 0
    refused = cli("operator", "submit", "--statement", str(tmp_path / "fork.json"), *elsewhere, *coordinator)
    assert refused.returncode == 2 and "SEQUENCE_CONFLICT" in refused.stderr, refused.stderr
    assert ok("operator", "submit", "--statement", str(tmp_path / "s1.json"), *head, *coordinator)["sequence"] == 1
    mesh.wait_for_registry(2)
