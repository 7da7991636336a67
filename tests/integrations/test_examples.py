"""examples/langgraph_*.py, mcp_*.py, a2a_*.py and openai_agents_*.py run as a user runs them: each starts
its own local mesh (real daemons, loopback, mTLS), runs its graph (its tool calls, its task, its agent
run), verifies every output and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(name: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


def test_the_examples_are_all_run_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("langgraph_*.py")) == ["langgraph_async.py", "langgraph_research.py"]


def test_the_sync_research_chain() -> None:
    lines = run("langgraph_research.py")
    assert "lineage: deployer-a -> deployer-b -> deployer-c" in lines
    assert [line for line in lines if line.startswith("verified")] == [
        "verified planner: ACCEPT emitted by deployer-a",
        "verified researcher: ACCEPT emitted by deployer-b",
        "verified writer: ACCEPT emitted by deployer-c",
    ]
    assert "tampered draft: ['OUTPUT_MISMATCH']" in lines


def test_the_async_graph_started_by_a_handoff() -> None:
    lines = run("langgraph_async.py")
    assert "lineage: deployer-a -> deployer-b -> deployer-c" in lines
    assert [line for line in lines if line.startswith("verified")] == [
        "verified researcher: ACCEPT emitted by deployer-b",
        "verified writer: ACCEPT emitted by deployer-c",
    ]


def test_the_a2a_examples_are_all_run_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("a2a_*.py")) == ["a2a_delegation.py"]


def test_the_a2a_delegation() -> None:
    lines = run("a2a_delegation.py")
    assert "card deployer: deployer-b" in lines
    assert "task: TASK_STATE_COMPLETED" in lines
    assert "verified: ACCEPT emitted by deployer-b" in lines
    assert "lineage: deployer-a -> deployer-b -> deployer-b" in lines
    assert "tampered artifact: OUTPUT_MISMATCH" in lines
    assert "delegation for deployer-c: TASK_STATE_FAILED GRANT_WRONG_CHILD" in lines


def test_the_mcp_client_and_server() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("mcp_*.py")) == ["mcp_client.py", "mcp_server.py"]
    lines = run("mcp_client.py")
    for label in ("middleware", "mcp-proxy"):
        assert [line for line in lines if line.startswith(f"{label}:")] == [
            f"{label}: ACCEPT emitted by deployer-b seq {seq}" for seq in range(3)
        ]
        assert f"{label} session: ACCEPT" in lines
    assert any(line.startswith("evidence: ") and line.split()[1].isdigit() for line in lines)
    assert "dropped result: SESSION_GAP" in lines
    assert "tampered result: OUTPUT_MISMATCH" in lines


def test_the_openai_agents_hand_off() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("openai_agents_*.py")) == ["openai_agents_support.py"]
    lines = run("openai_agents_support.py")
    assert "lineage: triage@deployer-a -> billing@deployer-b" in lines
    assert [line for line in lines if line.startswith("verified")] == [
        "verified tool result call-1: ACCEPT emitted by deployer-b",
        "verified tool result call-2: ACCEPT emitted by deployer-b",
        "verified final output: ACCEPT emitted by deployer-b",
    ]
    assert "tampered tool result: ['OUTPUT_MISMATCH']" in lines
