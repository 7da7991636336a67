"""The README's client SDK example runs as printed against a real mesh (only the addresses and the
certificate paths are this mesh's)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from countersign.client import VerifierClient
from countersign.reasons import Reason
from countersign.records import Path as EvidencePath
from countersign_cli.localmesh import LocalMesh

pytestmark = pytest.mark.daemons

README = Path(__file__).parents[2] / "README.md"


def example() -> str:
    section = README.read_text().split("## Client SDK\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "the Client SDK section of README.md has no python example"
    return found.group(1)


def test_the_readme_example_runs(client_mesh: LocalMesh) -> None:
    pki = client_mesh.workdir / "pki"
    code = (
        example()
        .replace("127.0.0.1:7401", client_mesh.daemons["deployer-a"].address)
        .replace("127.0.0.1:7402", client_mesh.daemons["verifier-0"].address)
        .replace('"ca.pem"', repr(str(pki / "ca.pem")))
        .replace('"runtime.pem"', repr(str(pki / "deployer-a-runtime.pem")))
        .replace('"runtime.key"', repr(str(pki / "deployer-a-runtime.key")))
    )
    output = b"the README's output\n"
    scope: dict[str, object] = {"hashlib": hashlib, "output": output}
    exec(compile(code, str(README), "exec"), scope)  # the repository's own README
    receipt = scope["receipt"]
    assert isinstance(receipt, EvidencePath) and receipt.leaf.record.deployer == "deployer-a"
    with VerifierClient(client_mesh.daemons["verifier-0"].address, client_mesh.tls_for("client")) as verifier:
        assert verifier.verify(receipt, output).reason is Reason.NONCE_REPLAYED  # the example accepted it
