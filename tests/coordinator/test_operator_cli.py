"""The operator's command line against a real coordinator: online statements, and the offline ceremony."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.canonical import b64url_encode
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def coordinator(tmp_path: Path) -> LocalMesh:
    mesh = LocalMesh(tmp_path / "mesh", verifiers=0).setup()
    mesh.start("coordinator")
    yield mesh
    mesh.stop_all()


def tls(mesh: LocalMesh, name: str) -> list[str]:
    config = mesh.tls_for(name)
    return ["--ca", config.ca, "--cert", config.cert, "--tls-key", config.key]


def test_online_and_offline_statements_and_export(coordinator: LocalMesh, tmp_path: Path) -> None:
    address = coordinator.daemons["coordinator"].address
    operator_key = str(coordinator.workdir / "keys" / "operator.jwk")
    deployer = Ed25519Signer.generate()
    online = cli(
        "operator", "enrol", "--key", operator_key, "--deployer", "deployer-x",
        f"--public-key={b64url_encode(deployer.public_key)}", "--coordinator", address, *tls(coordinator, "operator"),
    )  # fmt: skip
    assert online.returncode == 0, online.stderr
    assert json.loads(online.stdout)["sequence"] == 0

    export = tmp_path / "export"
    exported = cli(
        "registry", "export", "--coordinator", address,
        f"--operator-public-key={b64url_encode(coordinator.operator.public_key)}",
        "--out", str(export), *tls(coordinator, "client"),
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    registry = json.loads((export / "registry.json").read_text())
    assert list(registry["deployers"]) == ["deployer-x"]

    # Offline: sign the revocation against the exported log, with no connection at all, then submit.
    statement = tmp_path / "revoke.json"
    offline = cli(
        "operator", "revoke-key", "--key", operator_key, "--deployer", "deployer-x", "--key-id", deployer.key_id,
        "--log", str(export / "registry-log.json"), "--out", str(statement), "--note", "laptop stolen",
    )  # fmt: skip
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["sequence"] == 1
    submitted = cli(
        "operator", "submit", "--statement", str(statement), "--head-file", operator_key.replace(".jwk", ".head.json"),
        "--coordinator", address, *tls(coordinator, "operator"),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    again = cli(
        "operator", "submit", "--statement", str(statement), "--head-file", operator_key.replace(".jwk", ".head.json"),
        "--coordinator", address, *tls(coordinator, "operator"),
    )  # fmt: skip
    # Submitted again (a retry, perhaps at another coordinator replica): answered as accepted, the log
    # unchanged (spec 7.3: a statement already in the log is not appended twice).
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["sequence"] == json.loads(submitted.stdout)["sequence"]

    exported = cli(
        "registry", "export", "--coordinator", address,
        f"--operator-public-key={b64url_encode(coordinator.operator.public_key)}",
        "--out", str(export), *tls(coordinator, "client"),
    )  # fmt: skip
    keys = json.loads((export / "registry.json").read_text())["deployers"]["deployer-x"]["keys"]
    assert keys[0]["revoked_ms"] is not None


def test_statement_for_an_unknown_key_is_refused_offline_before_it_is_written(
    coordinator: LocalMesh, tmp_path: Path
) -> None:
    log = tmp_path / "registry-log.json"
    log.write_text(json.dumps({"statements": []}))
    out = tmp_path / "never.json"
    key = str(coordinator.workdir / "keys" / "operator.jwk")
    result = cli(
        "operator", "revoke-key", "--key", key, "--deployer", "deployer-x",
        "--key-id", "ed25519:" + "0" * 32, "--log", str(log), "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 2
    assert "INVALID_STATEMENT" in result.stderr
    assert not out.exists()


def test_a_deployer_key_cannot_sign_statements(coordinator: LocalMesh, tmp_path: Path) -> None:
    address = coordinator.daemons["coordinator"].address
    impostor = str(coordinator.workdir / "keys" / "deployer-a.jwk")
    result = cli(
        "operator", "enrol", "--key", impostor, "--deployer", "deployer-a",
        f"--public-key={b64url_encode(coordinator.deployer_keys['deployer-a'].public_key)}",
        "--coordinator", address, *tls(coordinator, "operator"),
    )  # fmt: skip
    assert result.returncode == 2
    assert "BAD_STATEMENT_SIGNATURE" in result.stderr
