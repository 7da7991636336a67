"""The integrations check evidence with a :class:`countersign.client.Consumer` and nothing else (ADR
0034): where and how to check (verifier or registry, TLS, policy, state, clock) are the consumer's, so
no check of LangGraph, MCP, A2A or the OpenAI Agents SDK takes them one by one, and each answers with the
one verdict shape (or the kit's OutputVerdicts of it, one per output). The integrations are those the
extras registry names (``countersign.extras.EXTRAS``), so a new one is held to this without a line here."""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import countersign.integrations
from countersign.client import Consumer, EvidenceVerdict
from countersign.extras import EXTRAS
from countersign.integrations import kit, langgraph, mcp

pytestmark = pytest.mark.offline

INTEGRATIONS: list[ModuleType] = [
    importlib.import_module(module) for module in EXTRAS.values() if module.startswith("countersign.integrations.")
]
# Every consumer-side check of every integration: a function of its own named *verify* or *check_session*.
CHECKS: list[Callable[..., object]] = [
    function
    for module in INTEGRATIONS
    for name, function in vars(module).items()
    if ("verify" in name or name.endswith("check_session"))
    and inspect.isfunction(function)
    and function.__module__ == module.__name__
]
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


def test_the_checks_are_found_in_every_integration_the_registry_names() -> None:
    """The derivation above finds what it must (a broken one would hold nothing to the test)."""
    names = {module.__name__.rsplit(".", 1)[1] for module in INTEGRATIONS}
    assert names >= {"langgraph", "mcp", "a2a", "openai_agents"}
    assert {mcp.verify_result, mcp.acheck_session, langgraph.averify_state} <= set(CHECKS)
    assert len(CHECKS) >= 10 and {check.__module__ for check in CHECKS} == {m.__name__ for m in INTEGRATIONS}


def test_every_integration_module_is_in_the_extras_registry() -> None:
    """An integration is one module and one registry line: its extra in ``EXTRAS`` (the install hints,
    the packaging test and this test read it). The kit is the integrations' own floor, not one."""
    package = Path(countersign.integrations.__file__).parent
    modules = {f"countersign.integrations.{p.stem}" for p in package.glob("*.py") if not p.stem.startswith("_")}
    assert modules - {kit.__name__} == {module.__name__ for module in INTEGRATIONS}
