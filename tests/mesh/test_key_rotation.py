"""Key rotation with continuity against real daemons, exactly as docs/operations.md walks it: add the
new key, the old key endorses it, the signer switches, the old key is retired after an overlap, and
the mesh never stops (the other deployer's signer and the verifier serve throughout). Paths signed
with the old key before its retirement still verify; new issuance uses the new key; the registry's
custody chain shows old -> new unbroken, and a key added without an endorsement breaks it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path as FilePath

import pytest

from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import LocalMesh
from signer.backends.file import write_key_file
from tests.mesh.helpers import now_ms, sha256

pytestmark = pytest.mark.daemons

OUT_OLD, OUT_OLD_2, OUT_NEW = b"signed by the old key\n", b"also the old key\n", b"signed by the new key\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def operator_tls(mesh: LocalMesh) -> list[str]:
    tls = mesh.tls_for("operator")
    return ["--ca", tls.ca, "--cert", tls.cert, "--tls-key", tls.key]


def custody(mesh: LocalMesh) -> tuple[int, dict[str, object]]:
    result = cli(
        "registry", "custody", f"--operator-public-key={b64url_encode(mesh.operator.public_key)}",
        "--deployer", "deployer-a", "--coordinator", mesh.daemons["coordinator"].address,
        *["--ca", mesh.tls_for("client").ca, "--cert", mesh.tls_for("client").cert],
        *["--tls-key", mesh.tls_for("client").key],
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_rotation_with_overlap_keeps_old_paths_valid_and_the_chain_unbroken(
    make_mesh: Callable[..., LocalMesh], tmp_path: FilePath
) -> None:
    mesh = make_mesh(deployers=("deployer-a", "deployer-b"))
    old_key = mesh.deployer_keys["deployer-a"]
    new_key = Ed25519Signer.generate()
    coordinator = mesh.daemons["coordinator"].address
    verifier = mesh.verifier_client()
    b = mesh.runtime("deployer-b")
    a = mesh.runtime("deployer-a")
    old_root = a.root("rotating-agent", "rotation", max_children=4)
    old_path = a.receipt(old_root, sha256(OUT_OLD))
    old_path_2 = a.receipt(old_root, sha256(OUT_OLD_2))
    a.close()
    assert old_path.leaf.key_id == old_key.key_id

    # 1. The operator adds the new key (valid from now): both keys are valid during the overlap.
    operator = mesh.operator_client()
    try:
        operator.submit(
            StatementKind.ADD_KEY, "deployer-a", new_key.key_id, public_key=b64url_encode(new_key.public_key),
            at_ms=now_ms(),
        )  # fmt: skip
    finally:
        operator.close()
    mesh.wait_for_registry(3)

    # 2. The old key endorses the new one (deployer side), the operator records it (operator side).
    new_public = b64url_encode(new_key.public_key)
    endorsement = tmp_path / "endorsement.json"
    signed = cli(
        "key", "endorse", "--signer-key", f"file:{mesh.workdir / 'keys' / 'deployer-a.jwk'}",
        "--deployer", "deployer-a", f"--new-public-key={new_public}", "--out", str(endorsement),
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    assert json.loads(signed.stdout)["old_key_id"] == old_key.key_id
    recorded = cli(
        "operator", "endorse-key", "--key", str(mesh.workdir / "keys" / "operator.jwk"),
        "--endorsement", str(endorsement), "--coordinator", coordinator, *operator_tls(mesh),
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads(recorded.stdout)["sequence"] == 3
    mesh.wait_for_registry(4)

    # 3. The signer switches to the new key: one daemon restarts, on its port; the rest keep serving.
    mesh.stop("deployer-a")
    assert verifier.verify(old_path.to_bytes(), OUT_OLD).result, "the verifier serves while deployer-a restarts"
    key_file = mesh.workdir / "keys" / "deployer-a.jwk"
    key_file.unlink()
    write_key_file(key_file, new_key)
    mesh.start("deployer-a")
    a = mesh.runtime("deployer-a")
    try:
        new_root = a.root("rotated-agent", "rotation")
        assert new_root.leaf.key_id == new_key.key_id
        assert verifier.verify(a.receipt(new_root, sha256(OUT_NEW)).to_bytes(), OUT_NEW).result
        # A record of the old key stays a parent: its new children carry the new key, and a
        # delegation from it to deployer-b is co-signed by the new key.
        under_old = a.receipt(old_root, sha256(OUT_NEW))
        assert under_old.leaf.key_id == new_key.key_id
        assert verifier.verify(under_old.to_bytes(), OUT_NEW).result
        grant = a.open_grant(old_root, "deployer-b")
        assert grant.parent_key_id == new_key.key_id
        delegated = b.accept(old_root, grant, mesh.daemons["deployer-a"].address, "rotated-child")
        delegated_output = b.receipt(delegated, sha256(OUT_NEW))
        assert verifier.verify(delegated_output.to_bytes(), OUT_NEW).result

        # 4. After the overlap, the old key is retired: what it signed before still verifies.
        retired_at = now_ms()
        operator = mesh.operator_client()
        try:
            operator.submit(StatementKind.RETIRE_KEY, "deployer-a", old_key.key_id, at_ms=retired_at)
        finally:
            operator.close()
        mesh.wait_for_registry(5)
        assert verifier.verify(old_path_2.to_bytes(), OUT_OLD_2).result
        assert a.root("after-retirement", "rotation").leaf.key_id == new_key.key_id
    finally:
        a.close()
        b.close()
        verifier.close()

    code, chain = custody(mesh)
    assert code == 0 and chain["unbroken"] is True
    keys = chain["keys"]
    assert isinstance(keys, list)
    assert [(k["key_id"], k["endorsed_by"]) for k in keys] == [(old_key.key_id, None), (new_key.key_id, old_key.key_id)]
    assert keys[0]["retired_ms"] == retired_at

    # A key the operator adds without an endorsement is a visible break in the chain.
    stranger = Ed25519Signer.generate()
    operator = mesh.operator_client()
    try:
        operator.submit(
            StatementKind.ADD_KEY, "deployer-a", stranger.key_id, public_key=b64url_encode(stranger.public_key),
            at_ms=now_ms(),
        )  # fmt: skip
    finally:
        operator.close()
    code, chain = custody(mesh)
    assert code == 1 and chain["unbroken"] is False
    assert chain["keys"][-1]["key_id"] == stranger.key_id and chain["keys"][-1]["continuous"] is False  # type: ignore[index]
