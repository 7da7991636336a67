"""The container tier's engine, local stand-in base images and image builds (see docker/engine.sh and
docker/local-base/build.sh). Used by the fixtures in tests/docker/conftest.py.

Where no engine is reachable the container tests SKIP with the reason, unless the run says an engine
must be there (``COUNTERSIGN_DOCKER_REQUIRED=1``, which ``docker/engine.sh run`` sets, so `make
containers` and CI fail instead of skipping).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker.conftest import DOCKER_DIR, DOCKERIGNORE, REPO_ROOT

OWN_ENGINE = "unix:///run/countersign-docker/docker.sock"
RUNTIME_TAG = "countersign:local-base"
DEV_MESH_TAG = "countersign-dev-mesh:local-base"
# Kept out of the copied build context: Docker would read them only to drop them.
CONTEXT_SKIP = {".git", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis", "__pycache__"}

# What was built and how long it took: printed at the end of the run (tests/docker/conftest.py).
BUILD_REPORT: list[str] = []


def engine_required() -> bool:
    return os.environ.get("COUNTERSIGN_DOCKER_REQUIRED") == "1"


def engine_problem() -> str | None:
    """Why no container can run here, or None when an engine answers."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        version = docker("version", "--format", "{{.Server.Version}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker version` did not answer within 30 s"
    if version.returncode != 0:
        reason = (version.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine reachable ({reason})"
    return None


def require_engine() -> None:
    problem = engine_problem()
    if problem is None:
        return
    advice = "`make containers` (root) installs Debian's docker.io and starts an engine with host networking"
    if engine_required():
        pytest.fail(f"{problem}; this run requires one (COUNTERSIGN_DOCKER_REQUIRED=1). {advice}", pytrace=False)
    pytest.skip(f"{problem}: container tests need a Docker engine. {advice}")


def own_engine() -> bool:
    """The engine is the one docker/engine.sh started (host networking only)."""
    return os.environ.get("DOCKER_HOST") == OWN_ENGINE


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def compose_command() -> list[str] | None:
    """Compose v2 (``docker compose``) when the CLI has it, else v1 (``docker-compose``), else None."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False, timeout=30).returncode == 0:
        return ["docker", "compose"]
    found = shutil.which("docker-compose")
    return [found] if found else None


@dataclass(frozen=True)
class LocalBase:
    """The local stand-in base images (docker/local-base/build.sh)."""

    python: str
    postgres: str


def local_base() -> LocalBase:
    result = subprocess.run(
        ["sh", str(DOCKER_DIR / "local-base" / "build.sh"), "--print"],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert result.returncode == 0, f"docker/local-base/build.sh failed:\n{result.stdout}{result.stderr}"
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    BUILD_REPORT.extend(line for line in result.stdout.splitlines() if line.startswith("docker/local-base:"))
    return LocalBase(python=values["PYTHON_IMAGE"], postgres=values["POSTGRES_IMAGE"])


def build_context(destination: Path) -> Path:
    """The working tree as the build context, with docker/Dockerfile.dockerignore as its .dockerignore.

    BuildKit reads ``<Dockerfile>.dockerignore`` beside the Dockerfile; the engine here (Debian's
    20.10) and the classic builder read only ``.dockerignore`` at the context root, so the same file is
    put there: the build sees exactly what a BuildKit build of the repository would.
    """
    context = destination / "context"
    shutil.copytree(REPO_ROOT, context, ignore=lambda _dir, names: [n for n in names if n in CONTEXT_SKIP])
    shutil.copyfile(DOCKERIGNORE, context / ".dockerignore")
    return context


def build_images(base: LocalBase) -> dict[str, str]:
    """docker/Dockerfile's two targets on the local stand-in base: {"runtime": tag, "dev-mesh": tag}.

    The classic builder (DOCKER_BUILDKIT=0): BuildKit would first pull the ``# syntax=`` frontend
    image from a registry. ``--network host``: the engine has no bridge, and pip needs PyPI.
    """
    tags = {"runtime": RUNTIME_TAG, "dev-mesh": DEV_MESH_TAG}
    # Dangling stage images of builds older than three days are no one's cache any more.
    docker("image", "prune", "--force", "--filter", "until=72h", check=False)
    with tempfile.TemporaryDirectory(prefix="countersign-build-") as scratch:
        context = build_context(Path(scratch))
        for target, tag in tags.items():
            started = time.monotonic()
            result = subprocess.run(
                [
                    "docker",
                    "build",
                    "--quiet",
                    "--network",
                    "host",
                    "--build-arg",
                    f"PYTHON_IMAGE={base.python}",
                    "--file",
                    "docker/Dockerfile",
                    "--target",
                    target,
                    "--tag",
                    tag,
                    ".",
                ],
                cwd=context,
                env={**os.environ, "DOCKER_BUILDKIT": "0"},
                capture_output=True,
                text=True,
                timeout=1800,
                check=False,
            )
            assert result.returncode == 0, f"docker build --target {target} failed:\n{result.stdout}{result.stderr}"
            seconds = time.monotonic() - started
            BUILD_REPORT.append(f"{tag}: docker/Dockerfile --target {target} on {base.python} in {seconds:.0f} s")
    return tags


def inspect(container: str, template: str) -> str:
    return docker("inspect", "--format", template, container, timeout=60).stdout.strip()
