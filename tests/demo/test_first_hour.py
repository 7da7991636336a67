"""The first hour, as printed: from an empty directory, ``countersign demo --keep-running --workdir mesh``
(started as the pages say, in a second terminal), then every ``sh`` and ``python`` block of the README
and of docs/quickstart-runtime.md in order, as a user pastes them; then every example against that
mesh (``COUNTERSIGN_MESH``), not a private one. The ``pip install`` lines: tests/packaging."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign.consumer import parse_registry, verify_offline
from countersign.records import Path as EvidencePath
from tests.demo.doc_blocks import (
    KEPT_MESH,
    Block,
    KeptMesh,
    blocks,
    command_of,
    missing_from_source,
    run_page,
    start_kept_mesh,
)

REPO = Path(__file__).parents[2]
README = REPO / "README.md"
QUICKSTART = REPO / "docs" / "quickstart-runtime.md"
EXAMPLES = REPO / "examples"


def clean_env() -> dict[str, str]:
    """The test's environment without any Countersign setting: only what the pages set counts."""
    return {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")}


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeptMesh]:
    with start_kept_mesh(tmp_path_factory.mktemp("first-hour")) as mesh:
        yield mesh


def code_lines(block: Block) -> int:
    return sum(1 for line in block.code.splitlines() if line.strip())


def runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.language in ("sh", "python") and not b.info]


@pytest.mark.offline
def test_the_pages_keep_their_budget_and_start_from_the_kept_mesh() -> None:
    sections = {b.section: b for b in runnable(QUICKSTART) if b.language == "python"}
    assert code_lines(sections["Producer"]) <= 10
    assert code_lines(sections["Consumer"]) <= 5
    for page in (README, QUICKSTART):
        first = next(b for b in runnable(page) if KEPT_MESH in b.code)
        assert runnable(page).index(first) < min(i for i, b in enumerate(runnable(page)) if b.language == "python")
    excerpts = [b for page in (README, QUICKSTART) for b in blocks(page) if b.info.startswith("from ")]
    assert len(excerpts) == 5
    assert {block.info: missing_from_source(block, REPO) for block in excerpts} == {b.info: [] for b in excerpts}


@pytest.mark.daemons
@pytest.mark.slow
def test_the_quickstart_runs_as_printed(kept: KeptMesh) -> None:
    run = run_page(QUICKSTART, kept.cwd, clean_env())
    try:
        assert {command_of(line) for line in run.skipped} == {
            "python3 -m venv .venv && . .venv/bin/activate", "pip install 'countersign-mesh[server]'", KEPT_MESH,
        }  # fmt: skip
        printed = "".join(run.outputs).splitlines()
        # The consumer's print: who emitted the producer's output (online: consumer.env).
        registry = parse_registry((kept.root / "registry.json").read_bytes())
        (key_id,) = registry.deployers["deployer-a"]
        assert printed[0].split() == ["deployer-a", key_id, "writer-1", "0"]
        # The session consumer's print: the last output's session and seq, receipts, closed.
        assert printed[1].split() == ["chat-2", "2", "3", "False"]
        assert str(run.value("handoff")).startswith("cs1.")
        receipt = EvidencePath.from_bytes(str(run.value("receipt.to_bytes().decode()")).encode())
        # The delegation block's receipt: deployer-b's output under deployer-a's planner, co-signed.
        assert [e.record.deployer for e in receipt.envelopes] == ["deployer-a", "deployer-b", "deployer-b"]
        assert len(receipt.envelopes[1].record.cosigs) == 2
        now = receipt.leaf.record.created_ms
        assert verify_offline(receipt, b"notes from three sources\n", registry, now_ms=now, audit=True)
        assert run.value("[closed.count, closed.last == receipts[-1].leaf.digest()]") == [3, True]
        assert run.value("[[c.seq, c.units, c.closed] for c in chunks]") == [
            [0, 8, False], [1, 8, False], [2, 6, False], [3, 0, True],
        ]  # fmt: skip
        assert (kept.cwd / "receipt.json").exists()
        assert run.value("consumer.is_online") is True  # consumer.env: the verifier checked
    finally:
        run.close()


@pytest.mark.daemons
@pytest.mark.slow
def test_the_consumer_block_checks_offline_with_the_offline_settings(kept: KeptMesh, tmp_path: Path) -> None:
    """The page's Producer, then its Consumer in a shell that sourced ``consumer-offline.env`` instead."""
    run = run_page(QUICKSTART, kept.cwd, clean_env(), only={"Producer"})
    try:
        run.run(Block("sh", "", ". mesh/consumer.env\n. mesh/consumer-offline.env\n", "offline"))
        assert "COUNTERSIGN_VERIFIER" not in run.env and run.env["COUNTERSIGN_REGISTRY"].endswith("registry.json")
        (consumer,) = [b for b in runnable(QUICKSTART) if b.section == "Consumer" and b.language == "python"]
        assert run.run(consumer).split()[0] == "deployer-a"
        assert run.value("consumer.is_online") is False and run.value("verdict.request_id") == ""
    finally:
        run.close()


@pytest.mark.daemons
@pytest.mark.slow
def test_the_readme_runs_as_printed(kept: KeptMesh) -> None:
    run = run_page(README, kept.cwd, clean_env())
    try:
        assert KEPT_MESH in {command_of(line) for line in run.skipped}
        assert all(command_of(line).startswith("pip install") for line in run.skipped if KEPT_MESH not in line)
        assert run.value("verdict.emitter.agent") == "planner-1"
        assert run.value("consumer.is_online") is True  # checked by the verifier, which consumed it
    finally:
        run.close()


def example(name: str, kept: KeptMesh) -> list[str]:
    env = {**clean_env(), "COUNTERSIGN_MESH": str(kept.root / "mesh.json")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"on the mesh of {kept.root / 'mesh.json'}" in done.stderr  # not a private one
    return done.stdout.splitlines()


@pytest.mark.daemons
@pytest.mark.slow
def test_the_examples_run_on_the_users_mesh(kept: KeptMesh) -> None:
    research = example("langgraph_research.py", kept)
    assert "lineage: deployer-a -> deployer-b -> deployer-c" in research
    assert "verified writer: ACCEPT emitted by deployer-c" in research
    assert "verified researcher: ACCEPT emitted by deployer-b" in example("langgraph_async.py", kept)
    a2a = example("a2a_delegation.py", kept)
    assert "verified: ACCEPT emitted by deployer-b" in a2a and "tampered artifact: OUTPUT_MISMATCH" in a2a
    mcp = example("mcp_client.py", kept)
    assert "mcp-proxy: ACCEPT emitted by deployer-b seq 2" in mcp and "dropped result: SESSION_GAP" in mcp
    agents = example("openai_agents_support.py", kept)
    assert "verified final output: ACCEPT emitted by deployer-b" in agents
