"""The integrations check evidence with a :class:`countersign.client.Consumer` and nothing else (ADR
0033): where and how to check (verifier or registry, TLS, policy, state, clock) are the consumer's, so
no check of LangGraph, MCP or A2A takes them one by one, and each answers with the one verdict shape."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable

import pytest

from countersign.client import Consumer, EvidenceVerdict
from countersign.integrations import a2a, langgraph, mcp

pytestmark = pytest.mark.offline

CHECKS: list[Callable[..., object]] = [
    langgraph.verify_state, langgraph.averify_state, mcp.verify_result, mcp.averify_result, mcp.check_session,
    mcp.acheck_session, a2a.verify_artifact, a2a.averify_artifact,
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
    assert signature.return_annotation in (EvidenceVerdict, "EvidenceVerdict", langgraph.StateVerdict)
    if signature.return_annotation is langgraph.StateVerdict:  # a graph's outputs, each the one shape
        assert (
            typing.get_type_hints(langgraph.StateVerdict)["outputs"]
            == tuple[tuple[langgraph.SignedOutput, EvidenceVerdict], ...]
        )


def test_every_consumer_side_function_of_the_integrations_is_listed() -> None:
    """A new check added to an integration must take the consumer too (and be listed above)."""
    for module in (langgraph, mcp, a2a):
        for name, function in vars(module).items():
            checks = "verify" in name or name.endswith("check_session")
            if checks and inspect.isfunction(function) and function.__module__ == module.__name__:
                assert function in CHECKS, f"{module.__name__}.{name}"
