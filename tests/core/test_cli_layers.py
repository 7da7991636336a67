"""The command line without cycles: ``main`` parses and dispatches and imports the command modules; a
command module imports what the commands share (``common``) and the helpers beside it, never another
command module nor ``main``; the shared modules import no command. Every import counts, function-level
ones included (the walk of tests/core/test_purity.py)."""

from __future__ import annotations

import pytest

from tests.core.test_purity import REPO, imported_modules

pytestmark = pytest.mark.offline

CLI = REPO / "countersign_cli"
# Each module of the command line, on its floor: entry > dispatch > command > shared. A new module is
# placed here.
FLOOR_OF_MODULE = {
    "countersign_cli.__main__": "entry",
    "countersign_cli.main": "dispatch",
    **{
        f"countersign_cli.{name}": "command"
        for name in ("offline", "audit", "report", "impact", "services", "demo", "mcp_proxy")
    },
    **{
        f"countersign_cli.{name}": "shared"
        for name in ("__init__", "common", "progress", "settings_help", "localmesh", "keep_running", "mcp_relay")
    },
}
# What each floor may import of the command line.
MAY_IMPORT = {
    "entry": {"dispatch"},
    "dispatch": {"command", "shared"},
    "command": {"shared"},
    "shared": {"shared"},
}


def cli_imports(source: str, module: str) -> set[str]:
    """The modules of the command line that ``source`` (the text of ``module``) imports, anywhere in it."""
    found = set()
    for imported in imported_modules(source, module, module.endswith("__init__")):
        name = imported
        while name and name not in FLOOR_OF_MODULE:
            name = name.rpartition(".")[0]  # countersign_cli.common.UsageError -> countersign_cli.common
        if name:
            found.add(name)
    return found


def wrong_imports(module: str, source: str) -> list[str]:
    """The imports of ``module`` that break the command line's floors (or import itself)."""
    allowed = MAY_IMPORT[FLOOR_OF_MODULE[module]]
    imported = cli_imports(source, module) - {module}
    return sorted(name for name in imported if FLOOR_OF_MODULE[name] not in allowed)


def cli_sources() -> dict[str, str]:
    return {f"countersign_cli.{path.stem}": path.read_text() for path in sorted(CLI.glob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle that a depth-first walk of ``graph`` meets (empty for an acyclic graph)."""
    found: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == "open":
                found.append([*trail[trail.index(successor) :], successor])
            elif successor not in state:
                visit(successor, [*trail, successor])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_module_of_the_command_line_has_a_floor() -> None:
    assert set(cli_sources()) == set(FLOOR_OF_MODULE)


def test_no_import_runs_up_or_across_the_command_line() -> None:
    wrong = {module: bad for module, source in cli_sources().items() if (bad := wrong_imports(module, source))}
    assert not wrong, f"imports against the command line's floors: {wrong}"


def test_the_command_line_has_no_import_cycle() -> None:
    graph = {module: cli_imports(source, module) - {module} for module, source in cli_sources().items()}
    assert not cycles(graph)


@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("countersign_cli.offline", "from countersign_cli.main import EXIT_OK"),
        ("countersign_cli.audit", "def f():\n    from countersign_cli.main import UsageError\n"),
        ("countersign_cli.impact", "from countersign_cli.services import client_tls"),
        ("countersign_cli.report", "from countersign_cli import audit"),
        ("countersign_cli.common", "from countersign_cli.offline import render_tree"),
        ("countersign_cli.settings_help", "from . import services"),
        ("countersign_cli.demo", "import countersign_cli.main"),
    ],
)
def test_an_import_against_the_floors_is_caught(module: str, statement: str) -> None:
    assert wrong_imports(module, statement)


@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("countersign_cli.main", "from countersign_cli import audit, offline"),
        ("countersign_cli.offline", "from countersign_cli.common import UsageError, read_bytes"),
        ("countersign_cli.demo", "def f():\n    from countersign_cli.localmesh import LocalMesh\n"),
        ("countersign_cli.services", "from countersign_cli.settings_help import epilog"),
    ],
)
def test_an_import_down_the_floors_is_allowed(module: str, statement: str) -> None:
    assert not wrong_imports(module, statement)


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert not cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()})


def test_the_command_line_before_this_layout_would_fail() -> None:
    """The shape the command line had (each command module importing ``main`` back for EXIT_* and
    UsageError, main importing each command) is a cycle these checks report."""
    sources = {
        "countersign_cli.main": "def build():\n    from countersign_cli import audit, offline\n",
        "countersign_cli.offline": "from countersign_cli.main import EXIT_OK, UsageError\n",
        "countersign_cli.audit": "from countersign_cli.main import EXIT_OK\nfrom countersign_cli import offline\n",
    }
    graph = {module: cli_imports(source, module) - {module} for module, source in sources.items()}
    assert cycles(graph)
    assert wrong_imports("countersign_cli.offline", sources["countersign_cli.offline"])
