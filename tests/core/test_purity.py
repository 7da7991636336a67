"""The protocol core does no network or disk I/O and imports no service machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parents[2] / "countersign"
# The floors above the core inside the package (the wall clock, _clock.py, is the client floor's).
NOT_CORE = ("client", "_daemon", "_proto", "integrations", "_clock.py")
CORE_MODULES = sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] not in NOT_CORE)
FORBIDDEN_IMPORTS = {
    "os", "io", "socket", "sqlite3", "subprocess", "pathlib", "shutil", "tempfile", "urllib", "http",
    "grpc", "psycopg", "psycopg_pool", "boto3", "botocore", "requests", "signer", "verifier", "coordinator",
    "prometheus_client", "logging", "time", "asyncio",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


def io_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """What a core module may not do: import a module that does I/O or runs a service (any of the ways
    :func:`imported_modules` sees), or call a builtin that reads, writes or runs code."""
    wrong = [name for name in imported_modules(source, module, is_package) if name.split(".")[0] in FORBIDDEN_IMPORTS]
    wrong += [name for name in imported_modules(source, module, is_package) if name.startswith(DYNAMIC)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            wrong.append(f"{node.func.id}()")
    return wrong


def _module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(REPO).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


@pytest.mark.offline
@pytest.mark.parametrize("module", CORE_MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_nothing_that_does_io(module: Path) -> None:
    name, is_package = _module_name(module)
    assert not io_imports(module.read_text(), name, is_package), f"{module.name} does I/O"


@pytest.mark.offline
@pytest.mark.parametrize(
    "statement",
    [
        "import socket",
        "from os import path",
        "from os.path import join",
        "def f():\n    import sqlite3\n",
        "import importlib\nimportlib.import_module('socket')",
        "from importlib import import_module\nimport_module('grpc')",
        "__import__('subprocess')",
        "import importlib\nname = 'socket'\nimportlib.import_module(name)",  # a dynamic import cannot be followed
        "data = open('x').read()",
        "print('x')",
    ],
)
def test_an_io_import_in_the_core_is_caught(statement: str) -> None:
    assert io_imports(statement, "countersign.verify")


@pytest.mark.daemons  # a child interpreter
def test_core_imports_without_service_dependencies() -> None:
    """Importing the whole core pulls in none of gRPC, the stores or the cloud SDKs."""
    code = (
        "import sys, countersign, countersign.conformance, countersign.samples;"
        "bad = [m for m in ('grpc', 'sqlite3', 'boto3', 'psycopg', 'socket') if m in sys.modules];"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


# --- the direction of imports (docs/adr/0010-one-way-layering.md) ------------------------------------

REPO = Path(__file__).parents[2]
# Floors, lowest first. A module may import its own floor and the floors below it, never above; a
# daemon never imports another daemon. Anything not listed (tests, bench, tools, docker) stands
# around the house and is imported by none of it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("countersign",)),
    ("client", ("countersign.client", "countersign._proto", "countersign._clock")),
    ("integrations", ("countersign.integrations",)),
    ("plumbing", ("countersign._daemon",)),
    ("daemons", ("signer", "verifier", "coordinator")),
    ("top", ("countersign_cli",)),
)
AROUND = ("tests", "bench", "tools", "docker")
DAEMONS = ("signer", "verifier", "coordinator")


def floor_of(module: str) -> int | None:
    """The floor of a dotted module name (the longest matching prefix wins); None outside the house."""
    best: tuple[int, int] | None = None
    for level, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            matches = module == prefix or module.startswith(prefix + ".")
            if matches and (best is None or len(prefix) > best[1]):
                best = (level, len(prefix))
    return None if best is None else best[0]


# Stands for an import the checks cannot follow (its module is computed as the program runs): always wrong
# in the house, which has none, so that a guard cannot be walked around by spelling an import that way.
DYNAMIC = "<dynamic import>"
IMPORT_FUNCTIONS = ("import_module", "__import__")


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Every module ``source`` imports, anywhere in it: function-level and relative imports, each name
    of ``from package import name`` as a possible submodule (``from countersign import client``), and
    ``importlib.import_module(...)`` or ``__import__(...)`` of a literal name; any other call of those
    is :data:`DYNAMIC`."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Call):
            function = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if function in IMPORT_FUNCTIONS:
                first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                absolute = isinstance(first, str) and not first.startswith(".")
                names.append(first if absolute else f"{DYNAMIC} at line {node.lineno}")
    return names


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that run the wrong way: to a higher floor, to another daemon, or from
    the house to a harness around it."""
    here = floor_of(module)
    if here is None:
        return []
    own_top = module.partition(".")[0]
    wrong = []
    for name in imported_modules(source, module, is_package):
        if name.startswith(DYNAMIC):
            wrong.append(name)
            continue
        top = name.partition(".")[0]
        there = floor_of(name)
        into_harness = top in AROUND
        upward = there is not None and there > here
        across_daemons = top in DAEMONS and own_top in DAEMONS and top != own_top
        if into_harness or upward or across_daemons:
            wrong.append(name)
    return wrong


def house_modules() -> list[tuple[str, Path]]:
    found = []
    for top in ("countersign", "countersign_cli", *DAEMONS):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append((name, path))
    return found


@pytest.mark.offline
def test_every_import_runs_down_the_house() -> None:
    wrong = {}
    for name, path in house_modules():
        bad = upward_imports(path.read_text(), name, path.name == "__init__.py")
        if bad:
            wrong[name] = bad
    assert not wrong, f"imports that run the wrong way: {wrong}"


@pytest.mark.offline
@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("countersign.verify", "from signer.daemon import SignerService"),
        ("countersign.records", "import countersign._daemon.config"),
        ("countersign.records", "from countersign.client import SignerClient"),
        ("countersign.client.signer", "from countersign._daemon.edge import abort"),
        ("countersign.client.signer", "from verifier.stores import open_store"),
        ("countersign._daemon.server", "from coordinator.daemon import CoordinatorDaemon"),
        ("signer.daemon", "from verifier.stores.sqlite import SqliteState"),
        ("verifier.daemon", "from countersign_cli.localmesh import LocalMesh"),
        ("countersign.verify", "from tools.zones.mesh import ZoneMesh"),
        ("countersign_cli.main", "from tests.mesh.helpers import verdict"),
        ("countersign.client.verifier", "def f():\n    from signer import peers\n"),
        ("countersign.client", "from .._daemon import edge"),
        ("countersign.verify", "from countersign import client"),
        ("countersign.verify", "from . import client"),
        ("countersign.records", "from countersign import _daemon, records"),
        ("countersign.verify", "import importlib\nimportlib.import_module('signer.daemon')"),
        ("countersign.verify", "from importlib import import_module\nimport_module('signer.daemon')"),
        ("countersign.verify", "def f():\n    return __import__('countersign.client.signer')\n"),
        ("countersign.verify", "import importlib\nimportlib.import_module('.client', 'countersign')"),
        ("signer.daemon", "import importlib\nname = 'verifier.stores'\nimportlib.import_module(name)"),
    ],
)
def test_an_upward_import_is_caught(module: str, statement: str) -> None:
    """The check above would fail on each of these (a function-level or relative import included)."""
    assert upward_imports(statement, module, module == "countersign.client")


@pytest.mark.offline
@pytest.mark.parametrize(
    ("module", "statement"),
    [
        ("countersign.client.signer", "from countersign.records import Path"),
        ("countersign._daemon.edge", "from countersign.client.errors import ServiceError"),
        ("signer.daemon", "from signer.stores import open_signer_state"),
        ("verifier.daemon", "from countersign._daemon.server import run_daemon"),
        ("countersign_cli.services", "from signer.backends import load_signer"),
        ("countersign.client.signer", "from countersign import records"),
        ("countersign.verify", "from . import records"),
        ("countersign.integrations.mcp", "import importlib\nimportlib.import_module('mcp.shared.exceptions')"),
    ],
)
def test_a_downward_import_is_allowed(module: str, statement: str) -> None:
    assert not upward_imports(statement, module)
