"""Each ``pip install`` line of the README and the quickstart works alone: a fresh virtual environment
per line, the distribution built from this checkout, every other package at its constraints.txt pin,
and there, in an isolated interpreter, the imports the line's comment promises.

Packages come from a wheelhouse kept in ``.venv/extras-wheelhouse/`` (downloaded once per
constraints.txt and pyproject.toml, with pip, from the package index), so later runs install with
``--no-index``: offline. ``countersign-mesh`` itself is built from the checkout each run, never taken
from an index (no such distribution is published there; ADR 0034).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign.extras import DISTRIBUTION, EXTRAS, install_command

REPO = Path(__file__).resolve().parents[2]
PAGES = (REPO / "README.md", REPO / "docs" / "quickstart-runtime.md")
INSTALL_LINE = re.compile(r"^pip install (\S+)", re.M)

# What each line promises (the README's comment beside it), imported in the fresh environment.
PROMISES: dict[str, str] = {
    "": "from countersign.consumer import EvidenceVerdict, parse_registry, verify_offline\n"
    "from countersign.handoff import Delegation, HandoffError\n"
    "from countersign.verify import verify_path\n",
    "grpc": "from countersign.client import Consumer, EvidenceVerdict, Runtime, VerifierClient\n",
    "server": "import signer.daemon, verifier.daemon, coordinator.daemon\n"
    "from countersign_cli.localmesh import LocalMesh\n",
    "export": "from countersign.export.provenance import prov_document\nimport prov.model, rdflib\n",
    "langgraph": "from countersign.integrations.langgraph import MeshSigning, signed_node, verify_state\n"
    "from countersign.integrations.langgraph import require_langgraph\nrequire_langgraph()\n",
    "mcp": "from countersign.integrations.mcp import SigningMiddleware, check_session, verify_result\n"
    "SigningMiddleware()\n",
    "a2a": "from countersign.integrations.a2a import SignedExecutor, require_a2a, verify_artifact\nrequire_a2a()\n",
    "openai-agents": "from countersign.integrations.openai_agents import RunEvidence, SigningHooks, verify_run\n"
    "from countersign.integrations.kit import AsyncMeshSigning\nfrom agents.testing import ScriptedModel\n",
}
# Packages a line must not bring (the core is verify-only; ADR 0017).
ABSENT = {"": ("grpc", "cryptography", "google.protobuf")}


def install_lines() -> list[str]:
    """The requirement of every ``pip install`` line the two pages print, in order, each once."""
    found: list[str] = []
    for page in PAGES:
        for quoted in INSTALL_LINE.findall(page.read_text()):
            requirement = quoted.strip("'")
            if requirement not in found:
                found.append(requirement)
    return found


def extra_of(requirement: str) -> str:
    name, _, rest = requirement.partition("[")
    assert name == DISTRIBUTION, f"a page installs {name}, not {DISTRIBUTION}"
    return rest.rstrip("]")


@pytest.mark.offline
def test_every_install_line_names_the_distribution_and_a_declared_extra() -> None:
    lines = install_lines()
    assert lines[0] == DISTRIBUTION and len(lines) >= 7
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for requirement in lines:
        extra = extra_of(requirement)
        assert extra == "" or extra in declared, requirement
        assert extra in PROMISES, f"say what {requirement} promises in PROMISES"
        assert install_command(extra or None) in "".join(page.read_text() for page in PAGES), requirement
    assert set(EXTRAS) <= set(declared)
    # The integration extras (those the registry says install an integration) bring the client SDK they
    # sign and check through, and a page prints each one's install line.
    integrations = [extra for extra, what in EXTRAS.items() if what.startswith("countersign.integrations.")]
    assert {"langgraph", "mcp", "a2a", "openai-agents"} <= set(integrations)
    for extra in integrations:
        assert f"{DISTRIBUTION}[grpc]" in declared[extra], extra
        assert f"{DISTRIBUTION}[{extra}]" in lines, extra


def _digest() -> str:
    hashed = hashlib.sha256()
    for name in ("constraints.txt", "pyproject.toml"):
        hashed.update((REPO / name).read_bytes())
    return hashed.hexdigest()[:16]


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_REQUIRE"))}
    return subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args], capture_output=True, text=True,
        env=env, timeout=1200, check=False,
    )  # fmt: skip


@pytest.fixture(scope="session")
def local_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout built as a wheel (the dev venv's setuptools: no network)."""
    out = tmp_path_factory.mktemp("countersign-wheel")
    source = tmp_path_factory.mktemp("countersign-source")  # setuptools writes build/ beside the sources
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for package in ("countersign", "countersign_cli", "signer", "verifier", "coordinator"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = _pip(Path(sys.executable), "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(source))
    assert built.returncode == 0, built.stdout + built.stderr
    assert len(list(out.glob("countersign_mesh-*.whl"))) == 1
    return out


@pytest.fixture(scope="session")
def wheelhouse(local_wheel: Path) -> Iterator[Path]:
    """Every pinned dependency of every extra, as wheels: downloaded once per constraints.txt and
    pyproject.toml (a lock file keeps pytest-xdist workers from downloading it twice)."""
    root = REPO / ".venv" / "extras-wheelhouse"
    root.mkdir(parents=True, exist_ok=True)
    house = root / _digest()
    with (root / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (house / "complete").exists():
            shutil.rmtree(house, ignore_errors=True)
            extras = ",".join(sorted(set(PROMISES) - {""}))
            fetched = _pip(
                Path(sys.executable), "download", "--quiet", "-c", str(REPO / "constraints.txt"), "-d", str(house),
                "--find-links", str(local_wheel), f"{DISTRIBUTION}[{extras}]",
            )  # fmt: skip
            assert fetched.returncode == 0, fetched.stdout + fetched.stderr
            for ours in house.glob("countersign_mesh-*"):
                ours.unlink()  # built from the checkout each run, never kept
            (house / "complete").touch()
        yield house


@pytest.mark.daemons  # builds venvs, runs pip and child interpreters
@pytest.mark.slow
@pytest.mark.parametrize("requirement", install_lines())
def test_each_install_line_alone_imports_what_it_promises(
    requirement: str, local_wheel: Path, wheelhouse: Path, tmp_path: Path
) -> None:
    extra = extra_of(requirement)
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = _pip(
        python, "install", "--quiet", "--no-index", "--find-links", str(local_wheel), "--find-links", str(wheelhouse),
        "-c", str(REPO / "constraints.txt"), requirement,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout + installed.stderr
    program = PROMISES[extra] + "print('promised')\n"
    for absent in ABSENT.get(extra, ()):
        program += f"import importlib.util as u\nassert u.find_spec({absent.split('.')[0]!r}) is None, {absent!r}\n"
    done = subprocess.run(
        [str(python), "-I", "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "promised", done.stdout + done.stderr
    if extra == "":  # the client SDK without its extra says which one to install
        client = subprocess.run(
            [str(python), "-I", "-c", "import countersign.client"], cwd=tmp_path, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert client.returncode == 1
        assert client.stderr.strip().splitlines()[-1] == (
            "ModuleNotFoundError: countersign.client needs the 'grpc' extra (no module cryptography): "
            f"{install_command('grpc')}"
        ), client.stderr
