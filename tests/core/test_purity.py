"""The protocol core does no network or disk I/O and imports no service machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parents[2] / "countersign"
NOT_CORE = ("client", "_daemon", "_proto", "integrations")  # the floors above the core inside the package
CORE_MODULES = sorted(p for p in CORE.rglob("*.py") if p.relative_to(CORE).parts[0] not in NOT_CORE)
FORBIDDEN_IMPORTS = {
    "os", "io", "socket", "sqlite3", "subprocess", "pathlib", "shutil", "tempfile", "urllib", "http",
    "grpc", "psycopg", "psycopg_pool", "boto3", "botocore", "requests", "signer", "verifier", "coordinator",
    "prometheus_client", "logging", "time", "asyncio",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


@pytest.mark.offline
@pytest.mark.parametrize("module", CORE_MODULES, ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_nothing_that_does_io(module: Path) -> None:
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_IMPORTS, f"{module.name} imports {name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{module.name} calls {node.func.id}()"


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
    ("client", ("countersign.client", "countersign._proto")),
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


def imported_modules(source: str, module: str, is_package: bool) -> list[str]:
    """Every module ``source`` imports, anywhere in it (function-level imports included)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                names.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.append(node.module)
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
    ],
)
def test_a_downward_import_is_allowed(module: str, statement: str) -> None:
    assert not upward_imports(statement, module)
