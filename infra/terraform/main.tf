# Countersign on AWS: three availability zones; per deployer a signer service of at least three
# replicas (one per zone) over the deployer's own state table; coordinator replicas over one
# registry log; verifier replicas behind an internal network load balancer; a DynamoDB nonce
# table and, optionally, PostgreSQL. See README.md in this folder for the layout and how to run it.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  name = "${var.name_prefix}-${var.environment}"

  # gRPC and Prometheus ports fixed by docs/api.md; every module takes them from here.
  ports = {
    coordinator         = 7400
    signer              = 7401
    verifier            = 7402
    coordinator_metrics = 9400
    signer_metrics      = 9401
    verifier_metrics    = 9402
  }

  account_root_arn = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"
  kms_admin_arns   = length(var.kms_admin_principal_arns) > 0 ? var.kms_admin_principal_arns : [local.account_root_arn]

  # DNS and resource-name form of a deployer id ('.' and '_' are not allowed everywhere).
  deployer_slugs = { for id in keys(var.deployers) : id => replace(replace(id, ".", "-"), "_", "-") }

  # One DNS name per service, resolving to one address per healthy task (Cloud Map MULTIVALUE): the
  # followers' coordinator setting and each deployer's signer address name all the replicas.
  coordinator_address = "coordinator.${var.service_discovery_namespace}:${local.ports.coordinator}"
  signer_addresses    = { for id, slug in local.deployer_slugs : id => "${slug}.${var.service_discovery_namespace}:${local.ports.signer}" }

  # Delegation edges parent -> child declared by allowed_children. A signer talks to the signers
  # of its parents (to ask for co-signatures) and of its children (which ask it); no one else
  # (modules/security opens 7401 for exactly these pairs). No signer is told its peers' addresses:
  # a child's runtime names the parent's signer in each AcceptDelegation request, and the child's
  # signer pins that deployer's certificate name whatever address it dials.
  delegation_edges = flatten([
    for parent, d in var.deployers : [for child in d.allowed_children : { parent = parent, child = child }]
  ])

  # The image is an ECR URI in var.region (validated): <account>.dkr.ecr.<region>.amazonaws.com/<repo>[:tag|@digest].
  ecr_repository_name = regex("^[^/]+/([^:@]+)", var.image)[0]
  ecr_repository_arn  = "arn:${data.aws_partition.current.partition}:ecr:${var.region}:${split(".", var.image)[0]}:repository/${local.ecr_repository_name}"
}

module "encryption" {
  source = "./modules/encryption"

  name   = local.name
  region = var.region
}

module "network" {
  source = "./modules/network"

  name               = local.name
  region             = var.region
  vpc_cidr           = var.vpc_cidr
  availability_zones = var.availability_zones
  kms_key_arn        = module.encryption.key_arn
  log_retention_days = var.log_retention_days
}

module "security" {
  source = "./modules/security"

  name                        = local.name
  vpc_id                      = module.network.vpc_id
  ports                       = local.ports
  deployers                   = var.deployers
  delegation_edges            = local.delegation_edges
  consumer_cidr_blocks        = var.consumer_cidr_blocks
  consumer_security_group_ids = var.consumer_security_group_ids
  operator_cidr_blocks        = var.operator_cidr_blocks
  operator_security_group_ids = var.operator_security_group_ids
  metrics_cidr_blocks         = var.metrics_cidr_blocks
  metrics_security_group_ids  = var.metrics_security_group_ids
  endpoint_security_group_id  = module.network.endpoint_security_group_id
  s3_prefix_list_id           = module.network.s3_prefix_list_id
  dynamodb_prefix_list_id     = module.network.dynamodb_prefix_list_id
  postgres_enabled            = var.enable_postgres
  registry_store_backend      = var.registry_store_backend
  nonce_store_backend         = var.nonce_store_backend
  signer_state_backend        = var.signer_state_backend
}

module "cluster" {
  source = "./modules/cluster"

  name                        = local.name
  vpc_id                      = module.network.vpc_id
  service_discovery_namespace = var.service_discovery_namespace
  kms_key_arn                 = module.encryption.key_arn
  log_retention_days          = var.log_retention_days
  create_ecr_repository       = var.create_ecr_repository
}

module "nonce_store" {
  source = "./modules/nonce_store"

  name                = local.name
  kms_key_arn         = module.encryption.key_arn
  deletion_protection = var.deletion_protection
}

module "postgres" {
  source = "./modules/postgres"
  count  = var.enable_postgres ? 1 : 0

  name                 = local.name
  subnet_ids           = module.network.private_subnet_ids
  security_group_id    = module.security.postgres_security_group_id
  kms_key_arn          = module.encryption.key_arn
  instance_class       = var.postgres_instance_class
  engine_version       = var.postgres_engine_version
  allocated_storage_gb = var.postgres_allocated_storage_gb
  deletion_protection  = var.deletion_protection
  log_retention_days   = var.log_retention_days
  database_name        = "countersign"
  master_username      = "countersign"
}

module "coordinator" {
  source = "./modules/coordinator"

  name                = local.name
  region              = var.region
  image               = var.image
  ecr_repository_arn  = local.ecr_repository_arn
  cpu_architecture    = var.cpu_architecture
  cpu                 = var.coordinator_cpu
  memory              = var.coordinator_memory
  desired_count       = var.coordinator_count
  refresh_ms          = var.coordinator_refresh_ms
  container_uid       = var.container_uid
  container_gid       = var.container_gid
  ports               = local.ports
  cluster_arn         = module.cluster.cluster_arn
  namespace_id        = module.cluster.namespace_id
  subnet_ids          = module.network.private_subnet_ids
  security_group_id   = module.security.coordinator_security_group_id
  kms_key_arn         = module.encryption.key_arn
  log_retention_days  = var.log_retention_days
  deletion_protection = var.deletion_protection
  operator_public_key = var.operator_public_key
  registry_backend    = var.registry_store_backend
  postgres            = var.registry_store_backend == "postgresql" ? module.postgres[0].connection : null
}

module "signer" {
  source   = "./modules/signer"
  for_each = var.deployers

  name                = local.name
  region              = var.region
  deployer_id         = each.key
  deployer_slug       = local.deployer_slugs[each.key]
  allowed_children    = sort(each.value.allowed_children)
  operator_public_key = var.operator_public_key
  image               = var.image
  ecr_repository_arn  = local.ecr_repository_arn
  cpu_architecture    = var.cpu_architecture
  cpu                 = each.value.cpu
  memory              = each.value.memory
  desired_count       = each.value.desired_count
  commit_batch        = each.value.commit_batch
  decide_attempts     = each.value.decide_attempts
  container_uid       = var.container_uid
  container_gid       = var.container_gid
  ports               = local.ports
  cluster_arn         = module.cluster.cluster_arn
  namespace_id        = module.cluster.namespace_id
  subnet_ids          = module.network.private_subnet_ids
  security_group_id   = module.security.signer_security_group_ids[each.key]
  coordinator_address = local.coordinator_address
  kms_admin_arns      = local.kms_admin_arns
  kms_key_arn         = module.encryption.key_arn
  log_retention_days  = var.log_retention_days
  deletion_protection = var.deletion_protection
  state_backend       = var.signer_state_backend
  postgres            = var.signer_state_backend == "postgresql" ? module.postgres[0].connection : null
}

module "verifier" {
  source = "./modules/verifier"

  name                  = local.name
  region                = var.region
  image                 = var.image
  ecr_repository_arn    = local.ecr_repository_arn
  cpu_architecture      = var.cpu_architecture
  cpu                   = var.verifier_cpu
  memory                = var.verifier_memory
  desired_count         = var.verifier_count
  container_uid         = var.container_uid
  container_gid         = var.container_gid
  ports                 = local.ports
  vpc_id                = module.network.vpc_id
  cluster_arn           = module.cluster.cluster_arn
  subnet_ids            = module.network.private_subnet_ids
  security_group_id     = module.security.verifier_security_group_id
  nlb_security_group_id = module.security.nlb_security_group_id
  coordinator_address   = local.coordinator_address
  operator_public_key   = var.operator_public_key
  kms_key_arn           = module.encryption.key_arn
  log_retention_days    = var.log_retention_days
  deletion_protection   = var.deletion_protection
  nonce_store_backend   = var.nonce_store_backend
  nonce_table_name      = module.nonce_store.table_name
  nonce_table_arn       = module.nonce_store.table_arn
  postgres              = var.enable_postgres ? module.postgres[0].connection : null
}
