"""A client pointed at the wrong daemon of the mesh (issue 29): a certificate of the right CA but
another role or deployer used to surface as retryable ``UNAVAILABLE ... Hostname Verification Check
failed``, and the command line asked "is it running". Now it is ``WRONG_SERVER``, not retryable,
saying what the server is and what was expected, in the SDK (sync and asyncio, unary calls and
lanes) and on the command line."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.client import AsyncVerifierClient, ServiceError, SignerClient, VerifierClient
from countersign.errors import ErrorCode
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import service_error

pytestmark = pytest.mark.daemons


def wrong(error: ServiceError, found: str, expected: str) -> None:
    assert (error.code, error.retryable) == (ErrorCode.WRONG_SERVER, False), error
    assert f"is {found}" in str(error) and f"not {expected}" in str(error), error
    assert "Hostname Verification" not in str(error)


def test_a_verifier_client_pointed_at_a_signer_is_told_so(mesh: LocalMesh) -> None:
    signer = mesh.daemons["deployer-a"].address
    for lanes in (4, 0):  # VerifyPaths lanes and the unary VerifyPath alike
        client = VerifierClient(signer, mesh.tls_for("client"), lanes=lanes)
        try:
            wrong(service_error(lambda client=client: client.verify(b"{}", b"x")), "deployer-a's signer", "a verifier")  # type: ignore[misc]
        finally:
            client.close()


def test_a_runtime_pointed_at_another_deployers_signer_is_told_so(mesh: LocalMesh) -> None:
    runtime = SignerClient(mesh.daemons["deployer-b"].address, mesh.tls_for("deployer-a-runtime"), "deployer-a")
    try:
        wrong(service_error(lambda: runtime.root("planner", "wrong")), "deployer-b's signer", "deployer-a's signer")
    finally:
        runtime.close()


def test_an_asyncio_client_pointed_at_the_coordinator_is_told_so(mesh: LocalMesh) -> None:
    async def ask() -> ServiceError:
        async with AsyncVerifierClient(mesh.daemons["coordinator"].address, mesh.tls_for("client")) as client:
            try:
                await client.verify(b"{}", b"x")
            except ServiceError as exc:
                return exc
        raise AssertionError("no error")

    wrong(asyncio.run(ask()), "the coordinator", "a verifier")


def test_the_command_line_says_what_it_reached_instead_of_asking_whether_it_runs(
    mesh: LocalMesh, tmp_path: Path
) -> None:
    sample = tmp_path / "sample"
    made = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "sample-path", "--construction", "signed-dag", "--depth", "2",
         "--out", str(sample)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    tls = mesh.tls_for("client")
    result = subprocess.run(
        [
            sys.executable, "-m", "countersign_cli", "verify", "--path", str(sample / "path.json"),
            "--output", str(sample / "output.bin"), "--verifier", mesh.daemons["deployer-b"].address,
            "--ca", tls.ca, "--cert", tls.cert, "--tls-key", tls.key,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert "WRONG_SERVER" in line and "deployer-b's signer" in line and "not a verifier" in line, line
    assert "is it running" not in line
