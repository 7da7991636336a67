"""The protocol core does no network or disk I/O and imports no service machinery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).parents[2] / "countersign"
CORE_MODULES = sorted(p for p in CORE.glob("*.py"))
FORBIDDEN_IMPORTS = {
    "os", "io", "socket", "sqlite3", "subprocess", "pathlib", "shutil", "tempfile", "urllib", "http",
    "grpc", "psycopg", "psycopg_pool", "boto3", "botocore", "requests", "signer", "verifier", "coordinator",
    "prometheus_client", "logging", "time", "asyncio",
}  # fmt: skip
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__"}


@pytest.mark.offline
@pytest.mark.parametrize("module", CORE_MODULES, ids=lambda p: p.name)
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
