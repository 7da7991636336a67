"""Invariants of infra/terraform, asserted on the parsed HCL (no provider download needed).

Each test reads what the Terraform actually says; the `test_checker_*` tests at the end feed the
same checkers deliberately bad snippets to show that they do fail.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest

TF_DIR = Path(__file__).resolve().parents[2] / "infra" / "terraform"
WORLD_CIDRS = ("0.0.0.0/0", "::/0")
DEPLOYER_ID_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"

EXPECTED_MODULES = {
    "cluster",
    "coordinator",
    "encryption",
    "network",
    "nonce_store",
    "postgres",
    "security",
    "signer",
    "verifier",
}
PORTS = {
    "coordinator": 7400,
    "signer": 7401,
    "verifier": 7402,
    "coordinator_metrics": 9400,
    "signer_metrics": 9401,
    "verifier_metrics": 9402,
}


def norm(expr: str) -> str:
    """An expression as the parser renders it, without its formatting quirks: it drops spaces,
    writes strings with single quotes, nests "'${x}'" inside lists and spells booleans True/False
    and null None."""
    expr = re.sub(r"'\$\{([^{}]*)\}'", r"\1", str(expr))
    expr = expr.replace("'", '"')
    expr = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", expr))
    expr = re.sub(r"\bNone\b", "null", expr)
    return re.sub(r"\s+", "", expr)


class Expr(str):
    """A Terraform expression that compares (==, in) modulo the parser's formatting."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and norm(self) == norm(other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(norm(self))

    def __contains__(self, fragment: object) -> bool:
        return isinstance(fragment, str) and norm(fragment) in norm(self)


def ref(expr: str) -> Expr:
    """The Terraform expression inside a parsed "${...}" string."""
    m = re.fullmatch(r"\$\{(.*)\}", expr or "", flags=re.S)
    assert m, f"expected a single expression, got {expr!r}"
    return Expr(m.group(1))


def local_expr(module: Any, name: str) -> Expr:
    return Expr(module.local(name))


# ---------------------------------------------------------------------------------------------
# Layout, versions
# ---------------------------------------------------------------------------------------------


def test_modules_exist_and_root_calls_them(tf: Any, checks: Any) -> None:
    assert set(tf.modules) == EXPECTED_MODULES
    called = {}
    for call_name, body in tf.root.module_calls.items():
        source = checks.attr(body, "source")
        assert source.startswith("./modules/"), f"module {call_name} has a non-local source {source}"
        assert (TF_DIR / source).is_dir(), f"module {call_name}: {source} does not exist"
        called[source.removeprefix("./modules/")] = call_name
    assert set(called) == EXPECTED_MODULES


def test_terraform_and_aws_provider_are_pinned(tf: Any, checks: Any) -> None:
    (tblock,) = tf.root.terraform
    required_version = checks.attr(tblock, "required_version")
    assert re.fullmatch(r">= 1\.\d+\.\d+, < 2\.0\.0", required_version), required_version
    (providers,) = checks.blocks(tblock, "required_providers")
    aws = checks.attr(providers, "aws")
    assert aws["source"] == "hashicorp/aws"
    # "~> 6.57.0" pins one minor release (patches only).
    assert re.fullmatch(r"~> \d+\.\d+\.\d+", aws["version"]), aws["version"]
    for name, module in tf.modules.items():
        (mblock,) = module.terraform
        (mprov,) = checks.blocks(mblock, "required_providers")
        assert checks.attr(mprov, "aws")["source"] == "hashicorp/aws", name


# ---------------------------------------------------------------------------------------------
# Network: three private subnets in three distinct zones, no internet path, endpoints, flow logs
# ---------------------------------------------------------------------------------------------


def test_availability_zones_variable_demands_exactly_three_distinct(tf: Any, checks: Any) -> None:
    var = tf.root.variables["availability_zones"]
    conditions = " ".join(checks.attr(v, "condition") for v in checks.blocks(var, "validation"))
    assert "length(var.availability_zones) == 3" in conditions
    assert "length(distinct(var.availability_zones)) == 3" in conditions


def test_three_private_subnets_one_per_zone(tf: Any, checks: Any) -> None:
    network = tf.module("network")
    subnets = network.resources_of("aws_subnet")
    assert list(subnets) == ["private"], "exactly one subnet resource (counted over the zones)"
    subnet = subnets["private"]
    assert ref(checks.attr(subnet, "count")) == "length(var.availability_zones)"
    assert ref(checks.attr(subnet, "availability_zone")) == "var.availability_zones[count.index]"
    assert ref(checks.attr(subnet, "cidr_block")) == "cidrsubnet(var.vpc_cidr, 2, count.index)"
    assert checks.attr(subnet, "map_public_ip_on_launch") is False
    # The root passes the validated three zones.
    call = tf.root.module_calls["network"]
    assert ref(checks.attr(call, "availability_zones")) == "var.availability_zones"

    for tfvars in (tf.example_tfvars, tf.all_features_tfvars):
        zones = tfvars["availability_zones"]
        assert len(zones) == 3 and len(set(zones)) == 3
        assert all(z.startswith(tfvars["region"]) for z in zones)


def test_subnet_cidrs_are_three_disjoint_quarters() -> None:
    # Same arithmetic as cidrsubnet(var.vpc_cidr, 2, i) for i in 0..2 on the default VPC CIDR.
    vpc = ipaddress.ip_network("10.40.0.0/16")
    quarters = list(vpc.subnets(prefixlen_diff=2))[:3]
    assert len({q.network_address for q in quarters}) == 3
    assert all(not a.overlaps(b) for i, a in enumerate(quarters) for b in quarters[i + 1 :])


def test_no_internet_gateway_nat_or_public_address(tf: Any, checks: Any) -> None:
    for name, module in tf.all_modules():
        for forbidden in ("aws_internet_gateway", "aws_nat_gateway", "aws_eip", "aws_egress_only_internet_gateway"):
            assert not module.resources_of(forbidden), f"{name} declares {forbidden}"
        for rname, route in module.resources_of("aws_route").items():
            assert checks.attr(route, "destination_cidr_block") not in WORLD_CIDRS, f"{name}: aws_route.{rname}"
        for rname, table in module.resources_of("aws_route_table").items():
            assert not checks.blocks(table, "route"), f"{name}: aws_route_table.{rname} has routes beyond local"


def test_vpc_endpoints_replace_nat(tf: Any, checks: Any) -> None:
    network = tf.module("network")
    endpoints = network.resources_of("aws_vpc_endpoint")
    gateway = endpoints["gateway"]
    assert ref(checks.attr(gateway, "for_each")) == 'toset(["s3", "dynamodb"])'
    assert checks.attr(gateway, "vpc_endpoint_type") == "Gateway"
    interface = endpoints["interface"]
    assert checks.attr(interface, "vpc_endpoint_type") == "Interface"
    assert checks.attr(interface, "private_dns_enabled") is True
    services = checks.attr(network.variables["interface_endpoint_services"], "default")
    assert {"kms", "logs", "ecr.api", "ecr.dkr", "secretsmanager"} <= set(services)


def test_flow_logs_capture_all_traffic_encrypted(tf: Any, checks: Any) -> None:
    network = tf.module("network")
    (flow_log,) = network.resources_of("aws_flow_log").values()
    assert checks.attr(flow_log, "traffic_type") == "ALL"
    assert ref(checks.attr(flow_log, "vpc_id")) == "aws_vpc.this.id"
    assert ref(checks.attr(flow_log, "log_destination")) == "aws_cloudwatch_log_group.flow_logs.arn"
    group = network.resource("aws_cloudwatch_log_group", "flow_logs")
    assert ref(checks.attr(group, "kms_key_id")) == "var.kms_key_arn"


# ---------------------------------------------------------------------------------------------
# Signing keys: one Ed25519 KMS key and one role per deployer, only that role signs
# ---------------------------------------------------------------------------------------------


def _all_kms_keys(tf: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (mname, kname, body) for mname, m in tf.all_modules() for kname, body in m.resources_of("aws_kms_key").items()
    ]


def test_signer_module_is_instantiated_once_per_deployer(tf: Any, checks: Any) -> None:
    call = tf.root.module_calls["signer"]
    assert ref(checks.attr(call, "for_each")) == "var.deployers"
    assert ref(checks.attr(call, "deployer_id")) == "each.key"
    signer = tf.module("signer")
    # Inside the module: exactly one key and one task role, neither multiplied by count/for_each.
    assert list(signer.resources_of("aws_kms_key")) == ["signer"]
    key = signer.resource("aws_kms_key", "signer")
    assert "count" not in key and "for_each" not in key
    task_def = signer.resource("aws_ecs_task_definition", "signer")
    assert ref(checks.attr(task_def, "task_role_arn")) == "aws_iam_role.signer.arn"
    assert ref(checks.attr(task_def, "execution_role_arn")) == "aws_iam_role.execution.arn"
    role = signer.resource("aws_iam_role", "signer")
    assert "count" not in role and "for_each" not in role
    # One service per deployer (its replicas are its tasks).
    assert list(signer.resources_of("aws_ecs_service")) == ["signer"]
    service = signer.resource("aws_ecs_service", "signer")
    assert "count" not in service and "for_each" not in service


def test_every_signing_key_is_ed25519_sign_verify(tf: Any, checks: Any) -> None:
    signing = [(m, k, b) for m, k, b in _all_kms_keys(tf) if checks.attr(b, "key_usage") == "SIGN_VERIFY"]
    assert [(m, k) for m, k, _ in signing] == [("signer", "signer")]
    for _, _, body in signing:
        assert checks.attr(body, "customer_master_key_spec") == "ECC_NIST_EDWARDS25519"
        assert checks.attr(body, "is_enabled") is True
        assert checks.attr(body, "multi_region") is False
    # Every other key is a symmetric data key that cannot sign at all.
    for m, k, body in _all_kms_keys(tf):
        if (m, k) != ("signer", "signer"):
            assert checks.attr(body, "key_usage") == "ENCRYPT_DECRYPT", (m, k)
            assert checks.attr(body, "customer_master_key_spec") == "SYMMETRIC_DEFAULT", (m, k)


def test_signing_key_policy_lets_only_the_signer_role_sign(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    key = signer.resource("aws_kms_key", "signer")
    statements = checks.key_policy_statements(signer, key)
    own_role = "${aws_iam_role.signer.arn}"

    assert checks.principals_allowed(signer, statements, "kms:Sign") == [own_role]
    assert checks.principals_allowed(signer, statements, "kms:GetPublicKey") == [own_role]
    # Nobody may hand out signing through a grant.
    assert checks.principals_allowed(signer, statements, "kms:CreateGrant") == []

    # The administrators: key management only, no wildcard action at all.
    admin = [s for s in statements if s["Sid"] == "KeyAdministrationWithoutUse"]
    assert len(admin) == 1
    assert admin[0]["Principal"] == {"AWS": "${var.kms_admin_arns}"}
    admin_actions = signer.local("key_admin_actions")
    assert not any("*" in a for a in admin_actions)
    for forbidden in ("kms:Sign", "kms:Verify", "kms:GetPublicKey", "kms:CreateGrant", "kms:Decrypt"):
        assert not checks.grants(admin_actions, forbidden), forbidden
    assert "kms:PutKeyPolicy" in admin_actions and "kms:ScheduleKeyDeletion" in admin_actions

    # kms:Sign only with pure Ed25519 (never Ed25519ph), on a statement that allows nothing else.
    signing = [s for s in statements if s["Effect"] == "Allow" and checks.grants(s["Action"], "kms:Sign")]
    assert len(signing) == 1
    assert signing[0]["Action"] == ["kms:Sign"]
    assert signing[0]["Condition"] == {"StringEquals": {"kms:SigningAlgorithm": "ED25519_SHA_512"}}
    public_key = [s for s in statements if s["Effect"] == "Allow" and checks.grants(s["Action"], "kms:GetPublicKey")]
    assert len(public_key) == 1 and "Condition" not in public_key[0]

    # An explicit deny of kms:Sign for every other principal.
    denies = [s for s in statements if s["Effect"] == "Deny" and checks.grants(s["Action"], "kms:Sign")]
    assert len(denies) == 1
    assert denies[0]["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": own_role}}

    # The role in the policy is the one the signer task runs as.
    task_def = signer.resource("aws_ecs_task_definition", "signer")
    assert "${" + ref(checks.attr(task_def, "task_role_arn")) + "}" == own_role


def test_kms_admins_default_to_the_account_root(tf: Any, checks: Any) -> None:
    call = tf.root.module_calls["signer"]
    assert ref(checks.attr(call, "kms_admin_arns")) == "local.kms_admin_arns"
    assert "var.kms_admin_principal_arns : [local.account_root_arn]" in local_expr(tf.root, "kms_admin_arns")


def test_no_identity_policy_grants_signing(tf: Any, checks: Any) -> None:
    for name, module in tf.all_modules():
        assert checks.iam_documents_granting(module, "kms:Sign") == [], name
        assert checks.iam_documents_granting(module, "kms:CreateGrant") == [], name
        for pname, attachment in module.resources_of("aws_iam_role_policy_attachment").items():
            arn = checks.attr(attachment, "policy_arn")
            assert "AdministratorAccess" not in arn and "KMS" not in arn, f"{name}: {pname} attaches {arn}"


def test_one_signer_key_output_per_deployer(tf: Any, checks: Any) -> None:
    outputs = tf.root.outputs
    assert (
        ref(checks.attr(outputs["signer_kms_key_arns"], "value"))
        == "{ for id, signer in module.signer : id => signer.kms_key_arn }"
    )
    assert (
        ref(checks.attr(outputs["signer_role_arns"], "value"))
        == "{ for id, signer in module.signer : id => signer.role_arn }"
    )


# ---------------------------------------------------------------------------------------------
# Nonce store
# ---------------------------------------------------------------------------------------------


def test_nonce_table_ttl_keys_pitr_encryption(tf: Any, checks: Any) -> None:
    tables = tf.module("nonce_store").resources_of("aws_dynamodb_table")
    assert list(tables) == ["nonces"]
    table = tables["nonces"]
    assert checks.attr(table, "billing_mode") == "PAY_PER_REQUEST"
    assert checks.attr(table, "hash_key") == "pk"
    assert checks.attr(table, "range_key") == "sk"
    assert {checks.attr(a, "name"): checks.attr(a, "type") for a in checks.blocks(table, "attribute")} == {
        "pk": "S",
        "sk": "S",
    }
    (ttl,) = checks.blocks(table, "ttl")
    assert checks.attr(ttl, "enabled") is True
    assert checks.attr(ttl, "attribute_name") == "expires_at"
    (pitr,) = checks.blocks(table, "point_in_time_recovery")
    assert checks.attr(pitr, "enabled") is True
    (sse,) = checks.blocks(table, "server_side_encryption")
    assert checks.attr(sse, "enabled") is True
    assert ref(checks.attr(sse, "kms_key_arn")) == "var.kms_key_arn"
    assert ref(checks.attr(tf.root.module_calls["nonce_store"], "kms_key_arn")) == "module.encryption.key_arn"


# ---------------------------------------------------------------------------------------------
# Replicas: signers and coordinators over shared state, spread over the zones, rolled start-first
# ---------------------------------------------------------------------------------------------

REPO_ROOT = TF_DIR.parents[1]


def _services(tf: Any) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, n, b) for m, mod in tf.all_modules() for n, b in mod.resources_of("aws_ecs_service").items()]


def _cloud_map_reaches_every_task(checks: Any, module: Any, service: dict[str, Any], discovery: str) -> None:
    (registry,) = checks.blocks(service, "service_registries")
    assert ref(checks.attr(registry, "registry_arn")) == f"aws_service_discovery_service.{discovery}.arn"
    body = module.resource("aws_service_discovery_service", discovery)
    (dns,) = checks.blocks(body, "dns_config")
    # MULTIVALUE: one A record per healthy task (up to eight per answer), not one chosen task.
    assert checks.attr(dns, "routing_policy") == "MULTIVALUE"
    assert [checks.attr(r, "type") for r in checks.blocks(dns, "dns_records")] == ["A"]
    assert checks.blocks(body, "health_check_custom_config")


def test_signer_replicas_spread_over_the_three_zones(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    service = signer.resource("aws_ecs_service", "signer")
    assert checks.spread_problems(signer, service, 3) == []
    call = tf.root.module_calls["signer"]
    assert ref(checks.attr(call, "subnet_ids")) == "module.network.private_subnet_ids"
    assert ref(checks.attr(call, "desired_count")) == "each.value.desired_count"
    deployers = tf.root.variables["deployers"]
    assert '"desired_count": optional(number, 3)' in Expr(checks.attr(deployers, "type"))
    conditions = [checks.attr(v, "condition") for v in checks.blocks(deployers, "validation")]
    assert any("d.desired_count >= 3" in Expr(c) for c in conditions)
    # zone_index (one zone per signer) is refused, not silently ignored, and nothing reads it.
    assert any("d.zone_index == null" in Expr(c) for c in conditions)
    assert "zone_index" not in (TF_DIR / "main.tf").read_text()
    # Runtimes and peer signers reach all the replicas under the deployer's one name.
    _cloud_map_reaches_every_task(checks, signer, service, "signer")
    assert checks.attr(signer.resource("aws_service_discovery_service", "signer"), "name") == "${var.deployer_slug}"


def test_two_coordinators_over_one_log_across_zones(tf: Any, checks: Any) -> None:
    coordinator = tf.module("coordinator")
    service = coordinator.resource("aws_ecs_service", "coordinator")
    assert checks.spread_problems(coordinator, service, 2) == []
    call = tf.root.module_calls["coordinator"]
    assert ref(checks.attr(call, "subnet_ids")) == "module.network.private_subnet_ids"
    assert ref(checks.attr(call, "desired_count")) == "var.coordinator_count"
    count = tf.root.variables["coordinator_count"]
    assert checks.attr(count, "default") == 2
    assert any(
        "var.coordinator_count >= 2" in Expr(checks.attr(v, "condition")) for v in checks.blocks(count, "validation")
    )
    # Followers (signers and verifiers) name one DNS name that resolves to every coordinator task.
    _cloud_map_reaches_every_task(checks, coordinator, service, "coordinator")
    assert checks.attr(coordinator.resource("aws_service_discovery_service", "coordinator"), "name") == "coordinator"
    assert tf.root.local("coordinator_address").startswith("coordinator.${var.service_discovery_namespace}:")
    for follower in ("signer", "verifier"):
        assert ref(checks.attr(tf.root.module_calls[follower], "coordinator_address")) == "local.coordinator_address"
    # One shared log: every replica's log_store names the same table (or the same schema).
    assert "sqlite" not in local_expr(coordinator, "log_store")


def test_services_roll_start_first_with_rollback(tf: Any, checks: Any) -> None:
    """No stop-first deployment anywhere: every service keeps 100 % of its tasks while new ones start."""
    services = _services(tf)
    assert {(m, n) for m, n, _ in services} == {
        ("coordinator", "coordinator"),
        ("signer", "signer"),
        ("verifier", "verifier"),
    }
    for m, n, body in services:
        assert checks.rolling_deployment_problems(body) == [], (m, n)


def test_one_state_table_per_deployer(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    assert ref(checks.attr(tf.root.module_calls["signer"], "for_each")) == "var.deployers"
    tables = signer.resources_of("aws_dynamodb_table")
    assert list(tables) == ["state"]
    table = tables["state"]
    # At most one inside each instance of the module: DynamoDB unless the state is on PostgreSQL.
    assert "for_each" not in table
    assert ref(checks.attr(table, "count")) == "local.on_dynamodb ? 1 : 0"
    assert ref(signer.local("on_dynamodb")) == 'var.state_backend == "dynamodb"'
    assert checks.attr(tf.root.variables["signer_state_backend"], "default") == "dynamodb"
    assert ref(checks.attr(tf.root.module_calls["signer"], "state_backend")) == "var.signer_state_backend"
    # Named after the deployer (slugs are validated distinct), so two deployers never share one.
    assert "${var.deployer_slug}" in checks.attr(table, "name")
    assert checks.table_shape_problems(table, ttl=True) == []
    assert ref(checks.attr(tf.root.module_calls["signer"], "deletion_protection")) == "var.deletion_protection"
    # The root declares no table of its own that signers could share.
    assert not tf.root.resources_of("aws_dynamodb_table")


def test_every_table_has_the_store_shape_and_protections(tf: Any, checks: Any) -> None:
    expected = {("nonce_store", "nonces"): True, ("signer", "state"): True, ("coordinator", "registry"): False}
    tables = {(m, n): b for m, mod in tf.all_modules() for n, b in mod.resources_of("aws_dynamodb_table").items()}
    assert set(tables) == set(expected)
    for where, ttl in expected.items():
        # The registry log never expires: its table has no TTL at all.
        assert checks.table_shape_problems(tables[where], ttl=ttl) == [], where
    registry = tf.module("coordinator").resource("aws_dynamodb_table", "registry")
    assert ref(checks.attr(registry, "count")) == "local.on_dynamodb ? 1 : 0"
    assert checks.attr(tf.root.variables["registry_store_backend"], "default") == "dynamodb"


def test_each_signer_role_reaches_only_its_own_table(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    own = "${aws_dynamodb_table.state[0].arn}"
    statements = checks.dynamodb_statements(signer)
    assert [where for where, _, _ in statements] == ["task_state_table:OwnStateTableItems"]
    assert checks.dynamodb_grants_beyond(signer, own) == []
    # That document is attached to the signer's task role, the role its tasks run as; the module
    # attaches nothing else that could widen it.
    attached = signer.resource("aws_iam_role_policy", "task_state_table")
    assert ref(checks.attr(attached, "role")) == "aws_iam_role.signer.id"
    assert ref(checks.attr(attached, "policy")) == "data.aws_iam_policy_document.task_state_table[0].json"
    assert not signer.resources_of("aws_iam_role_policy_attachment")
    assert not signer.resources_of("aws_iam_policy")
    for name, body in signer.resources_of("aws_iam_role_policy").items():
        if ref(checks.attr(body, "role")) == "aws_iam_role.signer.id":
            assert name == "task_state_table", f"{name} widens the signer task role"
    # No other module is handed a signer's table, and their own grants stay on their own tables.
    for call_name, body in tf.root.module_calls.items():
        if call_name != "signer":
            assert "module.signer" not in str(body), call_name
    assert checks.dynamodb_grants_beyond(tf.module("coordinator"), "${aws_dynamodb_table.registry[0].arn}") == []
    assert checks.dynamodb_grants_beyond(tf.module("verifier"), "${var.nonce_table_arn}") == []
    # Table encryption through DynamoDB only.
    (kms,) = [
        st
        for st in checks.blocks(signer.data["aws_iam_policy_document"]["task_state_table"], "statement")
        if any(a.startswith("kms:") for a in checks.attr(st, "actions"))
    ]
    (condition,) = checks.blocks(kms, "condition")
    assert checks.attr(condition, "variable") == "kms:ViaService"
    assert checks.attr(condition, "values") == ["dynamodb.${var.region}.amazonaws.com"]


def _store_actions(checks: Any, path: str) -> set[str]:
    describe = checks.python_function_source(REPO_ROOT / "countersign/_daemon/dynamodb.py", "check_table")
    return checks.dynamodb_actions_called((REPO_ROOT / path).read_text() + describe)


@pytest.mark.parametrize(
    "module, document, store",
    [
        ("signer", "task_state_table", "signer/stores/dynamodb.py"),
        ("coordinator", "task_registry_table", "coordinator/dynamodb_store.py"),
    ],
)
def test_table_permissions_are_exactly_the_stores_calls(
    tf: Any, checks: Any, module: str, document: str, store: str
) -> None:
    """Least privilege that keeps up with the code: the role may make exactly the DynamoDB calls its
    store makes (a new call in the store fails here until the policy grants it)."""
    (granted,) = [
        actions for where, actions, _ in checks.dynamodb_statements(tf.module(module)) if where.startswith(document)
    ]
    assert set(granted) == _store_actions(checks, store)


def test_verifier_permissions_cover_its_store_calls(tf: Any, checks: Any) -> None:
    source = (REPO_ROOT / "verifier/stores/dynamodb.py").read_text()
    own_calls = "\n".join(re.findall(r"self\._client\.[a-z_]+\(", source))
    parts = "\n".join(re.findall(r'\{\s*"(?:Put|Update|Delete|ConditionCheck|Get)"\s*:', source))
    needed = checks.dynamodb_actions_called(own_calls + "\n" + parts)
    granted = {a for _, actions, _ in checks.dynamodb_statements(tf.module("verifier")) for a in actions}
    assert needed and needed <= granted, needed - granted


def test_signer_state_on_postgresql_is_per_deployer(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    # Its own database and login role (one name), from the deployer's id; its own password secret.
    assert ref(signer.local("postgres_name")) == '"countersign_signer_${replace(local.short_id, "-", "_")}"'
    secret = signer.resource("aws_secretsmanager_secret", "state_password")
    assert "${var.deployer_id}" in checks.attr(secret, "name")
    assert ref(checks.attr(secret, "count")) == "local.on_dynamodb ? 0 : 1"
    execution = signer.data["aws_iam_policy_document"]["execution"]
    (reads,) = [st for st in checks.blocks(execution, "statement") if checks.attr(st, "sid") == "ReadOwnSecrets"]
    resources = Expr(checks.attr(reads, "resources"))
    assert "aws_secretsmanager_secret.tls.arn" in resources
    assert "aws_secretsmanager_secret.state_password[0].arn" in resources
    assert "var.postgres.password_secret" not in resources, "the master password is not the signer's"
    # The network path: each signer's group to the database, only when its state is there.
    security = tf.module("security")
    rule = security.resource("aws_vpc_security_group_ingress_rule", "postgres_from_signer")
    assert ref(checks.attr(rule, "referenced_security_group_id")) == "aws_security_group.signer[each.key].id"
    assert "local.signers_on_postgres" in ref(checks.attr(rule, "for_each"))


def test_no_shared_file_system_holds_state(tf: Any, checks: Any) -> None:
    """Replicas on several hosts share state through DynamoDB or PostgreSQL, never a file on EFS."""
    for name, module in tf.all_modules():
        efs = [rtype for rtype in module.resources if rtype.startswith("aws_efs_")]
        assert efs == [], f"{name}: {efs}"
        for tname, body in module.resources_of("aws_ecs_task_definition").items():
            assert "efs_volume_configuration" not in str(body), f"{name}: {tname}"


# ---------------------------------------------------------------------------------------------
# Security groups
# ---------------------------------------------------------------------------------------------


def test_no_rule_is_open_to_the_world(tf: Any, checks: Any) -> None:
    for name, module in tf.all_modules():
        assert checks.world_open_rules(module) == [], name
        assert checks.inline_sg_rules(module) == [], name
        assert not module.resources_of("aws_security_group_rule"), f"{name}: use aws_vpc_security_group_*_rule"
    for tfvars in (tf.example_tfvars, tf.all_features_tfvars):
        cidrs = [
            c
            for v in ("consumer_cidr_blocks", "operator_cidr_blocks", "metrics_cidr_blocks")
            for c in tfvars.get(v, [])
        ]
        for d in tfvars["deployers"].values():
            cidrs += d.get("runtime_cidr_blocks", [])
        assert cidrs, "the example should show the CIDR inputs"
        for c in cidrs:
            assert ipaddress.ip_network(c).prefixlen >= 8, c


def test_every_rule_has_one_narrow_source_or_destination(tf: Any, checks: Any) -> None:
    """Ingress: another security group, or a CIDR from a validated variable; egress: a security
    group or a gateway prefix list. No rule opens all protocols or a port range."""
    allowed_cidr_sources = {
        "each.value",  # toset(var.consumer_cidr_blocks)
        "each.value.cidr",  # runtime / metrics CIDRs
        "aws_vpc.this.cidr_block",  # VPC endpoints: HTTPS from inside the VPC
    }
    count = 0
    for mname, module in tf.all_modules():
        for rtype in ("aws_vpc_security_group_ingress_rule", "aws_vpc_security_group_egress_rule"):
            for rname, rule in module.resources_of(rtype).items():
                count += 1
                where = f"{mname}: {rtype}.{rname}"
                targets = [
                    f for f in ("cidr_ipv4", "cidr_ipv6", "referenced_security_group_id", "prefix_list_id") if f in rule
                ]
                assert len(targets) == 1, where
                assert "cidr_ipv6" not in rule, where
                assert checks.attr(rule, "ip_protocol") == "tcp", where
                assert checks.attr(rule, "from_port") == checks.attr(rule, "to_port"), where
                assert str(checks.attr(rule, "description", "")).strip(), where
                if "cidr_ipv4" in rule:
                    assert rtype.endswith("ingress_rule"), f"{where}: egress to a CIDR"
                    assert ref(checks.attr(rule, "cidr_ipv4")) in allowed_cidr_sources, where
    assert count >= 20


def test_cidr_rules_come_from_validated_variables(tf: Any, checks: Any) -> None:
    security = tf.module("security")
    rules = security.resources_of("aws_vpc_security_group_ingress_rule")
    assert ref(checks.attr(rules["nlb_from_consumer_cidrs"], "for_each")) == "toset(var.consumer_cidr_blocks)"
    assert ref(checks.attr(rules["coordinator_from_operator_cidrs"], "for_each")) == "toset(var.operator_cidr_blocks)"
    assert ref(checks.attr(rules["metrics_from_cidrs"], "for_each")) == "local.metrics_from_cidrs"
    assert "var.metrics_cidr_blocks" in local_expr(security, "metrics_from_cidrs")
    assert ref(checks.attr(rules["signer_from_runtime_cidrs"], "for_each")) == "local.signer_runtime_cidrs"
    assert "d.runtime_cidr_blocks" in local_expr(security, "signer_runtime_cidrs")
    call = tf.root.module_calls["security"]
    cidr_vars = ("consumer_cidr_blocks", "operator_cidr_blocks", "metrics_cidr_blocks", "deployers")
    for var in cidr_vars:
        assert ref(checks.attr(call, var)) == f"var.{var}"
    # Those root variables refuse 0.0.0.0/0: IPv4 network addresses with a prefix of /8 or longer.
    prefix_rule = "/([89]|[12][0-9]|3[0-2])$"
    for var in cidr_vars:
        conditions = Expr(
            " ".join(checks.attr(v, "condition") for v in checks.blocks(tf.root.variables[var], "validation"))
        )
        assert prefix_rule in conditions, var
        assert "cidrsubnet(c, 0, 0) == c" in conditions, var


def test_paths_use_the_design_ports(tf: Any, checks: Any) -> None:
    assert tf.root.local("ports") == PORTS
    security = tf.module("security")
    ingress = security.resources_of("aws_vpc_security_group_ingress_rule")
    egress = security.resources_of("aws_vpc_security_group_egress_rule")
    expected = {
        ("ingress", "nlb_from_consumer_cidrs"): ("aws_security_group.nlb.id", "var.ports.verifier"),
        ("ingress", "nlb_from_consumer_sgs"): ("aws_security_group.nlb.id", "var.ports.verifier"),
        ("egress", "nlb_to_verifier"): ("aws_security_group.nlb.id", "var.ports.verifier"),
        ("ingress", "verifier_from_nlb"): ("aws_security_group.verifier.id", "var.ports.verifier"),
        ("ingress", "coordinator_from_verifier"): ("aws_security_group.coordinator.id", "var.ports.coordinator"),
        ("egress", "verifier_to_coordinator"): ("aws_security_group.verifier.id", "var.ports.coordinator"),
        ("ingress", "coordinator_from_signer"): ("aws_security_group.coordinator.id", "var.ports.coordinator"),
        ("ingress", "coordinator_from_operator_cidrs"): ("aws_security_group.coordinator.id", "var.ports.coordinator"),
        ("ingress", "coordinator_from_operator_sgs"): ("aws_security_group.coordinator.id", "var.ports.coordinator"),
        ("egress", "signer_to_coordinator"): ("aws_security_group.signer[each.key].id", "var.ports.coordinator"),
        ("ingress", "signer_from_peer"): ("aws_security_group.signer[each.value.to].id", "var.ports.signer"),
        ("egress", "signer_to_peer"): ("aws_security_group.signer[each.value.from].id", "var.ports.signer"),
        ("ingress", "signer_from_runtime_cidrs"): (
            "aws_security_group.signer[each.value.deployer].id",
            "var.ports.signer",
        ),
        ("ingress", "signer_from_runtime_sgs"): (
            "aws_security_group.signer[each.value.deployer].id",
            "var.ports.signer",
        ),
    }
    for (direction, name), (sg, port) in expected.items():
        rule = (ingress if direction == "ingress" else egress)[name]
        assert ref(checks.attr(rule, "security_group_id")) == sg, name
        assert ref(checks.attr(rule, "from_port")) == port, name
    # Signer <-> signer only along declared delegation edges.
    assert ref(checks.attr(ingress["signer_from_peer"], "for_each")) == "local.signer_flows"
    assert "var.delegation_edges" in local_expr(security, "signer_flows")
    # Metrics: the three metrics ports, nothing else.
    targets = local_expr(security, "metrics_targets")
    for port in ("var.ports.coordinator_metrics", "var.ports.verifier_metrics", "var.ports.signer_metrics"):
        assert port in targets
    # Every rule in the module targets one of its own security groups or a metrics target.
    for rules in (ingress, egress):
        for name, rule in rules.items():
            sg = ref(checks.attr(rule, "security_group_id"))
            assert sg.startswith(("aws_security_group.", "local.metrics_targets", "local.task_security_groups")), name


def test_security_groups_are_attached(tf: Any, checks: Any) -> None:
    """What the CKV2_AWS_5 skips promise: every security group of modules/security is attached."""
    security_outputs = {name: ref(checks.attr(body, "value")) for name, body in tf.module("security").outputs.items()}
    # security output -> (module, variable) in the root module calls
    wiring: dict[str, list[tuple[str, str]]] = {}
    for call_name, body in tf.root.module_calls.items():
        for key, value in body.items():
            if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
                m = re.search(r"module\.security\.(\w+)", value[0])
                if m:
                    wiring.setdefault(m.group(1), []).append((call_name, key))
    attachments = {
        ("verifier", "nlb_security_group_id"): ("aws_lb", "verifier", "security_groups"),
        ("verifier", "security_group_id"): ("aws_ecs_service", "verifier", "network_configuration.security_groups"),
        ("coordinator", "security_group_id"): (
            "aws_ecs_service",
            "coordinator",
            "network_configuration.security_groups",
        ),
        ("signer", "security_group_id"): ("aws_ecs_service", "signer", "network_configuration.security_groups"),
        ("postgres", "security_group_id"): ("aws_db_instance", "this", "vpc_security_group_ids"),
    }
    for output in security_outputs:
        assert output in wiring, f"security output {output} is not used by the root module"
        for call_name, var in wiring[output]:
            rtype, rname, path = attachments[(call_name, var)]
            body = tf.module(call_name).resource(rtype, rname)
            for part in path.split(".")[:-1]:
                (body,) = checks.blocks(body, part)
            value = checks.attr(body, path.split(".")[-1])
            assert f"${{var.{var}}}" in value, f"{call_name}.{rtype}.{rname} does not attach var.{var}"


def test_default_security_group_is_emptied(tf: Any, checks: Any) -> None:
    (default_sg,) = tf.module("network").resources_of("aws_default_security_group").values()
    assert "ingress" not in default_sg and "egress" not in default_sg


# ---------------------------------------------------------------------------------------------
# Verifier load balancer
# ---------------------------------------------------------------------------------------------


def test_verifier_nlb_is_internal_tcp_with_health_checks(tf: Any, checks: Any) -> None:
    verifier = tf.module("verifier")
    (lb,) = verifier.resources_of("aws_lb").values()
    assert checks.attr(lb, "internal") is True
    assert checks.attr(lb, "load_balancer_type") == "network"
    assert ref(checks.attr(lb, "subnets")) == "var.subnet_ids"
    assert checks.attr(lb, "enable_cross_zone_load_balancing") is True
    assert ref(checks.attr(tf.root.module_calls["verifier"], "subnet_ids")) == "module.network.private_subnet_ids"

    (listener,) = verifier.resources_of("aws_lb_listener").values()
    assert checks.attr(listener, "protocol") == "TCP"
    assert ref(checks.attr(listener, "port")) == "var.ports.verifier"

    (tg,) = verifier.resources_of("aws_lb_target_group").values()
    assert checks.attr(tg, "protocol") == "TCP"
    assert checks.attr(tg, "target_type") == "ip"
    assert ref(checks.attr(tg, "port")) == "var.ports.verifier"
    (hc,) = checks.blocks(tg, "health_check")
    assert checks.attr(hc, "enabled") is True
    assert checks.attr(hc, "protocol") == "TCP"

    service = verifier.resource("aws_ecs_service", "verifier")
    (lb_block,) = checks.blocks(service, "load_balancer")
    assert ref(checks.attr(lb_block, "container_port")) == "var.ports.verifier"
    (net,) = checks.blocks(service, "network_configuration")
    assert ref(checks.attr(net, "subnets")) == "var.subnet_ids"
    assert ref(checks.attr(service, "desired_count")) == "var.desired_count"
    assert checks.attr(service, "availability_zone_rebalancing") == "ENABLED"
    conditions = " ".join(
        checks.attr(v, "condition") for v in checks.blocks(tf.root.variables["verifier_count"], "validation")
    )
    assert "var.verifier_count >= 3" in conditions

    for lb_name, lb_body in ((m, b) for _, mod in tf.all_modules() for m, b in mod.resources_of("aws_lb").items()):
        assert checks.attr(lb_body, "internal") is True, lb_name


# ---------------------------------------------------------------------------------------------
# Encryption at rest
# ---------------------------------------------------------------------------------------------


def test_encryption_at_rest_everywhere(tf: Any, checks: Any) -> None:
    seen: dict[str, int] = {}
    for mname, module in tf.all_modules():
        for name, body in module.resources_of("aws_cloudwatch_log_group").items():
            assert checks.attr(body, "kms_key_id"), f"{mname}: log group {name}"
            assert int(str(checks.attr(body, "retention_in_days")).replace("${var.log_retention_days}", "365")) >= 365
            seen["log_group"] = seen.get("log_group", 0) + 1
        for name, body in module.resources_of("aws_secretsmanager_secret").items():
            assert checks.attr(body, "kms_key_id"), f"{mname}: secret {name}"
            seen["secret"] = seen.get("secret", 0) + 1
        for name, body in module.resources_of("aws_db_instance").items():
            assert checks.attr(body, "storage_encrypted") is True, name
            for key in ("kms_key_id", "performance_insights_kms_key_id", "master_user_secret_kms_key_id"):
                assert checks.attr(body, key), f"{mname}: db {name} {key}"
            seen["rds"] = 1
        for name, body in module.resources_of("aws_ecr_repository").items():
            (enc,) = checks.blocks(body, "encryption_configuration")
            assert checks.attr(enc, "encryption_type") == "KMS" and checks.attr(enc, "kms_key"), name
            seen["ecr"] = 1
        for name, body in module.resources_of("aws_dynamodb_table").items():
            (sse,) = checks.blocks(body, "server_side_encryption")
            assert checks.attr(sse, "enabled") is True and checks.attr(sse, "kms_key_arn"), name
            seen["dynamodb"] = seen.get("dynamodb", 0) + 1
    # TLS of coordinator, verifier and signer; the signer's PostgreSQL password.
    assert seen.get("log_group", 0) >= 6 and seen.get("secret", 0) == 4
    assert seen.get("dynamodb") == 3  # nonces, registry log, signer state
    assert {"rds", "ecr"} <= set(seen)
    data_key = tf.module("encryption").resource("aws_kms_key", "data")
    assert checks.attr(data_key, "enable_key_rotation") is True


# ---------------------------------------------------------------------------------------------
# PostgreSQL (optional)
# ---------------------------------------------------------------------------------------------


def test_postgres_is_optional_private_multi_az_encrypted(tf: Any, checks: Any) -> None:
    call = tf.root.module_calls["postgres"]
    assert ref(checks.attr(call, "count")) == "var.enable_postgres ? 1 : 0"
    assert checks.attr(tf.root.variables["enable_postgres"], "default") is False
    postgres = tf.module("postgres")
    (db,) = postgres.resources_of("aws_db_instance").values()
    assert checks.attr(db, "publicly_accessible") is False
    assert checks.attr(db, "multi_az") is True
    assert checks.attr(db, "storage_encrypted") is True
    assert checks.attr(db, "manage_master_user_password") is True
    assert "password" not in db, "the password must come from the RDS-managed secret"
    assert ref(checks.attr(db, "db_subnet_group_name")) == "aws_db_subnet_group.this.name"
    (subnet_group,) = postgres.resources_of("aws_db_subnet_group").values()
    assert ref(checks.attr(subnet_group, "subnet_ids")) == "var.subnet_ids"
    assert ref(checks.attr(call, "subnet_ids")) == "module.network.private_subnet_ids"
    (params,) = postgres.resources_of("aws_db_parameter_group").values()
    settings = {checks.attr(p, "name"): checks.attr(p, "value") for p in checks.blocks(params, "parameter")}
    assert settings["rds.force_ssl"] == "1"


# ---------------------------------------------------------------------------------------------
# Containers: commands, environment, secrets, hardening
# ---------------------------------------------------------------------------------------------


def _container(tf: Any, module: str) -> dict[str, Any]:
    return tf.module(module).local("container")


@pytest.mark.parametrize("daemon", ["coordinator", "signer", "verifier"])
def test_container_runs_countersign_daemon_serve(tf: Any, checks: Any, daemon: str) -> None:
    container = _container(tf, daemon)
    assert container["image"] == "${var.image}"
    assert container["entryPoint"] + container["command"] == ["countersign", daemon, "serve"]
    ports = {p["name"]: p["containerPort"] for p in container["portMappings"]}
    assert ports == {"grpc": f"${{var.ports.{daemon}}}", "metrics": f"${{var.ports.{daemon}_metrics}}"}
    task_def = next(iter(tf.module(daemon).resources_of("aws_ecs_task_definition").values()))
    assert Expr(checks.attr(task_def, "container_definitions")) == "${jsonencode([local.container])}"
    # The image's gRPC health probe (docker/healthcheck.py), which ECS runs in the container.
    assert container["healthCheck"]["command"] == [
        "CMD",
        "/opt/countersign/bin/python",
        "/usr/local/lib/countersign/healthcheck.py",
    ]
    # Hardening.
    assert container["readonlyRootFilesystem"] is True
    assert container["privileged"] is False
    assert container["user"] == "${var.container_uid}:${var.container_gid}"
    assert container["linuxParameters"]["capabilities"]["drop"] == ["ALL"]
    assert checks.attr(task_def, "task_role_arn") != checks.attr(task_def, "execution_role_arn")
    # TLS material comes from the service's own Secrets Manager secret, never from plain variables.
    assert tf.module(daemon).local("tls_secret_keys") == {
        "COUNTERSIGN_TLS_CERT_PEM": "cert",
        "COUNTERSIGN_TLS_KEY_PEM": "key",
        "COUNTERSIGN_TLS_CA_PEM": "ca",
    }
    secrets_expr = Expr(container["secrets"])
    assert "for env_name, json_key in local.tls_secret_keys" in secrets_expr
    assert "${aws_secretsmanager_secret.tls.arn}:${json_key}::" in secrets_expr
    env = checks.env_of(container, tf.module(daemon))
    for name in env:
        assert not re.search(r"PASSWORD|SECRET|TOKEN|_PEM$", name), f"{daemon}: {name} must be a secret"
    for value in env.values():
        assert not re.search(r"postgresql://[^@/]*:[^@/]*@", str(value)), f"{daemon}: password in a URL"


def test_signer_environment(tf: Any, checks: Any) -> None:
    signer = tf.module("signer")
    container = _container(tf, "signer")
    env = checks.env_of(container, signer)
    assert env["COUNTERSIGN_SIGNER_KEY"] == "awskms:${aws_kms_key.signer.arn}"
    assert env["COUNTERSIGN_DEPLOYER"] == "${var.deployer_id}"
    assert env["COUNTERSIGN_COORDINATOR"] == "${var.coordinator_address}"
    assert env["COUNTERSIGN_OPERATOR_PUBLIC_KEY"] == "${var.operator_public_key}"
    assert ref(checks.attr(tf.root.module_calls["signer"], "operator_public_key")) == "var.operator_public_key"
    # The parent's address travels in each AcceptDelegation request: no peer list.
    assert not any("PEER" in name for name in env)
    assert "peer_addresses" not in signer.variables
    # Every replica names the same shared state: the deployer's own table (or database).
    assert env["COUNTERSIGN_STATE_URL"] == "${local.state_url}"
    state_url = local_expr(signer, "state_url")
    assert '"dynamodb://${aws_dynamodb_table.state[0].name}?region=${var.region}"' in state_url
    assert (
        "postgresql://${local.postgres_name}@" in state_url and "/${local.postgres_name}?sslmode=require" in state_url
    )
    password = local_expr(signer, "password_secrets")
    assert "COUNTERSIGN_SIGNER_STATE_PASSWORD" in password
    assert "${aws_secretsmanager_secret.state_password[0].arn}:password::" in password
    # Each replica's registry copy is its own, in task storage (replicas must not share the file).
    assert env["COUNTERSIGN_REGISTRY_CACHE"] == "${local.registry_cache_dir}/registry.json"
    mounts = {m["sourceVolume"]: m["containerPath"] for m in container["mountPoints"]}
    assert mounts == {"tmp": "/tmp", "registry-cache": "${local.registry_cache_dir}"}
    task_def = signer.resource("aws_ecs_task_definition", "signer")
    volumes = checks.blocks(task_def, "volume")
    assert sorted(checks.attr(v, "name") for v in volumes) == ["registry-cache", "tmp"]
    assert all(set(v) == {"name"} for v in volumes), "task storage only, no shared file system"
    # The new settings, only when given.
    assert checks.optional_env_names(signer) == {"COUNTERSIGN_COMMIT_BATCH", "COUNTERSIGN_DECIDE_ATTEMPTS"}
    for setting in ("commit_batch", "decide_attempts"):
        assert ref(checks.attr(tf.root.module_calls["signer"], setting)) == f"each.value.{setting}"
    assert ref(checks.attr(tf.root.module_calls["signer"], "coordinator_address")) == "local.coordinator_address"
    assert (
        tf.root.local("coordinator_address")
        == "coordinator.${var.service_discovery_namespace}:${local.ports.coordinator}"
    )


def test_verifier_environment(tf: Any, checks: Any) -> None:
    verifier = tf.module("verifier")
    container = verifier.local("container")
    env = checks.env_of(container)
    assert env["COUNTERSIGN_STORE_URL"] == "${local.store_url}"
    assert env["COUNTERSIGN_COORDINATOR"] == "${var.coordinator_address}"
    assert env["COUNTERSIGN_REGISTRY_CACHE"] == "${local.registry_cache_dir}/registry.json"
    mounts = {m["sourceVolume"]: m["containerPath"] for m in container["mountPoints"]}
    assert mounts["registry-cache"] == "${local.registry_cache_dir}"
    store_url = local_expr(verifier, "store_url")
    assert '"dynamodb://${var.nonce_table_name}?region=${var.region}&collect=scan"' in store_url
    # collect=scan (and entry_count) scan the table: the task role may, on that table only.
    doc = verifier.data["aws_iam_policy_document"]["task_nonce_table"]
    scans = [st for st in checks.blocks(doc, "statement") if "dynamodb:Scan" in checks.attr(st, "actions", [])]
    assert len(scans) == 1 and checks.attr(scans[0], "resources") == ["${var.nonce_table_arn}"]
    assert "postgresql://${var.postgres.username}@" in store_url
    password = local_expr(verifier, "password_secrets")
    assert "COUNTERSIGN_STORE_PASSWORD" in password and ":password::" in password


def test_coordinator_holds_no_signing_permission_and_persists_its_log(tf: Any, checks: Any) -> None:
    coordinator = tf.module("coordinator")
    assert not coordinator.resources_of("aws_kms_key")
    for doc in coordinator.data["aws_iam_policy_document"].values():
        for st in checks.blocks(doc, "statement"):
            assert not any(a.startswith("kms:Sign") for a in checks.attr(st, "actions", [])), st
    env = checks.env_of(coordinator.local("container"), coordinator)
    assert env["COUNTERSIGN_LOG_STORE"] == "${local.log_store}"
    log_store = local_expr(coordinator, "log_store")
    assert '"dynamodb://${aws_dynamodb_table.registry[0].name}?region=${var.region}"' in log_store
    assert "postgresql://${var.postgres.username}@" in log_store and "schema=countersign_registry" in log_store
    assert "sqlite" not in log_store, "replicas on several hosts cannot share a SQLite file"
    password = local_expr(coordinator, "password_secrets")
    assert "COUNTERSIGN_LOG_STORE_PASSWORD" in password and ":password::" in password
    assert checks.optional_env_names(coordinator) == {"COUNTERSIGN_REFRESH_MS"}
    assert ref(checks.attr(tf.root.module_calls["coordinator"], "refresh_ms")) == "var.coordinator_refresh_ms"
    task_def = coordinator.resource("aws_ecs_task_definition", "coordinator")
    assert [checks.attr(v, "name") for v in checks.blocks(task_def, "volume")] == ["tmp"]
    assert "dynamic" not in task_def


def test_services_are_private_and_without_exec(tf: Any, checks: Any) -> None:
    services = [(m, n, b) for m, mod in tf.all_modules() for n, b in mod.resources_of("aws_ecs_service").items()]
    assert {m for m, _, _ in services} == {"coordinator", "signer", "verifier"}
    for m, n, body in services:
        assert checks.attr(body, "enable_execute_command") is False, (m, n)
        assert checks.attr(body, "launch_type") == "FARGATE", (m, n)
        (net,) = checks.blocks(body, "network_configuration")
        assert checks.attr(net, "assign_public_ip") is False, (m, n)


# ---------------------------------------------------------------------------------------------
# Variables, outputs, example
# ---------------------------------------------------------------------------------------------


def test_every_variable_has_description_and_type(tf: Any, checks: Any) -> None:
    total = 0
    for name, module in tf.all_modules():
        assert checks.variables_missing_descriptions(module) == [], name
        total += len(module.variables)
    assert total > 60


def test_root_variables_are_validated(tf: Any, checks: Any) -> None:
    must_validate = {
        "name_prefix", "environment", "region", "availability_zones", "vpc_cidr", "image", "deployers",
        "verifier_count", "consumer_cidr_blocks", "consumer_security_group_ids", "metrics_cidr_blocks",
        "metrics_security_group_ids", "operator_cidr_blocks", "operator_security_group_ids",
        "nonce_store_backend", "kms_admin_principal_arns", "log_retention_days",
    }  # fmt: skip
    validated = {name for name, body in tf.root.variables.items() if checks.blocks(body, "validation")}
    assert must_validate <= validated, must_validate - validated
    deployer_conditions = [
        checks.attr(v, "condition") for v in checks.blocks(tf.root.variables["deployers"], "validation")
    ]
    # The deployer id pattern of the design, verbatim (HCL escapes are not needed for it).
    assert any(DEPLOYER_ID_RE in c for c in deployer_conditions)


def test_root_outputs(tf: Any, checks: Any) -> None:
    required = {
        "verifier_nlb_dns_name": "module.verifier.nlb_dns_name",
        "coordinator_address": "local.coordinator_address",
        "nonce_table_name": "module.nonce_store.table_name",
    }
    for name, value in required.items():
        assert ref(checks.attr(tf.root.outputs[name], "value")) == value, name
    for name in ("signer_addresses", "signer_kms_key_arns", "verifier_endpoint", "tls_secret_arns"):
        assert name in tf.root.outputs
    for name, body in tf.root.outputs.items():
        assert str(checks.attr(body, "description", "")).strip(), name


@pytest.mark.parametrize("which", ["example_tfvars", "all_features_tfvars"])
def test_example_deployers(tf: Any, which: str) -> None:
    tfvars = getattr(tf, which)
    deployers = tfvars["deployers"]
    assert sorted(deployers) == ["deployer-a", "deployer-b", "deployer-c"]
    for deployer_id, d in deployers.items():
        assert "zone_index" not in d, "every signer spans the three zones"
        assert d.get("desired_count", 3) >= 3
        assert re.fullmatch(DEPLOYER_ID_RE, deployer_id)
        for child in d.get("allowed_children", []):
            assert child in deployers and child != deployer_id
    assert re.fullmatch(r"[0-9]{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/[^:@]+@sha256:[0-9a-f]{64}", tfvars["image"])


def test_checkov_skips_carry_reasons(checks: Any) -> None:
    skips = []
    for path in sorted(TF_DIR.rglob("*.tf")):
        for check_id, reason in checks.checkov_skips(path.read_text()):
            skips.append(check_id)
            assert re.fullmatch(r"CKV2?_AWS_\d+", check_id), f"{path}: {check_id}"
            assert len(reason) >= 40, f"{path}: skip of {check_id} needs a real reason"
    assert skips, "expected the documented skips"
    config = (TF_DIR / ".checkov.yaml").read_text()
    assert "skip-check" not in config and "soft-fail" not in config


# ---------------------------------------------------------------------------------------------
# The checkers fail on bad input
# ---------------------------------------------------------------------------------------------


def test_checker_flags_world_open_rules(checks: Any) -> None:
    bad = checks.parse_snippet(
        """
resource "aws_vpc_security_group_ingress_rule" "ssh" {
  security_group_id = "sg-1"
  cidr_ipv4         = "0.0.0.0/0"
  from_port         = 22
  to_port           = 22
  ip_protocol       = "tcp"
}
resource "aws_security_group" "legacy" {
  ingress {
    from_port        = 443
    to_port          = 443
    protocol         = "tcp"
    ipv6_cidr_blocks = ["::/0"]
  }
}
resource "aws_security_group_rule" "old" {
  type        = "ingress"
  cidr_blocks = ["10.0.0.0/8", "0.0.0.0/0"]
}
"""
    )
    found = checks.world_open_rules(bad)
    assert len(found) == 3, found
    assert checks.inline_sg_rules(bad) == ["aws_security_group.legacy.ingress"]


def test_checker_flags_a_key_policy_that_lets_an_admin_sign(checks: Any) -> None:
    bad = checks.parse_snippet(
        """
locals {
  policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid = "Admin", Effect = "Allow", Resource = "*", Action = "kms:*",
        Principal = { AWS = "arn:aws:iam::123456789012:root" }
      },
      {
        Sid = "Signer", Effect = "Allow", Resource = "*", Action = ["kms:Sign"],
        Principal = { AWS = "${aws_iam_role.signer.arn}" }
      },
    ]
  }
}
resource "aws_kms_key" "k" {
  policy = jsonencode(local.policy)
}
"""
    )
    statements = checks.key_policy_statements(bad, bad.resource("aws_kms_key", "k"))
    assert checks.principals_allowed(bad, statements, "kms:Sign") == [
        "arn:aws:iam::123456789012:root",
        "${aws_iam_role.signer.arn}",
    ]


def test_checker_flags_identity_policies_and_missing_descriptions(checks: Any) -> None:
    bad = checks.parse_snippet(
        """
data "aws_iam_policy_document" "p" {
  statement {
    sid       = "Oops"
    actions   = ["kms:S*"]
    resources = ["*"]
  }
}
variable "undocumented" {
  type = string
}
"""
    )
    assert checks.iam_documents_granting(bad, "kms:Sign") == ["data.aws_iam_policy_document.p:Oops"]
    assert checks.variables_missing_descriptions(bad) == ["undocumented"]
    assert checks.checkov_skips("#checkov:skip=CKV_AWS_1") == [("CKV_AWS_1", "")]


def test_checker_flags_stop_first_and_unspread_services(checks: Any) -> None:
    bad = checks.parse_snippet(
        """
variable "subnet_ids" {
  type = list(string)
}
variable "desired_count" {
  type = number
  validation {
    condition     = var.desired_count >= 1
    error_message = "x"
  }
}
resource "aws_ecs_service" "stop_first" {
  desired_count                      = 1
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100
  network_configuration {
    subnets = [var.subnet_id]
  }
}
resource "aws_ecs_service" "half" {
  desired_count                      = var.desired_count
  availability_zone_rebalancing      = "ENABLED"
  deployment_minimum_healthy_percent = 50
  deployment_maximum_percent         = 200
  deployment_circuit_breaker {
    enable   = true
    rollback = false
  }
  network_configuration {
    subnets = var.subnet_ids
  }
}
"""
    )
    stop_first = bad.resource("aws_ecs_service", "stop_first")
    assert len(checks.rolling_deployment_problems(stop_first)) == 3
    assert len(checks.spread_problems(bad, stop_first, 3)) == 3
    half = bad.resource("aws_ecs_service", "half")
    assert checks.rolling_deployment_problems(half) == [
        "deployment_minimum_healthy_percent is 50, not 100",
        "no deployment circuit breaker with rollback",
    ]
    assert checks.spread_problems(bad, half, 3) == [
        "var.subnet_ids is not validated to hold exactly three subnets",
        "var.desired_count is not validated to be at least 3",
    ]


def test_checker_flags_a_role_that_reaches_other_tables_and_a_weak_table(checks: Any) -> None:
    bad = checks.parse_snippet(
        """
data "aws_iam_policy_document" "p" {
  statement {
    sid       = "Mine"
    actions   = ["dynamodb:GetItem"]
    resources = [aws_dynamodb_table.state[0].arn]
  }
  statement {
    sid       = "EveryTable"
    actions   = ["dynamodb:PutItem"]
    resources = ["arn:aws:dynamodb:eu-west-1:123456789012:table/countersign-prod-signer-*"]
  }
  statement {
    sid       = "Wildcard"
    actions   = ["dynamodb:*"]
    resources = [aws_dynamodb_table.state[0].arn]
  }
  statement {
    sid       = "Index"
    actions   = ["dynamodb:Query"]
    resources = [aws_dynamodb_table.state[0].arn, "${aws_dynamodb_table.state[0].arn}/index/*"]
  }
}
resource "aws_dynamodb_table" "weak" {
  billing_mode = "PROVISIONED"
  hash_key     = "id"
  attribute {
    name = "id"
    type = "S"
  }
  server_side_encryption {
    enabled = true
  }
}
"""
    )
    flagged = checks.dynamodb_grants_beyond(bad, "${aws_dynamodb_table.state[0].arn}")
    assert [f.split(":")[0] for f in flagged] == ["p"] * 3
    assert [f.split(":")[1] for f in flagged] == ["EveryTable", "Wildcard", "Index"]
    problems = checks.table_shape_problems(bad.resource("aws_dynamodb_table", "weak"), ttl=True)
    assert len(problems) == 6, problems


def test_checker_derives_iam_actions_from_store_calls(checks: Any) -> None:
    source = """
self._client.batch_get_item(RequestItems=request)
self._client.transact_write_items(TransactItems=[
    {"ConditionCheck": {"TableName": t}}, {"Put": {"TableName": t}},
])
client.describe_table(TableName=table)
"""
    assert checks.dynamodb_actions_called(source) == {
        "dynamodb:BatchGetItem",
        "dynamodb:ConditionCheckItem",
        "dynamodb:PutItem",
        "dynamodb:DescribeTable",
    }
