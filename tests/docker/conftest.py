"""Shared readers of docker/: the Dockerfile's stages and instructions, the compose file as Compose
sees it (YAML merge keys resolved, ``${VAR:-default}`` interpolated with its defaults), and the
settings each daemon reads (imported from the config dataclasses themselves)."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO_ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
DOCKERIGNORE = DOCKER_DIR / "Dockerfile.dockerignore"

DAEMON_KINDS = ("coordinator", "signer", "verifier")
RUNTIME_UID = 10001


# ---------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # global ARGs (before the first FROM) with their defaults
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise AssertionError(f"Dockerfile has no stage {name}")

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, nearest first."""
        chain = [self.stage(name)]
        names = {s.name for s in self.stages}
        while chain[-1].base in names:
            chain.append(self.stage(chain[-1].base))
        return chain

    def effective(self, name: str, keyword: str) -> str | None:
        """The last value of ``keyword`` (USER, ENTRYPOINT, HEALTHCHECK, ...) that applies in a stage."""
        for stage in self.lineage(name):
            values = stage.all(keyword)
            if values:
                return values[-1]
        return None


def parse_dockerfile(text: str) -> Dockerfile:
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].rstrip() + " "
            continue
        logical.append(current + line)
        current = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, flags=re.IGNORECASE)
            assert match, f"cannot read FROM {rest!r}"
            stages.append(Stage(name=match.group(2) or str(len(stages)), base=match.group(1)))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args, stages)


def resolve_base(dockerfile: Dockerfile, base: str) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: dockerfile.args[m.group(1) or m.group(2)], base)


# ---------------------------------------------------------------------------------------------
# Compose file
# ---------------------------------------------------------------------------------------------

_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: Any, environ: dict[str, str] | None = None) -> Any:
    """Compose's ``${VAR}`` / ``${VAR:-default}`` with the defaults (or ``environ``)."""
    env = environ or {}
    if isinstance(value, str):
        return _INTERPOLATION.sub(lambda m: env.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load_compose(environ: dict[str, str] | None = None) -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    return interpolate({k: v for k, v in data.items() if not k.startswith("x-")}, environ)


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool


def mounts_of(service: dict[str, Any]) -> list[Mount]:
    out = []
    for entry in service.get("volumes", []):
        assert isinstance(entry, str), f"use the short volume syntax: {entry!r}"
        parts = entry.split(":")
        assert len(parts) in (2, 3), entry
        out.append(Mount(parts[0], parts[1], len(parts) == 3 and "ro" in parts[2].split(",")))
    return out


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "use the mapping form of environment"
    return {k: "" if v is None else str(v) for k, v in env.items()}


def kind_of(service: dict[str, Any]) -> str | None:
    """The daemon a service runs (``countersign <kind> serve``), or None for jobs and PostgreSQL."""
    command = service.get("command") or []
    if "entrypoint" not in service and len(command) >= 2 and command[0] in DAEMON_KINDS and command[1] == "serve":
        return str(command[0])
    return None


def load_demo_flow() -> Any:
    """docker/dev-mesh/demo_flow.py as a module (the demo job's script; not a package)."""
    sys.path.insert(0, str(DOCKER_DIR / "dev-mesh"))
    try:
        import demo_flow
    finally:
        sys.path.remove(str(DOCKER_DIR / "dev-mesh"))
    return demo_flow


def built_here(service: dict[str, Any]) -> bool:
    build = service.get("build") or {}
    return isinstance(build, dict) and build.get("dockerfile") == "docker/Dockerfile"


# ---------------------------------------------------------------------------------------------
# Settings the daemons read
# ---------------------------------------------------------------------------------------------


def daemon_settings(kind: str) -> set[str]:
    """Every COUNTERSIGN_* variable the daemon of ``kind`` reads."""
    from coordinator import postgres_store
    from coordinator.daemon import CoordinatorConfig
    from countersign._daemon.config import ENV_PREFIX
    from countersign.client.tls import TlsConfig
    from signer.config import SignerConfig
    from signer.stores import postgres as signer_postgres
    from verifier.daemon import VerifierConfig
    from verifier.stores import postgres

    config = {"coordinator": CoordinatorConfig, "signer": SignerConfig, "verifier": VerifierConfig}[kind]
    names = {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(config) if f.name != "tls"}
    names |= {f"{ENV_PREFIX}TLS_{f.name.upper()}" for f in dataclasses.fields(TlsConfig)}
    if kind == "coordinator":
        names.add(postgres_store.PASSWORD_ENV)
    if kind == "signer":
        names.add(signer_postgres.PASSWORD_ENV)
    if kind == "verifier":
        names.add(postgres.PASSWORD_ENV)
    return names


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="session")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


# ---------------------------------------------------------------------------------------------
# The container tier (marker ``containers``; tests/docker/containers.py)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_engine() -> None:
    """An engine answers, or the test skips (fails under COUNTERSIGN_DOCKER_REQUIRED=1) saying why."""
    from tests.docker.containers import require_engine

    require_engine()


@pytest.fixture(scope="session")
def local_base_images(docker_engine: None) -> Any:
    """The local stand-in base images, built from Debian packages when their recipe is new."""
    from tests.docker.containers import local_base

    return local_base()


@pytest.fixture(scope="session")
def countersign_images(local_base_images: Any) -> dict[str, str]:
    """docker/Dockerfile's runtime and dev-mesh targets, built on the local stand-in base."""
    from tests.docker.containers import build_images

    return build_images(local_base_images)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.docker.containers import BUILD_REPORT

    if BUILD_REPORT:
        terminalreporter.write_sep("-", "container images built in this run")
        for line in BUILD_REPORT:
            terminalreporter.write_line(line)
