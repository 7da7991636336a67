"""The containers' environment speaks the daemons' language: every COUNTERSIGN_* name that the
Terraform sets is a setting the code reads, and every setting the code requires is set.

The settings are read from the Python sources themselves (the config dataclasses and the password
variables of the PostgreSQL stores), parsed with `ast`: the tools venv that runs tests/infra does not
install the project, and parsing keeps this test honest when someone renames a field.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TF_DIR = REPO_ROOT / "infra" / "terraform"
PREFIX = "COUNTERSIGN_"

# daemon -> (file, config class); the [tls] table is countersign/client/tls.py TlsConfig.
CONFIG_CLASSES = {
    "coordinator": ("coordinator/daemon.py", "CoordinatorConfig"),
    "signer": ("signer/config.py", "SignerConfig"),
    "verifier": ("verifier/daemon.py", "VerifierConfig"),
}
# Variables read outside the dataclasses: the PostgreSQL passwords (a constant PASSWORD_ENV in each store).
PASSWORD_SOURCES = {
    "coordinator": "coordinator/postgres_store.py",
    "signer": "signer/stores/postgres.py",
    "verifier": "verifier/stores/postgres.py",
}
# Variables for libraries rather than for countersign.
OTHER_ALLOWED = {"AWS_REGION"}


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    required: bool


def dataclass_fields(path: Path, class_name: str) -> list[Field]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return [
                Field(item.target.id, ast.unparse(item.annotation), item.value is None)
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            ]
    raise AssertionError(f"{path}: no class {class_name}")


def module_constant(path: Path, name: str) -> str:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), f"{path}: {name}"
            return node.value.value
    raise AssertionError(f"{path}: no constant {name}")


@dataclass(frozen=True)
class Settings:
    plain: dict[str, Field]  # env name -> field (top-level settings)
    tls: dict[str, str]  # env name -> TlsConfig field
    passwords: set[str]

    @property
    def names(self) -> set[str]:
        return set(self.plain) | set(self.tls) | self.passwords

    def required(self) -> set[str]:
        return {name for name, f in self.plain.items() if f.required}


def settings_of(daemon: str) -> Settings:
    path, class_name = CONFIG_CLASSES[daemon]
    fields = dataclass_fields(REPO_ROOT / path, class_name)
    tls_fields = dataclass_fields(REPO_ROOT / "countersign/client/tls.py", "TlsConfig")
    plain = {PREFIX + f.name.upper(): f for f in fields if f.type != "TlsConfig"}
    assert any(f.type == "TlsConfig" and f.name == "tls" for f in fields), f"{class_name} has no [tls] table"
    tls = {f"{PREFIX}TLS_{f.name.upper()}": f.name for f in tls_fields}
    passwords = set()
    if daemon in PASSWORD_SOURCES:
        passwords.add(module_constant(REPO_ROOT / PASSWORD_SOURCES[daemon], "PASSWORD_ENV"))
    return Settings(plain, tls, passwords)


SETTINGS = {daemon: settings_of(daemon) for daemon in CONFIG_CLASSES}


def container_names(tf: Any, checks: Any, daemon: str) -> tuple[dict[str, str], set[str], set[str]]:
    """(environment name -> value, names of secrets, names set only when an optional input is) of
    the daemon's container definition."""
    module = tf.module(daemon)
    container = module.local("container")
    env = checks.env_of(container, module)
    secret_names = set(module.local("tls_secret_keys"))
    if "password_secrets" in module.locals:
        secret_names |= set(re.findall(r"\b(COUNTERSIGN_[A-Z0-9_]+)\b", str(module.local("password_secrets"))))
    return env, secret_names, checks.optional_env_names(module)


def test_settings_are_read_from_the_sources() -> None:
    # Sanity of the parser, on names the docs promise (docs/operations.md).
    assert {"COUNTERSIGN_LOG_STORE", "COUNTERSIGN_OPERATOR_PUBLIC_KEY"} <= SETTINGS["coordinator"].names
    assert {"COUNTERSIGN_SIGNER_KEY", "COUNTERSIGN_STATE_URL", "COUNTERSIGN_REGISTRY_CACHE"} <= SETTINGS["signer"].names
    assert {"COUNTERSIGN_STORE_URL", "COUNTERSIGN_STORE_PASSWORD"} <= SETTINGS["verifier"].names
    assert "COUNTERSIGN_LOG_STORE_PASSWORD" in SETTINGS["coordinator"].passwords
    assert "COUNTERSIGN_SIGNER_STATE_PASSWORD" in SETTINGS["signer"].passwords
    assert {"COUNTERSIGN_COMMIT_BATCH", "COUNTERSIGN_DECIDE_ATTEMPTS"} <= SETTINGS["signer"].names
    assert "COUNTERSIGN_REFRESH_MS" in SETTINGS["coordinator"].names
    assert {"COUNTERSIGN_TLS_CERT_PEM", "COUNTERSIGN_TLS_CA"} <= set(SETTINGS["signer"].tls)
    assert SETTINGS["signer"].required() >= {"COUNTERSIGN_DEPLOYER", "COUNTERSIGN_REGISTRY_CACHE"}


@pytest.mark.parametrize("daemon", sorted(CONFIG_CLASSES))
def test_container_environment_names_are_settings_the_code_knows(tf: Any, checks: Any, daemon: str) -> None:
    env, secret_names, optional = container_names(tf, checks, daemon)
    known = SETTINGS[daemon].names
    unknown = sorted(n for n in (set(env) | secret_names | optional) if n not in known and n not in OTHER_ALLOWED)
    assert unknown == [], f"{daemon}: the daemon reads no such setting: {unknown}"


@pytest.mark.parametrize("daemon", sorted(CONFIG_CLASSES))
def test_container_environment_sets_every_required_setting(tf: Any, checks: Any, daemon: str) -> None:
    env, secret_names, _ = container_names(tf, checks, daemon)
    given = set(env) | secret_names
    settings = SETTINGS[daemon]
    missing = sorted(settings.required() - given)
    assert missing == [], f"{daemon}: required settings not set: {missing}"
    # TLS: each of ca, cert, key as a file path or as inline PEM.
    for part in ("CA", "CERT", "KEY"):
        assert {f"{PREFIX}TLS_{part}", f"{PREFIX}TLS_{part}_PEM"} & given, f"{daemon}: no TLS {part.lower()}"
    assert f"{PREFIX}TLS_INSECURE_LOOPBACK" not in given


def test_every_countersign_name_in_the_terraform_is_a_setting() -> None:
    """Catches names in any expression or comment, conditional secrets included."""
    known = set().union(*(s.names for s in SETTINGS.values()))
    found: dict[str, set[str]] = {}
    for path in sorted(TF_DIR.rglob("*.tf")):
        for name in re.findall(r"\b(COUNTERSIGN_[A-Z0-9_]+)\b", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO_ROOT)))
    assert found, "expected COUNTERSIGN_* names in the Terraform"
    unknown = {name: sorted(paths) for name, paths in found.items() if name not in known}
    assert unknown == {}, f"not settings of any daemon: {unknown}"


def test_settings_checker_flags_a_stale_name(tmp_path: Path) -> None:
    """The parser sees exactly the dataclass fields: a name from an older draft is not among them."""
    source = tmp_path / "daemon.py"
    source.write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class CoordinatorConfig:\n"
        "    operator_public_key: str\n"
        "    log_store: str = 'sqlite:///x.db'\n"
        "    def validate(self) -> None:\n"
        "        limit: int = 3\n"
    )
    fields = dataclass_fields(source, "CoordinatorConfig")
    assert [(f.name, f.required) for f in fields] == [("operator_public_key", True), ("log_store", False)]
    names = {PREFIX + f.name.upper() for f in fields}
    assert "COUNTERSIGN_REGISTRY_URL" not in names and "COUNTERSIGN_LOG_STORE" in names
