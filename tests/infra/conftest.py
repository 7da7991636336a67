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


def env_of(container: dict[str, Any], module: TfModule | None = None) -> dict[str, str]:
    """The environment a container always gets: its literal list, or, written as
    `concat(local.environment, local.optional_environment)`, the literal list `local.environment`
    (the optional part is read by `optional_env_names`)."""
    environment = container.get("environment", [])
    if isinstance(environment, str):
        assert module is not None, f"environment is an expression ({environment}): pass the module"
        assert re.sub(r"\s", "", environment) == "${concat(local.environment,local.optional_environment)}", environment
        environment = module.local("environment")
    return {e["name"]: e["value"] for e in environment}


def optional_env_names(module: TfModule) -> set[str]:
    """COUNTERSIGN_* names a container gets only when an optional input is set."""
    if "optional_environment" not in module.locals:
        return set()
    return set(re.findall(r"\b(COUNTERSIGN_[A-Z0-9_]+)\b", str(module.local("optional_environment"))))


def secrets_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["valueFrom"] for e in container.get("secrets", [])}


# ---------------------------------------------------------------------------------------------
# Replicas: rolling deployments, spread over the zones, state tables and who may use them
# ---------------------------------------------------------------------------------------------


def rolling_deployment_problems(service: dict[str, Any]) -> list[str]:
    """What keeps an ECS service from replacing its tasks start-first with a rollback: the minimum
    healthy percent must be 100 (never fewer tasks than desired, i.e. no stop-first), the maximum at
    least 200 (a whole new set may start beside the old one), and the circuit breaker must roll back."""
    problems = []
    minimum = attr(service, "deployment_minimum_healthy_percent")
    maximum = attr(service, "deployment_maximum_percent")
    if minimum != 100:
        problems.append(f"deployment_minimum_healthy_percent is {minimum!r}, not 100")
    if not isinstance(maximum, int) or maximum < 200:
        problems.append(f"deployment_maximum_percent is {maximum!r}, not at least 200")
    breakers = blocks(service, "deployment_circuit_breaker")
    if len(breakers) != 1 or attr(breakers[0], "enable") is not True or attr(breakers[0], "rollback") is not True:
        problems.append("no deployment circuit breaker with rollback")
    for controller in blocks(service, "deployment_controller"):
        if attr(controller, "type", "ECS") != "ECS":
            problems.append(f"deployment controller {attr(controller, 'type')!r}: the rolling update is ECS's")
    return problems


def spread_problems(module: TfModule, service: dict[str, Any], minimum: int) -> list[str]:
    """What keeps an ECS Fargate service from running at least `minimum` tasks spread over the three
    zones: its subnets must be the module's three-subnet list (Fargate spreads a service's tasks over
    its subnets' zones; placement strategies do not exist on Fargate), rebalancing on, and its
    desired_count the module's variable whose validation demands at least `minimum`."""
    problems = []
    networks = blocks(service, "network_configuration")
    subnets = attr(networks[0], "subnets") if len(networks) == 1 else None
    if subnets != "${var.subnet_ids}":
        problems.append(f"subnets are {subnets!r}, not var.subnet_ids")
    else:
        conditions = [attr(v, "condition") for v in blocks(module.variables.get("subnet_ids", {}), "validation")]
        if not any(re.fullmatch(r"\$\{length\(var\.subnet_ids\) ?== ?3\}", str(c)) for c in conditions):
            problems.append("var.subnet_ids is not validated to hold exactly three subnets")
    if attr(service, "availability_zone_rebalancing") != "ENABLED":
        problems.append("availability_zone_rebalancing is not ENABLED")
    desired = attr(service, "desired_count")
    if desired != "${var.desired_count}":
        problems.append(f"desired_count is {desired!r}, not var.desired_count")
    else:
        conditions = [attr(v, "condition") for v in blocks(module.variables.get("desired_count", {}), "validation")]
        bounds = [int(m.group(1)) for c in conditions for m in [re.search(r"var\.desired_count >= (\d+)", str(c))] if m]
        if not bounds or max(bounds) < minimum:
            problems.append(f"var.desired_count is not validated to be at least {minimum}")
    return problems


def table_shape_problems(table: dict[str, Any], *, ttl: bool) -> list[str]:
    """Differences from the table every Countersign store expects (countersign/_daemon/dynamodb.py)
    and from the protections every table here has: pk/sk strings, on-demand, TTL on expires_at (or,
    with ttl=False, no TTL at all), point-in-time recovery, the data key, deletion protection."""
    problems = []
    if attr(table, "billing_mode") != "PAY_PER_REQUEST":
        problems.append("not on-demand")
    keys = (attr(table, "hash_key"), attr(table, "range_key"))
    types = {attr(a, "name"): attr(a, "type") for a in blocks(table, "attribute")}
    if keys != ("pk", "sk") or types != {"pk": "S", "sk": "S"}:
        problems.append(f"keys {keys} {types}, not pk/sk strings")
    ttls = blocks(table, "ttl")
    if ttl and not (
        len(ttls) == 1 and attr(ttls[0], "enabled") is True and attr(ttls[0], "attribute_name") == "expires_at"
    ):
        problems.append("no TTL on expires_at")
    if not ttl and ttls:
        problems.append("has a TTL")
    pitr = blocks(table, "point_in_time_recovery")
    if len(pitr) != 1 or attr(pitr[0], "enabled") is not True:
        problems.append("no point-in-time recovery")
    sse = blocks(table, "server_side_encryption")
    if len(sse) != 1 or attr(sse[0], "enabled") is not True or attr(sse[0], "kms_key_arn") != "${var.kms_key_arn}":
        problems.append("not encrypted with the data key (var.kms_key_arn)")
    if attr(table, "deletion_protection_enabled") != "${var.deletion_protection}":
        problems.append("deletion protection is not var.deletion_protection")
    return problems


def dynamodb_statements(module: TfModule) -> list[tuple[str, list[str], list[str]]]:
    """(document:sid, actions, resources) of every Allow statement granting a dynamodb: action."""
    found = []
    for name, body in module.data.get("aws_iam_policy_document", {}).items():
        for st in blocks(body, "statement"):
            actions = list(_strings(attr(st, "actions", [])))
            if attr(st, "effect", "Allow") == "Allow" and any(
                a.lower().startswith(("dynamodb:", "*")) for a in actions
            ):
                found.append((f"{name}:{attr(st, 'sid')}", actions, list(_strings(attr(st, "resources", [])))))
    return found


def dynamodb_grants_beyond(module: TfModule, own_table: str) -> list[str]:
    """Statements that let the module's role use DynamoDB beyond the one table `own_table` (an
    expression such as "${aws_dynamodb_table.state[0].arn}"): another resource, a wildcard resource
    or action, or an index/stream of the table."""
    return [
        f"{where}: {actions} on {resources}"
        for where, actions, resources in dynamodb_statements(module)
        if resources != [own_table] or any("*" in a for a in actions)
    ]


_TRANSACT_PART_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                          "ConditionCheck": "ConditionCheckItem", "Get": "GetItem"}  # fmt: skip


def dynamodb_actions_called(source: str) -> set[str]:
    """IAM actions a store's source needs: each `self._client.<call>(` (or `client.<call>(`) as its
    action, and the parts of its transactions as theirs (IAM has no TransactWriteItems action: each
    Put/Update/Delete/ConditionCheck part is authorised as PutItem/UpdateItem/DeleteItem/ConditionCheckItem)."""
    actions = set()
    for call in re.findall(r"\b_?client\.([a-z_]+)\(", source):
        if call in ("transact_write_items", "transact_get_items", "close", "get_waiter"):
            continue
        actions.add("dynamodb:" + "".join(part.capitalize() for part in call.split("_")))
    for part in re.findall(r'\{\s*"(Put|Update|Delete|ConditionCheck|Get)"\s*:', source):
        actions.add("dynamodb:" + _TRANSACT_PART_ACTIONS[part])
    return actions


def python_function_source(path: Path, name: str) -> str:
    """Source text of the top-level function `name` in a Python file."""
    import ast

    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"{path}: no function {name}")


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
        optional_env_names=optional_env_names,
        secrets_of=secrets_of,
        rolling_deployment_problems=rolling_deployment_problems,
        spread_problems=spread_problems,
        table_shape_problems=table_shape_problems,
        dynamodb_statements=dynamodb_statements,
        dynamodb_grants_beyond=dynamodb_grants_beyond,
        dynamodb_actions_called=dynamodb_actions_called,
        python_function_source=python_function_source,
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
