# Every network path of the design, and nothing else. Ingress comes only from other security
# groups of this deployment or from CIDR lists that the root module validates (never 0.0.0.0/0
# or ::/0). Egress goes only to other security groups, the VPC endpoints and the S3/DynamoDB
# gateway prefix lists. A security group created by Terraform starts with no egress rule.
#
#   consumers            -> NLB                 7402  (consumer_cidr_blocks / consumer_security_group_ids)
#   NLB                  -> verifiers           7402  (traffic and health checks)
#   verifiers            -> coordinator         7400
#   signers              -> coordinator         7400
#   operator tooling     -> coordinator         7400  (operator_cidr_blocks / _security_group_ids; empty by default)
#   signer               <-> signer             7401  (only the deployer pairs of a declared delegation edge)
#   agent runtime        -> its deployer signer 7401  (per deployer runtime_cidr_blocks / _security_group_ids)
#   Prometheus           -> 9400 / 9401 / 9402        (metrics_cidr_blocks / metrics_security_group_ids)
#   coordinators, verifiers, signers -> DynamoDB prefix list 443, or PostgreSQL 5432 (each for the
#                           stores that are there: registry log, nonce store, signer state)
#   all tasks            -> VPC endpoints 443, S3 prefix list 443 (ECR image layers)

locals {
  registry_on_postgres  = var.registry_store_backend == "postgresql"
  verifiers_on_postgres = var.nonce_store_backend == "postgresql"
  signers_on_postgres   = var.signer_state_backend == "postgresql"

  # Both directions of every declared delegation edge: the child asks its parent to co-sign an
  # edge manifest, and the parent answers or reaches the child about a grant.
  signer_flows = {
    for f in distinct(flatten([
      for e in var.delegation_edges : [
        { from = e.child, to = e.parent },
        { from = e.parent, to = e.child },
      ]
    ])) : "${f.from}->${f.to}" => f
  }

  signer_runtime_cidrs = merge([
    for id, d in var.deployers : { for c in d.runtime_cidr_blocks : "${id}|${c}" => { deployer = id, cidr = c } }
  ]...)

  signer_runtime_sgs = merge([
    for id, d in var.deployers : { for g in d.runtime_security_group_ids : "${id}|${g}" => { deployer = id, sg = g } }
  ]...)

  # Metrics: coordinator 9400, every signer 9401, verifiers 9402.
  metrics_targets = merge(
    {
      coordinator = { security_group_id = aws_security_group.coordinator.id, port = var.ports.coordinator_metrics }
      verifier    = { security_group_id = aws_security_group.verifier.id, port = var.ports.verifier_metrics }
    },
    { for id in keys(var.deployers) : "signer:${id}" => { security_group_id = aws_security_group.signer[id].id, port = var.ports.signer_metrics } },
  )
  metrics_target_names = concat(["coordinator", "verifier"], [for id in keys(var.deployers) : "signer:${id}"])

  metrics_from_cidrs = {
    for p in setproduct(local.metrics_target_names, var.metrics_cidr_blocks) : "${p[0]}|${p[1]}" => { target = p[0], cidr = p[1] }
  }
  metrics_from_sgs = {
    for p in setproduct(local.metrics_target_names, var.metrics_security_group_ids) : "${p[0]}|${p[1]}" => { target = p[0], sg = p[1] }
  }
}

# ---------------------------------------------------------------------------------------------
# Security groups
# ---------------------------------------------------------------------------------------------

resource "aws_security_group" "nlb" {
  #checkov:skip=CKV2_AWS_5:Attached to the internal NLB (modules/verifier, aws_lb.verifier); all security groups live in this module so every path is declared in one place, and checkov's graph does not follow a module output into another module. tests/infra checks the attachment.
  name        = "${var.name}-verifier-nlb"
  description = "Internal NLB in front of the verifiers: gRPC 7402 from consumers"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-verifier-nlb" }
}

resource "aws_security_group" "verifier" {
  #checkov:skip=CKV2_AWS_5:Attached to the verifier ECS service (modules/verifier, aws_ecs_service.verifier); all security groups live in this module so every path is declared in one place, and checkov's graph does not follow a module output into another module. tests/infra checks the attachment.
  name        = "${var.name}-verifier"
  description = "Verifier replicas: gRPC from the NLB, metrics from Prometheus"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-verifier" }
}

resource "aws_security_group" "coordinator" {
  #checkov:skip=CKV2_AWS_5:Attached to the coordinator ECS service (modules/coordinator, aws_ecs_service.coordinator); all security groups live in this module so every path is declared in one place, and checkov's graph does not follow a module output into another module. tests/infra checks the attachment.
  name        = "${var.name}-coordinator"
  description = "Coordinator: registry gRPC from verifiers and signers, metrics from Prometheus"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-coordinator" }
}

resource "aws_security_group" "signer" {
  #checkov:skip=CKV2_AWS_5:Attached to each deployer's signer ECS service (modules/signer, aws_ecs_service.signer); all security groups live in this module so every path is declared in one place, and checkov's graph does not follow a module output into another module. tests/infra checks the attachment.
  for_each = var.deployers

  name        = "${var.name}-signer-${each.key}"
  description = "Signer of deployer ${each.key}: gRPC from its runtime and delegation peers"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-signer-${each.key}", Deployer = each.key }
}

resource "aws_security_group" "postgres" {
  #checkov:skip=CKV2_AWS_5:Attached to the RDS instance (modules/postgres, aws_db_instance.this); all security groups live in this module so every path is declared in one place, and checkov's graph does not follow a module output into another module. tests/infra checks the attachment.
  count = var.postgres_enabled ? 1 : 0

  name        = "${var.name}-postgres"
  description = "PostgreSQL: 5432 from the services whose store is there (coordinators, verifiers, signers)"
  vpc_id      = var.vpc_id

  tags = { Name = "${var.name}-postgres" }
}

# ---------------------------------------------------------------------------------------------
# Consumers -> NLB -> verifiers
# ---------------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "nlb_from_consumer_cidrs" {
  for_each = toset(var.consumer_cidr_blocks)

  security_group_id = aws_security_group.nlb.id
  description       = "VerifyPath gRPC from consumer network ${each.value}"
  ip_protocol       = "tcp"
  from_port         = var.ports.verifier
  to_port           = var.ports.verifier
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "nlb_from_consumer_sgs" {
  for_each = toset(var.consumer_security_group_ids)

  security_group_id            = aws_security_group.nlb.id
  description                  = "VerifyPath gRPC from consumer security group"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.verifier
  to_port                      = var.ports.verifier
  referenced_security_group_id = each.value
}

resource "aws_vpc_security_group_egress_rule" "nlb_to_verifier" {
  security_group_id            = aws_security_group.nlb.id
  description                  = "Forward gRPC and health checks to the verifiers"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.verifier
  to_port                      = var.ports.verifier
  referenced_security_group_id = aws_security_group.verifier.id
}

resource "aws_vpc_security_group_ingress_rule" "verifier_from_nlb" {
  security_group_id            = aws_security_group.verifier.id
  description                  = "gRPC and health checks from the internal NLB"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.verifier
  to_port                      = var.ports.verifier
  referenced_security_group_id = aws_security_group.nlb.id
}

# ---------------------------------------------------------------------------------------------
# Verifiers and signers -> coordinator
# ---------------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_verifier" {
  security_group_id            = aws_security_group.coordinator.id
  description                  = "Registry fetch and watch from the verifiers"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.coordinator
  to_port                      = var.ports.coordinator
  referenced_security_group_id = aws_security_group.verifier.id
}

resource "aws_vpc_security_group_egress_rule" "verifier_to_coordinator" {
  security_group_id            = aws_security_group.verifier.id
  description                  = "Registry fetch and watch on the coordinator"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.coordinator
  to_port                      = var.ports.coordinator
  referenced_security_group_id = aws_security_group.coordinator.id
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_signer" {
  for_each = var.deployers

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Registry gRPC from the signer of deployer ${each.key}"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.coordinator
  to_port                      = var.ports.coordinator
  referenced_security_group_id = aws_security_group.signer[each.key].id
}

resource "aws_vpc_security_group_egress_rule" "signer_to_coordinator" {
  for_each = var.deployers

  security_group_id            = aws_security_group.signer[each.key].id
  description                  = "Registry gRPC on the coordinator"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.coordinator
  to_port                      = var.ports.coordinator
  referenced_security_group_id = aws_security_group.coordinator.id
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_operator_cidrs" {
  for_each = toset(var.operator_cidr_blocks)

  security_group_id = aws_security_group.coordinator.id
  description       = "Operator-signed registry statements from operator network ${each.value}"
  ip_protocol       = "tcp"
  from_port         = var.ports.coordinator
  to_port           = var.ports.coordinator
  cidr_ipv4         = each.value
}

resource "aws_vpc_security_group_ingress_rule" "coordinator_from_operator_sgs" {
  for_each = toset(var.operator_security_group_ids)

  security_group_id            = aws_security_group.coordinator.id
  description                  = "Operator-signed registry statements from the operator's security group"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.coordinator
  to_port                      = var.ports.coordinator
  referenced_security_group_id = each.value
}

# ---------------------------------------------------------------------------------------------
# Signer <-> signer (co-signing of cross-deployer edges), agent runtime -> own signer
# ---------------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "signer_from_peer" {
  for_each = local.signer_flows

  security_group_id            = aws_security_group.signer[each.value.to].id
  description                  = "Co-signing gRPC from the signer of ${each.value.from}"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.signer
  to_port                      = var.ports.signer
  referenced_security_group_id = aws_security_group.signer[each.value.from].id
}

resource "aws_vpc_security_group_egress_rule" "signer_to_peer" {
  for_each = local.signer_flows

  security_group_id            = aws_security_group.signer[each.value.from].id
  description                  = "Co-signing gRPC to the signer of ${each.value.to}"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.signer
  to_port                      = var.ports.signer
  referenced_security_group_id = aws_security_group.signer[each.value.to].id
}

resource "aws_vpc_security_group_ingress_rule" "signer_from_runtime_cidrs" {
  for_each = local.signer_runtime_cidrs

  security_group_id = aws_security_group.signer[each.value.deployer].id
  description       = "Signing requests from the agent runtime of ${each.value.deployer}"
  ip_protocol       = "tcp"
  from_port         = var.ports.signer
  to_port           = var.ports.signer
  cidr_ipv4         = each.value.cidr
}

resource "aws_vpc_security_group_ingress_rule" "signer_from_runtime_sgs" {
  for_each = local.signer_runtime_sgs

  security_group_id            = aws_security_group.signer[each.value.deployer].id
  description                  = "Signing requests from the agent runtime of ${each.value.deployer}"
  ip_protocol                  = "tcp"
  from_port                    = var.ports.signer
  to_port                      = var.ports.signer
  referenced_security_group_id = each.value.sg
}

# ---------------------------------------------------------------------------------------------
# Prometheus -> metrics ports
# ---------------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "metrics_from_cidrs" {
  for_each = local.metrics_from_cidrs

  security_group_id = local.metrics_targets[each.value.target].security_group_id
  description       = "Prometheus scrape of ${each.value.target}"
  ip_protocol       = "tcp"
  from_port         = local.metrics_targets[each.value.target].port
  to_port           = local.metrics_targets[each.value.target].port
  cidr_ipv4         = each.value.cidr
}

resource "aws_vpc_security_group_ingress_rule" "metrics_from_sgs" {
  for_each = local.metrics_from_sgs

  security_group_id            = local.metrics_targets[each.value.target].security_group_id
  description                  = "Prometheus scrape of ${each.value.target}"
  ip_protocol                  = "tcp"
  from_port                    = local.metrics_targets[each.value.target].port
  to_port                      = local.metrics_targets[each.value.target].port
  referenced_security_group_id = each.value.sg
}

# ---------------------------------------------------------------------------------------------
# Tasks -> AWS APIs (interface endpoints, S3 gateway for ECR layers, DynamoDB gateway)
# ---------------------------------------------------------------------------------------------

locals {
  task_security_groups = merge(
    {
      coordinator = aws_security_group.coordinator.id
      verifier    = aws_security_group.verifier.id
    },
    { for id in keys(var.deployers) : "signer:${id}" => aws_security_group.signer[id].id },
  )
  task_security_group_names = concat(["coordinator", "verifier"], [for id in keys(var.deployers) : "signer:${id}"])
}

resource "aws_vpc_security_group_egress_rule" "task_to_endpoints" {
  for_each = toset(local.task_security_group_names)

  security_group_id            = local.task_security_groups[each.key]
  description                  = "HTTPS to interface VPC endpoints (KMS, logs, ECR, Secrets Manager)"
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
  referenced_security_group_id = var.endpoint_security_group_id
}

resource "aws_vpc_security_group_egress_rule" "task_to_s3" {
  for_each = toset(local.task_security_group_names)

  security_group_id = local.task_security_groups[each.key]
  description       = "HTTPS to S3 through the gateway endpoint (ECR image layers)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.s3_prefix_list_id
}

resource "aws_vpc_security_group_egress_rule" "verifier_to_dynamodb" {
  count = local.verifiers_on_postgres ? 0 : 1

  security_group_id = aws_security_group.verifier.id
  description       = "HTTPS to DynamoDB through the gateway endpoint (nonce table)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.dynamodb_prefix_list_id
}

resource "aws_vpc_security_group_egress_rule" "coordinator_to_dynamodb" {
  count = local.registry_on_postgres ? 0 : 1

  security_group_id = aws_security_group.coordinator.id
  description       = "HTTPS to DynamoDB through the gateway endpoint (registry table)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.dynamodb_prefix_list_id
}

# The network path is the same for every signer; which table each may use is decided by its task
# role (modules/signer: its own table's ARN only).
resource "aws_vpc_security_group_egress_rule" "signer_to_dynamodb" {
  for_each = local.signers_on_postgres ? {} : var.deployers

  security_group_id = aws_security_group.signer[each.key].id
  description       = "HTTPS to DynamoDB through the gateway endpoint (this signer's state table)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  prefix_list_id    = var.dynamodb_prefix_list_id
}

# ---------------------------------------------------------------------------------------------
# Stores on PostgreSQL: registry log, nonce store, signer state (each only when it is there)
# ---------------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "postgres_from_coordinator" {
  count = var.postgres_enabled && local.registry_on_postgres ? 1 : 0

  security_group_id            = aws_security_group.postgres[0].id
  description                  = "PostgreSQL from the coordinator (registry log)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.coordinator.id
}

resource "aws_vpc_security_group_egress_rule" "coordinator_to_postgres" {
  count = var.postgres_enabled && local.registry_on_postgres ? 1 : 0

  security_group_id            = aws_security_group.coordinator.id
  description                  = "PostgreSQL (registry log)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.postgres[0].id
}

resource "aws_vpc_security_group_ingress_rule" "postgres_from_verifier" {
  count = var.postgres_enabled && local.verifiers_on_postgres ? 1 : 0

  security_group_id            = aws_security_group.postgres[0].id
  description                  = "PostgreSQL from the verifiers (nonce store)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.verifier.id
}

resource "aws_vpc_security_group_egress_rule" "verifier_to_postgres" {
  count = var.postgres_enabled && local.verifiers_on_postgres ? 1 : 0

  security_group_id            = aws_security_group.verifier.id
  description                  = "PostgreSQL (nonce store)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.postgres[0].id
}

resource "aws_vpc_security_group_ingress_rule" "postgres_from_signer" {
  for_each = var.postgres_enabled && local.signers_on_postgres ? var.deployers : {}

  security_group_id            = aws_security_group.postgres[0].id
  description                  = "PostgreSQL from the signer of deployer ${each.key} (its own database)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.signer[each.key].id
}

resource "aws_vpc_security_group_egress_rule" "signer_to_postgres" {
  for_each = var.postgres_enabled && local.signers_on_postgres ? var.deployers : {}

  security_group_id            = aws_security_group.signer[each.key].id
  description                  = "PostgreSQL (this signer's own database)"
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
  referenced_security_group_id = aws_security_group.postgres[0].id
}

# A marker that exists once every rule above exists. The outputs depend on it, so no task
# (which needs its egress paths to pull its image) starts before its network paths are open.
resource "terraform_data" "paths_open" {
  depends_on = [
    aws_vpc_security_group_ingress_rule.nlb_from_consumer_cidrs,
    aws_vpc_security_group_ingress_rule.nlb_from_consumer_sgs,
    aws_vpc_security_group_egress_rule.nlb_to_verifier,
    aws_vpc_security_group_ingress_rule.verifier_from_nlb,
    aws_vpc_security_group_ingress_rule.coordinator_from_verifier,
    aws_vpc_security_group_egress_rule.verifier_to_coordinator,
    aws_vpc_security_group_ingress_rule.coordinator_from_signer,
    aws_vpc_security_group_ingress_rule.coordinator_from_operator_cidrs,
    aws_vpc_security_group_ingress_rule.coordinator_from_operator_sgs,
    aws_vpc_security_group_egress_rule.signer_to_coordinator,
    aws_vpc_security_group_ingress_rule.signer_from_peer,
    aws_vpc_security_group_egress_rule.signer_to_peer,
    aws_vpc_security_group_ingress_rule.signer_from_runtime_cidrs,
    aws_vpc_security_group_ingress_rule.signer_from_runtime_sgs,
    aws_vpc_security_group_ingress_rule.metrics_from_cidrs,
    aws_vpc_security_group_ingress_rule.metrics_from_sgs,
    aws_vpc_security_group_egress_rule.task_to_endpoints,
    aws_vpc_security_group_egress_rule.task_to_s3,
    aws_vpc_security_group_egress_rule.verifier_to_dynamodb,
    aws_vpc_security_group_egress_rule.coordinator_to_dynamodb,
    aws_vpc_security_group_egress_rule.signer_to_dynamodb,
    aws_vpc_security_group_ingress_rule.postgres_from_coordinator,
    aws_vpc_security_group_egress_rule.coordinator_to_postgres,
    aws_vpc_security_group_ingress_rule.postgres_from_verifier,
    aws_vpc_security_group_egress_rule.verifier_to_postgres,
    aws_vpc_security_group_ingress_rule.postgres_from_signer,
    aws_vpc_security_group_egress_rule.signer_to_postgres,
  ]
}
