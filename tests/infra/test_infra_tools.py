"""The external tools over infra/terraform: terraform fmt; Terraform's own evaluation of the
variable validations and of the locals that decide the signer-to-signer paths (offline: a
configuration made only of variables and locals needs no provider); checkov with zero failed
checks; and, where an AWS provider is installed locally, `terraform validate` and `terraform test`
(infra/terraform/tests, a mocked provider: no account, no credentials) of the whole configuration."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA_DIR = REPO_ROOT / "infra"
TF_DIR = INFRA_DIR / "terraform"
EXAMPLE_TFVARS = TF_DIR / "terraform.tfvars.example"
ALL_FEATURES_TFVARS = INFRA_DIR / "checkov-all-features.tfvars"
CHECKOV_CONFIG = TF_DIR / ".checkov.yaml"


def _tf_env() -> dict[str, str]:
    env = dict(os.environ)
    # No update check against the network, no prompts, no colour codes.
    env.update({"CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1", "TF_INPUT": "0", "NO_COLOR": "1"})
    return env


def _run(cmd: list[str], cwd: Path = REPO_ROOT, timeout: int = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


# ---------------------------------------------------------------------------------------------
# terraform fmt
# ---------------------------------------------------------------------------------------------


def test_terraform_fmt_check(terraform_bin: str) -> None:
    result = _run([terraform_bin, "fmt", "-check", "-recursive", "-diff", str(TF_DIR)], env=_tf_env())
    assert result.returncode == 0, f"terraform fmt would change:\n{result.stdout}\n{result.stderr}"
    result = _run([terraform_bin, "fmt", "-check", "-diff", str(ALL_FEATURES_TFVARS)], env=_tf_env())
    assert result.returncode == 0, result.stdout + result.stderr
    # fmt does not look at *.tfvars.example: format it through stdin and compare.
    text = EXAMPLE_TFVARS.read_text()
    result = _run([terraform_bin, "fmt", "-"], env=_tf_env(), input=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout == text, "terraform.tfvars.example is not in terraform fmt style"


# ---------------------------------------------------------------------------------------------
# Terraform evaluates the root variable validations (no provider needed)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def variables_only(terraform_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("tf-variables")
    shutil.copy(TF_DIR / "variables.tf", workdir / "variables.tf")
    result = _run([terraform_bin, "init", "-backend=false", "-input=false", "-no-color"], cwd=workdir, env=_tf_env())
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir


def _plan(
    terraform_bin: str, workdir: Path, *var_files: Path, overrides: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    args = [terraform_bin, "plan", "-input=false", "-no-color", "-lock=false", "-refresh=false"]
    for f in var_files:
        args.append(f"-var-file={f}")
    if overrides is not None:
        override_file = workdir / "override.tfvars.json"
        override_file.write_text(json.dumps(overrides))
        args.append(f"-var-file={override_file}")
    return _run(args, cwd=workdir, env=_tf_env())


@pytest.mark.parametrize("tfvars", [EXAMPLE_TFVARS, ALL_FEATURES_TFVARS], ids=["example", "all-features"])
def test_shipped_tfvars_pass_the_validations(terraform_bin: str, variables_only: Path, tfvars: Path) -> None:
    copied = variables_only / (
        tfvars.name.removesuffix(".example") if tfvars.name.endswith(".example") else tfvars.name
    )
    shutil.copy(tfvars, copied)
    result = _plan(terraform_bin, variables_only, copied)
    assert result.returncode == 0, result.stdout + result.stderr


BAD_INPUTS = {
    "world-consumers": ({"consumer_cidr_blocks": ["0.0.0.0/0"]}, "consumer_cidr_blocks must be IPv4"),
    "split-world-consumers": (
        {"consumer_cidr_blocks": ["0.0.0.0/1", "128.0.0.0/1"]},
        "consumer_cidr_blocks must be IPv4",
    ),
    "world-operators": ({"operator_cidr_blocks": ["0.0.0.0/0"]}, "operator_cidr_blocks must be IPv4"),
    "ipv6-world-metrics": ({"metrics_cidr_blocks": ["::/0"]}, "metrics_cidr_blocks must be IPv4"),
    "host-bits-metrics": ({"metrics_cidr_blocks": ["10.60.0.1/24"]}, "metrics_cidr_blocks must be IPv4"),
    "world-runtime": (
        {"deployers": {"deployer-a": {"runtime_cidr_blocks": ["0.0.0.0/0"]}}},
        "runtime_cidr_blocks must be IPv4",
    ),
    "two-zones": ({"availability_zones": ["eu-west-1a", "eu-west-1b"]}, "exactly three distinct"),
    "repeated-zone": ({"availability_zones": ["eu-west-1a", "eu-west-1a", "eu-west-1b"]}, "exactly three distinct"),
    "zone-of-other-region": (
        {"availability_zones": ["us-east-1a", "eu-west-1b", "eu-west-1c"]},
        "must belong to var.region",
    ),
    "bad-deployer-id": ({"deployers": {"Deployer_A": {}}}, "must match ^[a-z0-9][a-z0-9._-]{0,62}$"),
    "deployer-id-too-long": ({"deployers": {"a" * 64: {}}}, "must match ^[a-z0-9][a-z0-9._-]{0,62}$"),
    "signer-in-one-zone": ({"deployers": {"deployer-a": {"zone_index": 0}}}, "zone_index is no longer used"),
    "two-signer-replicas": (
        {"deployers": {"deployer-a": {"desired_count": 2}}},
        "desired_count must be an integer from 3 to 60",
    ),
    "fractional-signer-replicas": (
        {"deployers": {"deployer-a": {"desired_count": 3.5}}},
        "desired_count must be an integer from 3 to 60",
    ),
    "commit-batch-0": ({"deployers": {"deployer-a": {"commit_batch": 0}}}, "commit_batch must be an integer from 1"),
    "decide-attempts-101": (
        {"deployers": {"deployer-a": {"decide_attempts": 101}}},
        "decide_attempts must be an integer from 1 to 100",
    ),
    "unknown-child": (
        {"deployers": {"deployer-a": {"allowed_children": ["deployer-z"]}}},
        "allowed_children may only name other deployers",
    ),
    "prefixed-operator-key": (
        {"operator_public_key": "ed25519:" + "A" * 43},
        "43-character unpadded base64url Ed25519 public key",
    ),
    "non-canonical-operator-key": (
        {"operator_public_key": "A" * 42 + "B"},
        "43-character unpadded base64url Ed25519 public key",
    ),
    "latest-image": (
        {"image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/countersign:latest"},
        "must not use the mutable 'latest' tag",
    ),
    "image-elsewhere": ({"image": "docker.io/library/countersign:1.0"}, "image must be an ECR image URI"),
    "postgres-store-without-postgres": ({"nonce_store_backend": "postgresql"}, "needs enable_postgres = true"),
    "postgres-registry-without-postgres": (
        {"registry_store_backend": "postgresql"},
        "registry_store_backend = 'postgresql' needs enable_postgres = true",
    ),
    "postgres-signer-state-without-postgres": (
        {"signer_state_backend": "postgresql"},
        "signer_state_backend = 'postgresql' needs enable_postgres = true",
    ),
    "efs-registry": ({"registry_store_backend": "efs"}, "registry_store_backend must be 'dynamodb' or 'postgresql'"),
    "two-verifiers": ({"verifier_count": 2}, "verifier_count must be an integer from 3"),
    "one-coordinator": ({"coordinator_count": 1}, "coordinator_count must be an integer from 2 to 10"),
    "refresh-5ms": ({"coordinator_refresh_ms": 5}, "coordinator_refresh_ms must be an integer from 10"),
    "short-log-retention": ({"log_retention_days": 30}, "at least 365 days"),
}


@pytest.mark.parametrize("overrides, message", list(BAD_INPUTS.values()), ids=list(BAD_INPUTS))
def test_validations_reject_bad_inputs(
    terraform_bin: str, variables_only: Path, overrides: dict[str, Any], message: str
) -> None:
    example = variables_only / "example.tfvars"
    shutil.copy(EXAMPLE_TFVARS, example)
    result = _plan(terraform_bin, variables_only, example, overrides=overrides)
    output = " ".join((result.stdout + result.stderr).split())
    assert result.returncode != 0, f"Terraform accepted {overrides}"
    assert "Invalid value for variable" in output
    assert message in output, output[-2000:]


# ---------------------------------------------------------------------------------------------
# checkov
# ---------------------------------------------------------------------------------------------


def _checkov(checkov_bin: Path, directory: Path, *extra: str) -> dict[str, Any]:
    result = _run(
        [
            str(checkov_bin),
            "--directory",
            str(directory),
            "--config-file",
            str(CHECKOV_CONFIG),
            "--output",
            "json",
            *extra,
        ],
        timeout=600,
    )
    assert result.stdout.strip(), f"checkov printed nothing (exit {result.returncode}):\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    if isinstance(report, list):  # one entry per framework
        (report,) = [r for r in report if r.get("check_type") == "terraform"]
    return report


@pytest.mark.parametrize("var_file", [None, ALL_FEATURES_TFVARS], ids=["defaults", "all-features"])
def test_checkov_has_zero_failed_checks(checkov_bin: Path, var_file: Path | None) -> None:
    extra = ["--var-file", str(var_file)] if var_file else []
    report = _checkov(checkov_bin, TF_DIR, *extra)
    summary = report["summary"]
    failed = [(c["check_id"], c["resource"], c["file_path"]) for c in report["results"]["failed_checks"]]
    assert summary["failed"] == 0 and failed == [], failed
    assert summary["parsing_errors"] == 0
    assert summary["passed"] >= 350, summary  # it really scanned the modules
    for skipped in report["results"]["skipped_checks"]:
        reason = (skipped.get("check_result") or {}).get("suppress_comment", "")
        assert len(reason.strip()) >= 40, f"{skipped['check_id']} on {skipped['resource']} is skipped without a reason"


def test_checkov_fails_a_world_open_security_group(checkov_bin: Path, tmp_path: Path) -> None:
    (tmp_path / "main.tf").write_text(
        """
resource "aws_security_group" "open" {
  name        = "open"
  description = "deliberately bad"
  vpc_id      = "vpc-12345678"

  ingress {
    description = "ssh from anywhere"
    from_port   = 22
    to_port     = 22
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
}
"""
    )
    report = _checkov(checkov_bin, tmp_path)
    failed_ids = {c["check_id"] for c in report["results"]["failed_checks"]}
    assert "CKV_AWS_24" in failed_ids, failed_ids


# ---------------------------------------------------------------------------------------------
# Terraform evaluates the locals that decide who may talk to whom (no provider needed: the few
# references to data sources and security group IDs are replaced by stand-in strings)
# ---------------------------------------------------------------------------------------------


def _blocks_named(text: str, header: str) -> list[str]:
    """Top-level blocks starting with `header` (e.g. 'locals {'), by brace matching."""
    found = []
    start = text.find(header)
    while start != -1:
        depth, i = 0, start
        while True:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        found.append(text[start : i + 1])
        start = text.find(header, i)
    return found


def _evaluate(terraform_bin: str, workdir: Path, files: dict[str, str], tfvars: dict[str, Any]) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    for name, text in files.items():
        (workdir / name).write_text(text)
    (workdir / "inputs.tfvars.json").write_text(json.dumps(tfvars))
    env = _tf_env()
    for cmd in (
        [terraform_bin, "init", "-backend=false", "-input=false", "-no-color"],
        [
            terraform_bin,
            "plan",
            "-input=false",
            "-no-color",
            "-lock=false",
            "-var-file=inputs.tfvars.json",
            "-out=plan",
        ],
    ):
        result = _run(cmd, cwd=workdir, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
    shown = _run([terraform_bin, "show", "-json", "plan"], cwd=workdir, env=env)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)["planned_values"]["outputs"]["evaluated"]["value"]


def _root_locals(terraform_bin: str, workdir: Path, tfvars: dict[str, Any]) -> dict[str, Any]:
    main = (TF_DIR / "main.tf").read_text()
    (locals_block,) = _blocks_named(main, "locals {")
    locals_block = locals_block.replace("data.aws_partition.current.partition", '"aws"')
    locals_block = locals_block.replace("data.aws_caller_identity.current.account_id", '"123456789012"')
    output = """
output "evaluated" {
  value = {
    kms_admin_arns = local.kms_admin_arns, signer_addresses = local.signer_addresses,
    delegation_edges = local.delegation_edges,
    ecr_repository_arn = local.ecr_repository_arn, coordinator_address = local.coordinator_address,
  }
}
"""
    files = {"variables.tf": (TF_DIR / "variables.tf").read_text(), "locals.tf": locals_block + output}
    return _evaluate(terraform_bin, workdir, files, tfvars)


def _security_locals(terraform_bin: str, workdir: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    security = TF_DIR / "modules" / "security"
    blocks = "\n".join(_blocks_named((security / "main.tf").read_text(), "locals {"))
    blocks = re.sub(r"aws_security_group\.(\w+)\[(\w+)\]\.id", r'"sg-\1-${\2}"', blocks)
    blocks = re.sub(r"aws_security_group\.(\w+)\.id", r'"sg-\1"', blocks)
    output = """
output "evaluated" {
  value = {
    signer_flows = local.signer_flows, signer_runtime_cidrs = keys(local.signer_runtime_cidrs),
    signer_runtime_sgs = keys(local.signer_runtime_sgs), metrics_from_cidrs = keys(local.metrics_from_cidrs),
    metrics_from_sgs = keys(local.metrics_from_sgs), metrics_targets = local.metrics_targets,
  }
}
"""
    files = {"variables.tf": (security / "variables.tf").read_text(), "locals.tf": blocks + output}
    return _evaluate(terraform_bin, workdir, files, inputs)


def _security_inputs(deployers: dict[str, Any], edges: list[dict[str, str]], metrics: list[str]) -> dict[str, Any]:
    ports = {"coordinator": 7400, "signer": 7401, "verifier": 7402}
    ports |= {f"{k}_metrics": v + 2000 for k, v in ports.items()}
    return {
        "name": "countersign-test",
        "vpc_id": "vpc-1",
        "ports": ports,
        "deployers": {
            k: {
                "runtime_cidr_blocks": v.get("runtime_cidr_blocks", []),
                "runtime_security_group_ids": v.get("runtime_security_group_ids", []),
            }
            for k, v in deployers.items()
        },
        "delegation_edges": edges,
        "metrics_cidr_blocks": metrics,
        "endpoint_security_group_id": "sg-endpoints",
        "s3_prefix_list_id": "pl-s3",
        "dynamodb_prefix_list_id": "pl-ddb",
        "postgres_enabled": False,
        "registry_store_backend": "dynamodb",
        "nonce_store_backend": "dynamodb",
        "signer_state_backend": "dynamodb",
    }


def test_signer_paths_follow_the_declared_delegation_edges(terraform_bin: str, tmp_path: Path) -> None:
    tfvars = {
        "environment": "test",
        "region": "eu-west-1",
        "availability_zones": ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
        "image": "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/countersign:1.2.3",
        "operator_public_key": "A" * 43,
        "deployers": {
            "planner": {"allowed_children": ["researcher"], "runtime_cidr_blocks": ["10.1.0.0/24"]},
            "researcher": {"runtime_security_group_ids": ["sg-0123456789abcdef0"]},
            "writer.v2": {},
        },
    }
    root = _root_locals(terraform_bin, tmp_path / "root", tfvars)
    assert root["delegation_edges"] == [{"parent": "planner", "child": "researcher"}]
    assert root["signer_addresses"]["writer.v2"] == "writer-v2.countersign.internal:7401"
    assert root["coordinator_address"] == "coordinator.countersign.internal:7400"
    assert root["kms_admin_arns"] == ["arn:aws:iam::123456789012:root"]
    assert root["ecr_repository_arn"] == "arn:aws:ecr:eu-west-1:123456789012:repository/team/countersign"

    inputs = _security_inputs(tfvars["deployers"], root["delegation_edges"], ["10.9.0.0/24"])
    security = _security_locals(terraform_bin, tmp_path / "security", inputs)
    # Only the declared pair may talk on 7401, in both directions; writer.v2 talks to no signer.
    assert security["signer_flows"] == {
        "planner->researcher": {"from": "planner", "to": "researcher"},
        "researcher->planner": {"from": "researcher", "to": "planner"},
    }
    assert security["signer_runtime_cidrs"] == ["planner|10.1.0.0/24"]
    assert security["signer_runtime_sgs"] == ["researcher|sg-0123456789abcdef0"]
    assert sorted(security["metrics_from_cidrs"]) == sorted(
        f"{t}|10.9.0.0/24"
        for t in ("coordinator", "verifier", "signer:planner", "signer:researcher", "signer:writer.v2")
    )
    assert security["metrics_targets"]["signer:planner"] == {"security_group_id": "sg-signer-planner", "port": 9401}
    assert security["metrics_targets"]["coordinator"]["port"] == 9400
    assert security["metrics_targets"]["verifier"]["port"] == 9402


def test_example_delegation_edges(terraform_bin: str, hcl2: Any, tmp_path: Path) -> None:
    with EXAMPLE_TFVARS.open() as fh:
        example = {k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in hcl2.load(fh).items()}
    root = _root_locals(terraform_bin, tmp_path / "root", example)
    pairs = {(e["parent"], e["child"]) for e in root["delegation_edges"]}
    assert pairs == {("deployer-a", "deployer-b"), ("deployer-a", "deployer-c"), ("deployer-b", "deployer-c")}
    inputs = _security_inputs(example["deployers"], root["delegation_edges"], example["metrics_cidr_blocks"])
    security = _security_locals(terraform_bin, tmp_path / "security", inputs)
    assert set(security["signer_flows"]) == {f"{a}->{b}" for a, b in pairs} | {f"{b}->{a}" for a, b in pairs}


# ---------------------------------------------------------------------------------------------
# The whole configuration against a locally installed AWS provider: `terraform validate` and
# `terraform test` with a mocked provider (infra/terraform/tests/*.tftest.hcl). The registry is out
# of reach here, so the provider comes from a local plugin directory (INFRA_TF_PLUGIN_DIR, default
# /opt/tf-plugins), whatever version it holds; the copy under test accepts that version, and a
# provider older than 6 (which predates ECC_NIST_EDWARDS25519) gets ECC_NIST_P256 as the signing
# keys' spec, the only change. With registry access run `terraform test` in infra/terraform itself.
# ---------------------------------------------------------------------------------------------

PLUGIN_DIR = Path(os.environ.get("INFRA_TF_PLUGIN_DIR", "/opt/tf-plugins"))


def _local_aws_provider() -> tuple[int, ...] | None:
    found = sorted(
        tuple(int(x) for x in p.parent.parent.name.split("."))
        for p in PLUGIN_DIR.glob("registry.terraform.io/hashicorp/aws/*/linux_*/terraform-provider-aws*")
        if re.fullmatch(r"\d+\.\d+\.\d+", p.parent.parent.name)
    )
    return found[-1] if found else None


@pytest.fixture(scope="module")
def with_provider(terraform_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    version = _local_aws_provider()
    if version is None:
        pytest.skip(f"no hashicorp/aws provider under {PLUGIN_DIR}: run `terraform test` in infra/terraform elsewhere")
    workdir = tmp_path_factory.mktemp("tf-provider") / "terraform"
    shutil.copytree(TF_DIR, workdir, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl"))
    for versions in workdir.rglob("versions.tf"):
        text = re.sub(r'(\n\s*version\s*=\s*)"[^"]*"', r'\1">= 5.0.0, < 7.0.0"', versions.read_text())
        versions.write_text(text)
    if version < (6,):
        signer = workdir / "modules" / "signer" / "main.tf"
        text = signer.read_text()
        assert text.count('"ECC_NIST_EDWARDS25519"') == 1
        signer.write_text(text.replace('"ECC_NIST_EDWARDS25519"', '"ECC_NIST_P256"'))
    result = _run(
        [terraform_bin, "init", "-backend=false", "-input=false", "-no-color", f"-plugin-dir={PLUGIN_DIR}"],
        cwd=workdir,
        env=_tf_env(),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return workdir


def test_terraform_validate_with_a_local_provider(terraform_bin: str, with_provider: Path) -> None:
    result = _run([terraform_bin, "validate", "-no-color"], cwd=with_provider, env=_tf_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "The configuration is valid" in result.stdout


@pytest.mark.parametrize("tfvars", [EXAMPLE_TFVARS, ALL_FEATURES_TFVARS], ids=["example", "all-features"])
def test_terraform_test_with_a_mocked_provider(terraform_bin: str, with_provider: Path, tfvars: Path) -> None:
    """Terraform evaluates the whole configuration with these inputs and applies it to a mocked AWS:
    each deployer's own state store and address, three replicas over three subnets rolled start-first,
    the task role's table statements naming its own table only (infra/terraform/tests)."""
    inputs = with_provider / f"inputs-{tfvars.name.replace('.', '-')}.tfvars"
    shutil.copy(tfvars, inputs)
    result = _run(
        [terraform_bin, "test", "-no-color", f"-var-file={inputs.name}"], cwd=with_provider, env=_tf_env(), timeout=600
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"Success! (\d+) passed, 0 failed", output), output[-2000:]
    assert int(re.search(r"Success! (\d+) passed", output).group(1)) >= 2
