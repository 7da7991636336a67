"""docs/quickstart-runtime.md runs as printed: its python blocks, in order, in one fresh interpreter,
against a real mesh on loopback with mTLS. Only the environment (the variables the page names) says
which runtime or consumer each block is."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.client import verify_offline
from countersign.records import Path as EvidencePath
from countersign_cli.localmesh import LocalMesh
from tests.runtime.conftest import mesh_registry, runtime_env

pytestmark = pytest.mark.daemons

QUICKSTART = Path(__file__).parents[2] / "docs" / "quickstart-runtime.md"
# Which environment each python block runs in, in the page's order.
ROLES = ["deployer-a", None, "deployer-a", "deployer-b", "deployer-a", None]
DRIVER = """
import json, os, sys
namespace = {}
for code, env in json.loads(sys.stdin.read()):
    os.environ.update(env)
    exec(compile(code, "quickstart-runtime.md", "exec"), namespace)
answer = {"handoff": namespace.get("handoff"), "receipt": namespace["receipt"].to_bytes().decode()}
if "closed" in namespace:  # the sessions block ran
    closed = namespace["closed"]
    answer["closed"] = [closed.count, closed.last, namespace["receipts"][-1].leaf.digest()]
    answer["chunks"] = [[c.seq, c.units, c.closed] for c in namespace["chunks"]]
print(json.dumps(answer))
"""


def blocks() -> list[tuple[str, str]]:
    """(section title, code) of each python block."""
    found = []
    for section in QUICKSTART.read_text().split("\n## ")[1:]:
        title = section.split("\n", 1)[0]
        found += [(title, code) for code in re.findall(r"```python\n(.*?)```", section, re.S)]
    return found


def code_lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def test_the_page_keeps_its_budget() -> None:
    sections = dict(blocks())
    assert code_lines(sections["Producer"]) <= 10
    assert code_lines(sections["Consumer"]) <= 5
    assert len(blocks()) == len(ROLES)


def test_every_block_runs_as_printed(runtime_mesh: LocalMesh, tmp_path: Path) -> None:
    plan = [[code, runtime_env(runtime_mesh, role)] for (_, code), role in zip(blocks(), ROLES, strict=True)]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], input=json.dumps(plan), cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    # The consumer's print: who emitted the producer's output.
    deployer, key_id, agent, session, seq = lines[0].split()
    assert (deployer, agent, session, seq) == ("deployer-a", "writer-1", "writer-1", "0")
    assert key_id == runtime_mesh.deployer_keys["deployer-a"].key_id
    # The session consumer's print: the last output's session and seq, receipts, closed.
    assert lines[1].split() == ["chat-2", "2", "3", "False"]
    answer = json.loads(lines[-1])
    assert answer["handoff"].startswith("cs1.")
    # The delegation block's receipt: deployer-b's output under deployer-a's planner, co-signed.
    receipt = EvidencePath.from_bytes(answer["receipt"].encode())
    assert [e.record.deployer for e in receipt.envelopes] == ["deployer-a", "deployer-b", "deployer-b"]
    assert len(receipt.envelopes[1].record.cosigs) == 2
    assert verify_offline(receipt, b"notes from three sources\n", mesh_registry(runtime_mesh))
    assert (tmp_path / "receipt.json").exists()
    # The sessions block: three turns closed, and a 22-byte stream in chunks of 8, then its close.
    count, last, third = answer["closed"]
    assert (count, last) == (3, third)
    assert answer["chunks"] == [[0, 8, False], [1, 8, False], [2, 6, False], [3, 0, True]]


def test_the_consumer_block_verifies_offline_too(runtime_mesh: LocalMesh, registry_file: str, tmp_path: Path) -> None:
    sections = dict(blocks())
    env = runtime_env(runtime_mesh, None)
    env.pop("COUNTERSIGN_VERIFIER")
    plan = [
        [sections["Producer"], runtime_env(runtime_mesh, "deployer-a")],
        [sections["Consumer"], {**env, "COUNTERSIGN_REGISTRY": registry_file}],
    ]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER], input=json.dumps(plan), cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("deployer-a ")
