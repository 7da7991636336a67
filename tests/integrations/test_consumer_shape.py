"""The integrations check evidence with a :class:`countersign.client.Consumer` and nothing else (ADR
0034): where and how to check (verifier or registry, TLS, policy, state, clock) are the consumer's, so
no check of LangGraph, MCP, A2A or the OpenAI Agents SDK takes them one by one, and each answers with the
one verdict shape (or the kit's OutputVerdicts of it, one per output)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import pytest

from countersign.client import Consumer, EvidenceVerdict
from countersign.integrations import a2a, kit, langgraph, mcp, openai_agents

pytestmark = pytest.mark.offline

CHECKS: list[Callable[..., object]] = [
    langgraph.verify_state, langgraph.averify_state, mcp.verify_result, mcp.averify_result, mcp.check_session,
    mcp.acheck_session, a2a.verify_artifact, a2a.averify_artifact, openai_agents.verify_run, openai_agents.averify_run,
]  # fmt: skip
WHERE_AND_HOW = {"verifier", "registry", "tls", "environ", "consumer_policy", "state", "now_ms", "policy"}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: f"{c.__module__.rsplit('.', 1)[1]}.{c.__name__}")
def test_each_check_takes_the_consumer_and_answers_the_one_verdict(check: Callable[..., object]) -> None:
    signature = inspect.signature(check)  # annotations as written: a2a's types are imported lazily
    parameters, names = signature.parameters, list(signature.parameters)
    assert names[1] == "consumer" and parameters["consumer"].annotation in (Consumer, "Consumer")
    assert parameters["consumer"].default is inspect.Parameter.empty  # required: nothing is guessed
    assert set(names[2:]) <= {"audit", "require_closed"}, names
    assert not WHERE_AND_HOW & set(names[1:])
    returned = signature.return_annotation
    if isinstance(returned, str) and returned != "EvidenceVerdict":  # postponed annotations
        returned = vars(inspect.getmodule(check))[returned]
    assert returned in (EvidenceVerdict, "EvidenceVerdict") or issubclass(returned, kit.OutputVerdicts)
    if returned not in (EvidenceVerdict, "EvidenceVerdict"):  # a run's outputs, each the one shape
        pair, ellipsis = typing.get_args(typing.get_type_hints(returned)["outputs"])
        what, verdict = typing.get_args(pair)
        assert ellipsis is Ellipsis
        assert verdict is EvidenceVerdict and what is not EvidenceVerdict


def test_every_consumer_side_function_of_the_integrations_is_listed() -> None:
    """A new check added to an integration must take the consumer too (and be listed above)."""
    for module in (langgraph, mcp, a2a, openai_agents):
        for name, function in vars(module).items():
            checks = "verify" in name or name.endswith("check_session")
            if checks and inspect.isfunction(function) and function.__module__ == module.__name__:
                assert function in CHECKS, f"{module.__name__}.{name}"
