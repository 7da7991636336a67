"""bench/live_workflow.py measures what it says: three processes, every condition, the table beside the paper."""

from __future__ import annotations

import pytest

from bench import live_workflow

pytestmark = [pytest.mark.daemons, pytest.mark.slow]


def test_every_condition_runs_across_the_processes_and_the_table_prints_beside_the_paper() -> None:
    results = live_workflow.run(warmup=1, tasks=3)
    conditions = results["conditions"]
    assert set(conditions) == {"none", "linked_list", "signed_dag"}
    for name, figures in conditions.items():
        assert figures["e2e"]["n"] == 3 and figures["e2e"]["mean"] > 0
        if name == "none":
            assert figures["evidence_bytes"] == 0 and figures["issuance"]["n"] == 0
            continue
        assert figures["verify"]["n"] == 3 and figures["issuance"]["n"] == 3
        assert figures["evidence_bytes"] > 1_000 and figures["tool_receipt_bytes"] > 1_000
    # The co-signed edge is carried as a handoff (grant and parent path), larger than the bare parent path.
    assert conditions["signed_dag"]["handoff_bytes"] > conditions["linked_list"]["handoff_bytes"] > 0
    assert conditions["signed_dag"]["online_verify"]["n"] == 3
    assert results["child_key_only"]["linked_list"] == "ACCEPT"
    assert results["child_key_only"]["signed_dag"].startswith("REJECT")
    table = live_workflow.report(results)
    assert "| paper (E12) | – | – | – | 42.3 | – | 11.6 | 16.7 | 1,868 / 2,096 |" in table
    assert "A claim made with the child's key alone: LINKED-LIST ACCEPT; SIGNED-DAG REJECT" in table


def test_the_generator_is_deterministic_and_depends_on_its_inputs() -> None:
    fact = live_workflow.lookup_fact("q")
    assert live_workflow.generate("q", fact) == live_workflow.generate("q", fact)
    assert live_workflow.generate("q", fact) != live_workflow.generate("r", fact)
    assert live_workflow.generate("q", fact).startswith(fact)
