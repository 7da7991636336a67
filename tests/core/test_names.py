"""A public name means one thing in the house: no two modules define the same top-level function or
class, unless the table below says why (issue 31: ``Grant``, ``RetryPolicy``, ``verify_session``,
``check_session``, ``session_evidence``, ``load_registry`` and ``now_ms`` each meant two things)."""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest

from tests.core.test_purity import house_modules

pytestmark = pytest.mark.offline

# Names several modules define on purpose, or have not yet been given their own: each with why.
SHARED_ON_PURPOSE = {
    "register": "each command module's hook: main adds each module's commands to the tree",
    "register_registry_actions": "the two halves of the `registry` command (offline and asking a coordinator)",
    "SqliteState": "each daemon's store on that backend (signer.stores, verifier.stores): the package says whose",
    "PostgresState": "as SqliteState",
    "DynamoDbState": "as SqliteState",
}
NOT_YET_ONE = {  # the DynamoDB and PostgreSQL plumbing the verifier's stores still keep their own copy of
    "DynamoDbSettings": "verifier.stores.dynamodb beside countersign._daemon.dynamodb",
    "ensure_table": "verifier.stores.dynamodb beside countersign._daemon.dynamodb",
    "make_client": "verifier.stores.dynamodb beside countersign._daemon.dynamodb",
    "parse_url": "verifier.stores.postgres and verifier.stores.dynamodb, each its own URL",
    "Daemon": "countersign._daemon.server's running daemon beside countersign_cli.localmesh's child process",
    "refusal_error": "the servicer edge's beside the MCP integration's",
}
ONCE = ("Grant", "RetryPolicy", "verify_session", "check_session", "session_evidence", "load_registry", "now_ms")


def definitions(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each public top-level function or class name -> the modules that define it."""
    found: dict[str, list[str]] = defaultdict(list)
    for module, source in sources.items():
        for node in ast.parse(source).body:
            defined = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            if defined and not node.name.startswith("_"):
                found[node.name].append(module)
    return found


def collisions(sources: dict[str, str]) -> dict[str, list[str]]:
    allowed = SHARED_ON_PURPOSE.keys() | NOT_YET_ONE.keys()
    return {name: where for name, where in definitions(sources).items() if len(where) > 1 and name not in allowed}


def house_sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in house_modules() if "_proto" not in name}


def test_no_two_modules_define_the_same_public_name() -> None:
    assert not collisions(house_sources())


def test_each_name_the_issue_found_twice_is_defined_once_at_most() -> None:
    found = definitions(house_sources())
    assert {name: found[name] for name in ONCE if len(found[name]) > 1} == {}


def test_the_exceptions_are_still_shared() -> None:
    """An exception that no longer holds leaves the table (so that the table stays the truth)."""
    found = definitions(house_sources())
    assert [name for name in SHARED_ON_PURPOSE.keys() | NOT_YET_ONE.keys() if len(found[name]) < 2] == []


def test_a_second_definition_is_caught() -> None:
    sources = {
        "countersign.signer_state": "class Grant:\n    pass\n",
        "countersign.handoff": "class Grant:\n    pass\n",
        "countersign.client.failover": "def _helper():\n    pass\n",
        "signer.backends.awskms": "def _helper():\n    pass\n",
    }
    assert collisions(sources) == {"Grant": ["countersign.signer_state", "countersign.handoff"]}
