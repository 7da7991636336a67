"""`pip install countersign` without extras verifies paths: the core needs rfc8785 and PyNaCl alone.

The test builds, without any network, what that install holds: a fresh virtual environment
(``venv --without-pip``, so not even pip) with the distribution's own packages, rfc8785, PyNaCl and
the one piece of cffi PyNaCl loads at run time (``_cffi_backend``), all copied from this environment.
In a child interpreter there (``-I``: no PYTHONPATH, no user site) every core module imports, every
valid vector verifies, a substituted output is rejected, and gRPC, cryptography and protobuf can be
neither imported nor found loaded. The command line's help and offline ``verify`` run there too, and a
command that needs the SDK says which extra to install. Any import of a service package added to the
core (or at the top of the command line) fails this test.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.daemons, pytest.mark.slow]  # builds a venv and runs child interpreters

REPO_ROOT = Path(__file__).resolve().parents[2]
VALID = sorted((REPO_ROOT / "tests" / "vectors" / "valid").glob("*.json"))
# What the core's two dependencies bring: their packages and cffi's compiled backend (PyNaCl's
# compiled module loads it; cffi's Python half and pycparser are needed only to build PyNaCl).
RUNTIME_MODULES = ("rfc8785", "nacl", "_cffi_backend")
ABSENT = ("grpc", "grpc_status", "cryptography", "google.protobuf", "google.rpc", "psycopg", "boto3", "msgspec")
# The one core module of an extra (``fast``, ADR 0036): nothing imports it when msgspec is missing.
FAST_ONLY = "countersign._compiled_parse"
NOT_CORE = ("countersign.client", "countersign._daemon", "countersign._proto")

CORE_CHECK = """
import base64, importlib, json, pkgutil, sys

import countersign
from countersign.records import Path
from countersign.registry import Registry
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path

core = [m.name for m in pkgutil.iter_modules(countersign.__path__, "countersign.") if not m.ispkg]
for name in core:
    if name != FAST_ONLY:
        importlib.import_module(name)
from countersign.records import DECODER

verdicts = {}
for location in sys.argv[1:]:
    vector = json.load(open(location))
    presentation = vector["presentation"]
    skew = vector["clock_skew_ms"]
    policy = VerifierPolicy(clock_skew_ms=skew)
    if vector["allow_baselines"]:
        policy = VerifierPolicy.unsafe_allow_baselines(skew)
    path = Path.from_bytes(json.dumps(presentation["path"]).encode())
    output = base64.b64decode(presentation["output_base64"])
    results = [
        verify_path(
            path, given, registry=Registry.from_json(vector["registry"]), state=InMemoryState(),
            mode=Mode(vector["mode"]), now_ms=vector["now_ms"], policy=policy,
        )
        for given in (output, output + b"substituted")
    ]
    verdicts[vector["name"]] = [[r.verdict.value, r.reason and r.reason.value] for r in results]

importable = []
for name in ABSENT:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
    else:
        importable.append(name)
service_roots = {a.split(".")[0] for a in ABSENT}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in service_roots or m.startswith(NOT_CORE))
fast_loaded = FAST_ONLY in sys.modules
print(json.dumps({"core": core, "verdicts": verdicts, "importable": importable, "loaded": loaded, "path": sys.path,
                  "decoder": DECODER, "fast_loaded": fast_loaded}))
"""


def distribution_packages() -> list[str]:
    """The top-level packages `pip install countersign` installs (pyproject.toml's package find)."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.split(".")[0].rstrip("*") for p in patterns})


def location_of(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"{module} is not installed in the test environment"
    origin = Path(spec.origin)
    return origin.parent if origin.name == "__init__.py" else origin


@pytest.fixture(scope="module")
def core_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a venv holding the distribution's code and the core's run-time dependencies only."""
    venv = tmp_path_factory.mktemp("core-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    site = Path(purelib)
    assert site.is_relative_to(venv), site
    ignore = shutil.ignore_patterns("__pycache__")
    for package in distribution_packages():
        shutil.copytree(REPO_ROOT / package, site / package, ignore=ignore)
    for module in RUNTIME_MODULES:
        source = location_of(module)
        if source.is_dir():
            shutil.copytree(source, site / source.name, ignore=ignore)
        else:
            shutil.copy2(source, site / source.name)
    return python


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run(
        [str(python), "-I", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120, check=False
    )


def test_the_core_verifies_every_valid_vector_with_rfc8785_and_pynacl_alone(core_only: Path, tmp_path: Path) -> None:
    program = f"ABSENT = {ABSENT!r}\nNOT_CORE = {NOT_CORE!r}\nFAST_ONLY = {FAST_ONLY!r}\n" + CORE_CHECK
    done = run(core_only, "-c", program, *map(str, VALID), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    assert not any(entry.startswith(str(REPO_ROOT)) for entry in report["path"]), report["path"]
    assert set(report["core"]) >= {"countersign.verify", "countersign.records", "countersign.keys"}
    expected = {vector.stem: [["ACCEPT", None], ["REJECT", "OUTPUT_MISMATCH"]] for vector in VALID}
    assert report["verdicts"] == expected, report["verdicts"]
    assert report["importable"] == [], "the core-only environment is not core-only"
    assert report["loaded"] == [], "the core imported a service package"
    # Without the fast extra the reference parser was chosen at import, and gave the verdicts above.
    assert report["decoder"] == "reference (json)" and not report["fast_loaded"]


def test_the_command_line_helps_and_verifies_offline_on_the_core(core_only: Path, tmp_path: Path) -> None:
    helped = run(core_only, "-m", "countersign_cli", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "verify" in helped.stdout

    vector = json.loads((REPO_ROOT / "tests" / "vectors" / "valid" / "signed-dag.json").read_text())
    assert not vector["allow_baselines"]
    (tmp_path / "path.json").write_text(json.dumps(vector["presentation"]["path"]))
    (tmp_path / "output.bin").write_bytes(base64.b64decode(vector["presentation"]["output_base64"]))
    (tmp_path / "registry.json").write_text(json.dumps(vector["registry"]))
    verify = ["-m", "countersign_cli", "verify", "--path", "path.json", "--output", "output.bin"]
    verify += ["--registry", "registry.json", "--now-ms", str(vector["now_ms"])]
    verify += ["--clock-skew-ms", str(vector["clock_skew_ms"])]
    verified = run(core_only, *verify, cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["verdict"] == "ACCEPT"


@pytest.mark.parametrize(
    ("command", "extra", "first_missing"),
    [(["pki", "init", "--out", "ca"], "grpc", "grpc"), (["verifier", "serve"], "server", "cryptography")],
    ids=["pki", "serve"],
)
def test_a_command_that_needs_an_extra_names_it(
    core_only: Path, tmp_path: Path, command: list[str], extra: str, first_missing: str
) -> None:
    done = run(core_only, "-m", "countersign_cli", *command, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"countersign {command[0]}: needs the '{extra}' extra (no module {first_missing}): "
        f"pip install 'countersign-mesh[{extra}]'"
    ], done.stderr


@pytest.mark.parametrize("daemon", ["coordinator", "signer", "verifier"])
def test_serve_help_without_the_server_extra_helps_and_names_the_extra(
    core_only: Path, tmp_path: Path, daemon: str
) -> None:
    """Issue 29: `countersign verifier serve --help` without the grpc extra printed a traceback."""
    done = run(core_only, "-m", "countersign_cli", daemon, "serve", "--help", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith(f"usage: countersign {daemon} serve")
    assert "--config" in done.stdout
    # The first module missing: gRPC's, or the TLS a daemon's settings read (errors need no gRPC: ADR 0036).
    needs = r"need the 'server' extra \(no module (grpc|cryptography)\): pip install 'countersign-mesh\[server\]'"
    assert re.search(needs, done.stdout), done.stdout
