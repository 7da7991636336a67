"""bench/workflow.py measures what it says: the graph under each condition, its table beside the paper's."""

from __future__ import annotations

import pytest

from bench import workflow

pytestmark = pytest.mark.daemons


def test_every_condition_runs_and_the_table_prints_beside_the_paper() -> None:
    results = {
        "warmup": 2,
        "runs": 5,
        **workflow.in_process_interleaved(2, 5),
        "signed_dag_mtls": workflow.over_mtls(2, 5),
    }
    assert results["unsigned_graph_run"]["n"] == 5 and results["raw_ed25519_sign_ms"] > 0
    for key in ("linked_list_in_process", "signed_dag_in_process", "signed_dag_mtls"):
        figures = results[key]
        assert figures["node"]["n"] == 15 and figures["task"]["n"] == 5 and figures["verify"]["n"] == 5
        assert set(figures["by_node"]) == {"planner", "researcher", "writer"}
        assert 0 < figures["node"]["mean"] <= figures["task"]["mean"] < figures["graph_run"]["mean"]
    floor = results["signing_floor_in_process"]
    assert floor["node"]["n"] == 15 and "verify" not in floor
    assert 0 < floor["node"]["mean"] <= floor["task"]["mean"]
    # Co-signing over mTLS costs more than co-signing in one process, which costs more than none.
    assert results["signed_dag_mtls"]["task"]["mean"] > results["linked_list_in_process"]["task"]["mean"]
    table = workflow.report(results)
    assert "| paper: LINKED-LIST, one process (M1 Pro) | 0.171 | 0.214 | 0.512 | – | 0.832 | 1.013 |" in table
    assert "SIGNED-DAG, co-signed by signer daemons over mTLS" in table
    assert f"| {workflow.FLOOR_LABEL} | " in table
