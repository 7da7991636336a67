"""Shared fixtures of the infrastructure tests: the parsed Terraform and the invariant checkers.

The Terraform under infra/terraform is parsed with `hcl2` as provided by bc-python-hcl2, the
python-hcl2 fork that checkov itself uses (see infra/requirements-infra.txt for why the upstream
package is not installed beside it). In that parser's output every attribute value is wrapped in
a one-element list and every block is a list of dicts; `TfModule` hides this.

The checkers are plain functions of parsed content, exposed through the `checks` fixture so that
the tests can also feed them deliberately bad snippets and see them fail.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA_DIR = REPO_ROOT / "infra"
TF_DIR = INFRA_DIR / "terraform"
EXAMPLE_TFVARS = TF_DIR / "terraform.tfvars.example"
ALL_FEATURES_TFVARS = INFRA_DIR / "checkov-all-features.tfvars"
CHECKOV_CONFIG = TF_DIR / ".checkov.yaml"
VENV_BIN = REPO_ROOT / ".venv-infra" / "bin"

WORLD_CIDRS = ("0.0.0.0/0", "::/0")
DEPLOYER_ID_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"

# Set by infra/tools.mk: a missing tool is then a failure, not a skip.
REQUIRE_TOOLS = os.environ.get("INFRA_REQUIRE_TOOLS") == "1"


def _require_bc_hcl2() -> Any:
    hcl2 = pytest.importorskip("hcl2", reason="tests/infra need the tools venv: make -f infra/tools.mk infra-check")
    try:
        importlib.metadata.version("bc-python-hcl2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tests/infra need bc-python-hcl2 (the HCL parser checkov uses); run them from .venv-infra")
    return hcl2


# ---------------------------------------------------------------------------------------------
# Parsed Terraform
# ---------------------------------------------------------------------------------------------


def attr(body: dict[str, Any], name: str, default: Any = None) -> Any:
    """Value of attribute `name` of a parsed block (unwrapped from the parser's one-element list)."""
    if name not in body:
        return default
    value = body[name]
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def blocks(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Nested blocks `name` of a parsed block (possibly none)."""
    value = body.get(name, [])
    return [b for b in value if isinstance(b, dict)]


@dataclass
class TfModule:
    """One Terraform module (a folder of .tf files), merged across its files."""

    path: Path
    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    data: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    variables: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    locals: dict[str, Any] = field(default_factory=dict)
    module_calls: dict[str, dict[str, Any]] = field(default_factory=dict)
    terraform: list[dict[str, Any]] = field(default_factory=list)
    providers: list[dict[str, Any]] = field(default_factory=list)

    def resources_of(self, rtype: str) -> dict[str, dict[str, Any]]:
        return self.resources.get(rtype, {})

    def resource(self, rtype: str, name: str) -> dict[str, Any]:
        try:
            return self.resources[rtype][name]
        except KeyError:
            raise AssertionError(f"{self.path}: no resource {rtype}.{name}") from None

    def local(self, name: str) -> Any:
        if name not in self.locals:
            raise AssertionError(f"{self.path}: no local {name}")
        return self.locals[name]


def parse_module(hcl2: Any, path: Path) -> TfModule:
    module = TfModule(path=path)
    for tf_file in sorted(path.glob("*.tf")):
        with tf_file.open() as fh:
            parsed = hcl2.load(fh)
        merge_parsed(module, parsed, tf_file)
    return module


def merge_parsed(module: TfModule, parsed: dict[str, Any], origin: Path | str) -> None:
    for entry in parsed.get("resource", []):
        for rtype, by_name in entry.items():
            for name, body in by_name.items():
                assert name not in module.resources.get(rtype, {}), f"{origin}: duplicate resource {rtype}.{name}"
                module.resources.setdefault(rtype, {})[name] = body
    for entry in parsed.get("data", []):
        for dtype, by_name in entry.items():
            for name, body in by_name.items():
                module.data.setdefault(dtype, {})[name] = body
    for entry in parsed.get("variable", []):
        module.variables.update(entry)
    for entry in parsed.get("output", []):
        module.outputs.update(entry)
    for entry in parsed.get("locals", []):
        for key, value in entry.items():
            if not key.startswith("__"):
                module.locals[key] = value[0] if isinstance(value, list) and len(value) == 1 else value
    for entry in parsed.get("module", []):
        module.module_calls.update(entry)
    module.terraform.extend(parsed.get("terraform", []))
    module.providers.extend(parsed.get("provider", []))


def parse_snippet(hcl2: Any, text: str) -> TfModule:
    """Parse HCL text as a one-file module (used to prove that the checkers can fail)."""
    import io

    module = TfModule(path=Path("<snippet>"))
    merge_parsed(module, hcl2.load(io.StringIO(text)), "<snippet>")
    return module


@dataclass
class Terraform:
    root: TfModule
    modules: dict[str, TfModule]
    example_tfvars: dict[str, Any]
    all_features_tfvars: dict[str, Any]

    def all_modules(self) -> Iterator[tuple[str, TfModule]]:
        yield "root", self.root
        yield from self.modules.items()

    def module(self, name: str) -> TfModule:
        try:
            return self.modules[name]
        except KeyError:
            raise AssertionError(f"no module infra/terraform/modules/{name}") from None


def load_tfvars(hcl2: Any, path: Path) -> dict[str, Any]:
    with path.open() as fh:
        parsed = hcl2.load(fh)
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in parsed.items()}


# ---------------------------------------------------------------------------------------------
# Checkers (pure functions of parsed content)
# ---------------------------------------------------------------------------------------------

SG_RULE_TYPES = (
    "aws_security_group_rule",
    "aws_vpc_security_group_ingress_rule",
    "aws_vpc_security_group_egress_rule",
)
CIDR_FIELDS = ("cidr_blocks", "ipv6_cidr_blocks", "cidr_ipv4", "cidr_ipv6")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def world_open_rules(module: TfModule) -> list[str]:
    """Security group rules (standalone or inline) whose CIDR fields hold 0.0.0.0/0 or ::/0."""
    found = []
    for rtype in SG_RULE_TYPES:
        for name, body in module.resources_of(rtype).items():
            for fld in CIDR_FIELDS:
                for s in _strings(attr(body, fld)):
                    if any(w in s for w in WORLD_CIDRS):
                        found.append(f"{rtype}.{name}.{fld}={s}")
    for name, body in module.resources_of("aws_security_group").items():
        for direction in ("ingress", "egress"):
            for rule in blocks(body, direction):
                for fld in CIDR_FIELDS:
                    for s in _strings(attr(rule, fld)):
                        if any(w in s for w in WORLD_CIDRS):
                            found.append(f"aws_security_group.{name}.{direction}.{fld}={s}")
    return found


def inline_sg_rules(module: TfModule) -> list[str]:
    """aws_security_group resources with inline ingress/egress blocks (all rules must be standalone)."""
    return [
        f"aws_security_group.{name}.{d}"
        for name, body in module.resources_of("aws_security_group").items()
        for d in ("ingress", "egress")
        if d in body
    ]


def _actions(statement: dict[str, Any], module: TfModule) -> list[str]:
    action = statement.get("Action", [])
    if isinstance(action, str):
        ref = re.fullmatch(r"\$\{local\.(\w+)\}", action)
        action = module.local(ref.group(1)) if ref else [action]
    return list(action)


def _principals(statement: dict[str, Any]) -> list[str]:
    principal = statement.get("Principal", {})
    if isinstance(principal, str):
        return [principal]
    out: list[str] = []
    for value in principal.values():
        out.extend([value] if isinstance(value, str) else list(value))
    return out


def grants(statement_actions: list[str], action: str) -> bool:
    """Whether any IAM action pattern in the list (wildcards included) covers `action`."""
    return any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in statement_actions)


def key_policy_statements(module: TfModule, key_body: dict[str, Any]) -> list[dict[str, Any]]:
    """Statements of a key policy written as `policy = jsonencode(local.<name>)`."""
    policy = attr(key_body, "policy")
    ref = re.fullmatch(r"\$\{jsonencode\(local\.(\w+)\)\}", policy or "")
    assert ref, f"key policy must be jsonencode(local.<name>) so that it can be checked, got {policy!r}"
    statements = module.local(ref.group(1))["Statement"]
    return statements if isinstance(statements, list) else [statements]


def principals_allowed(module: TfModule, statements: list[dict[str, Any]], action: str) -> list[str]:
    """Principals an Allow statement grants `action` to (directly or through a wildcard)."""
    out: list[str] = []
    for st in statements:
        if st.get("Effect") == "Allow" and grants(_actions(st, module), action):
            out.extend(_principals(st))
    return out


def iam_documents_granting(module: TfModule, action: str) -> list[str]:
    """aws_iam_policy_document statements (identity or resource policies) that allow `action`."""
    found = []
    for name, body in module.data.get("aws_iam_policy_document", {}).items():
        for st in blocks(body, "statement"):
            if attr(st, "effect", "Allow") != "Allow":
                continue
            actions = list(_strings(attr(st, "actions", [])))
            if grants(actions, action):
                found.append(f"data.aws_iam_policy_document.{name}:{attr(st, 'sid')}")
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("environment", [])}


def secrets_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["valueFrom"] for e in container.get("secrets", [])}


def variables_missing_descriptions(module: TfModule) -> list[str]:
    return [
        name
        for name, body in module.variables.items()
        if not str(attr(body, "description", "")).strip() or "type" not in body
    ]


def checkov_skips(text: str) -> list[tuple[str, str]]:
    """(check id, reason) of every inline `checkov:skip=` comment in a Terraform file."""
    return [(m.group(1), (m.group(2) or "").strip()) for m in re.finditer(r"checkov:skip=([A-Z0-9_]+)(?::(.*))?", text)]


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hcl2() -> Any:
    return _require_bc_hcl2()


@pytest.fixture(scope="session")
def tf(hcl2: Any) -> Terraform:
    assert TF_DIR.is_dir(), f"{TF_DIR} is missing"
    modules = {p.name: parse_module(hcl2, p) for p in sorted((TF_DIR / "modules").iterdir()) if p.is_dir()}
    return Terraform(
        root=parse_module(hcl2, TF_DIR),
        modules=modules,
        example_tfvars=load_tfvars(hcl2, EXAMPLE_TFVARS),
        all_features_tfvars=load_tfvars(hcl2, ALL_FEATURES_TFVARS),
    )


@pytest.fixture(scope="session")
def checks(hcl2: Any) -> SimpleNamespace:
    return SimpleNamespace(
        attr=attr,
        blocks=blocks,
        parse_snippet=lambda text: parse_snippet(hcl2, text),
        world_open_rules=world_open_rules,
        inline_sg_rules=inline_sg_rules,
        grants=grants,
        key_policy_statements=key_policy_statements,
        principals_allowed=principals_allowed,
        iam_documents_granting=iam_documents_granting,
        env_of=env_of,
        secrets_of=secrets_of,
        variables_missing_descriptions=variables_missing_descriptions,
        checkov_skips=checkov_skips,
    )


def _missing_tool(message: str) -> None:
    if REQUIRE_TOOLS:
        pytest.fail(message + " (INFRA_REQUIRE_TOOLS=1)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def checkov_bin() -> Path:
    path = VENV_BIN / "checkov"
    if not os.access(path, os.X_OK):
        _missing_tool(f"{path} not found: create the tools venv with `make -f infra/tools.mk infra-venv`")
    return path


@pytest.fixture(scope="session")
def terraform_bin() -> str:
    path = shutil.which("terraform")
    if path is None:
        # Terraform is optional here: only fmt and the offline validation run need it.
        pytest.skip("terraform is not on PATH; install Terraform >= 1.9 to run fmt and the variable validations")
    return path
