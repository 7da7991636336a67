# One deployer's signer: its own IAM task role, its own AWS KMS Ed25519 key (which only that
# role may use to sign), its TLS secret, its own state store (a DynamoDB table by default, or its
# own PostgreSQL database), and desired_count (at least three) Fargate tasks spread over the three
# availability zones. Every task is a replica: the same key, the same state (ADR 0033); a runtime
# reaches them all under one DNS name (Cloud Map, one A record per healthy task).

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  # Readable but bounded: IAM role names are limited to 64 characters.
  short_id = length(var.deployer_slug) <= 24 ? var.deployer_slug : "${substr(var.deployer_slug, 0, 15)}-${substr(sha256(var.deployer_id), 0, 8)}"

  on_dynamodb = var.state_backend == "dynamodb"

  # PostgreSQL: this deployer's own database, owned by its own login role of the same name (a plain
  # identifier: slugs are distinct after '.' and '_' become '-', so they stay distinct when '-'
  # becomes '_'). No other deployer's role may connect to it (see README.md, "Signer state on
  # PostgreSQL"); the password is in this signer's own secret.
  postgres_name = "countersign_signer_${replace(local.short_id, "-", "_")}"

  # Administration only. Deliberately absent: kms:Sign, kms:Verify, kms:GetPublicKey and
  # kms:CreateGrant (a grant could hand signing to someone else), and no "kms:*" or other wildcard.
  key_admin_actions = [
    "kms:CancelKeyDeletion",
    "kms:CreateAlias",
    "kms:DeleteAlias",
    "kms:DescribeKey",
    "kms:DisableKey",
    "kms:EnableKey",
    "kms:GetKeyPolicy",
    "kms:GetKeyRotationStatus",
    "kms:ListGrants",
    "kms:ListKeyPolicies",
    "kms:ListResourceTags",
    "kms:PutKeyPolicy",
    "kms:RevokeGrant",
    "kms:ScheduleKeyDeletion",
    "kms:TagResource",
    "kms:UntagResource",
    "kms:UpdateAlias",
    "kms:UpdateKeyDescription",
  ]

  key_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "KeyAdministrationWithoutUse"
        Effect    = "Allow"
        Principal = { AWS = var.kms_admin_arns }
        Action    = local.key_admin_actions
        Resource  = "*"
      },
      {
        Sid       = "SignerReadsItsPublicKey"
        Effect    = "Allow"
        Principal = { AWS = aws_iam_role.signer.arn }
        Action    = ["kms:GetPublicKey", "kms:DescribeKey"]
        Resource  = "*"
      },
      {
        # Pure Ed25519 only (RFC 8032, what every Countersign verifier checks): the condition keeps
        # even this role from asking for Ed25519ph (ED25519_PH_SHA_512). kms:SigningAlgorithm exists
        # only in Sign/Verify requests, so it sits on a kms:Sign-only statement (docs/kms.md).
        Sid       = "OnlyThisDeployersSignerSigns"
        Effect    = "Allow"
        Principal = { AWS = aws_iam_role.signer.arn }
        Action    = ["kms:Sign"]
        Resource  = "*"
        Condition = {
          StringEquals = { "kms:SigningAlgorithm" = "ED25519_SHA_512" }
        }
      },
      {
        # Belt and braces: even a grant or a later policy edit that allows signing to another
        # principal is overridden by this explicit deny.
        Sid       = "NobodyElseSigns"
        Effect    = "Deny"
        Principal = { AWS = "*" }
        Action    = ["kms:Sign"]
        Resource  = "*"
        Condition = {
          ArnNotEquals = { "aws:PrincipalArn" = aws_iam_role.signer.arn }
        }
      },
    ]
  }

  # Grants, issued records, per-parent child counts, session counters and request answers are shared
  # by every replica and survive every restart: they live in this deployer's own store (setting
  # state_url), never in a task. Each replica keeps its own verified copy of the registry log in
  # its task storage (setting registry_cache): replicas must not share that file (each rewrites it
  # through the same temporary name), and a new task fetches and verifies the whole log again.
  state_url = (
    local.on_dynamodb
    ? "dynamodb://${aws_dynamodb_table.state[0].name}?region=${var.region}"
    : "postgresql://${local.postgres_name}@${var.postgres.address}:${var.postgres.port}/${local.postgres_name}?sslmode=require&schema=countersign_signer"
  )
  registry_cache_dir = "/var/lib/countersign/registry-cache"

  tls_secret_keys = {
    COUNTERSIGN_TLS_CERT_PEM = "cert"
    COUNTERSIGN_TLS_KEY_PEM  = "key"
    COUNTERSIGN_TLS_CA_PEM   = "ca"
  }

  # The database password comes from this signer's own secret, never from a plain variable; the
  # store reads it from COUNTERSIGN_SIGNER_STATE_PASSWORD when the URL has none (signer/stores/postgres.py).
  password_secrets = local.on_dynamodb ? [] : [
    { name = "COUNTERSIGN_SIGNER_STATE_PASSWORD", valueFrom = "${aws_secretsmanager_secret.state_password[0].arn}:password::" },
  ]

  # Setting names: signer/config.py SignerConfig (COUNTERSIGN_<SETTING>). A parent signer's
  # address is not configured: it travels in each AcceptDelegation request (parent_signer). The
  # coordinator address is one DNS name with an A record per coordinator task.
  environment = [
    { name = "COUNTERSIGN_DEPLOYER", value = var.deployer_id },
    { name = "COUNTERSIGN_SIGNER_KEY", value = "awskms:${aws_kms_key.signer.arn}" },
    { name = "COUNTERSIGN_OPERATOR_PUBLIC_KEY", value = var.operator_public_key },
    { name = "COUNTERSIGN_COORDINATOR", value = var.coordinator_address },
    { name = "COUNTERSIGN_STATE_URL", value = local.state_url },
    { name = "COUNTERSIGN_REGISTRY_CACHE", value = "${local.registry_cache_dir}/registry.json" },
    { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.signer}" },
    { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.signer_metrics}" },
    { name = "COUNTERSIGN_ALLOWED_CHILDREN", value = join(",", var.allowed_children) },
    { name = "AWS_REGION", value = var.region },
  ]

  # Optional tuning, set only when given (unset: the daemon's default).
  optional_environment = [
    for name, value in {
      COUNTERSIGN_COMMIT_BATCH    = var.commit_batch
      COUNTERSIGN_DECIDE_ATTEMPTS = var.decide_attempts
    } : { name = name, value = tostring(value) } if value != null
  ]

  container = {
    name      = "signer"
    image     = var.image
    essential = true
    # Runs `countersign signer serve`.
    entryPoint             = ["countersign"]
    command                = ["signer", "serve"]
    user                   = "${var.container_uid}:${var.container_gid}"
    readonlyRootFilesystem = true
    privileged             = false
    stopTimeout            = 30
    linuxParameters = {
      initProcessEnabled = true
      capabilities       = { add = [], drop = ["ALL"] }
    }
    portMappings = [
      { name = "grpc", containerPort = var.ports.signer, protocol = "tcp" },
      { name = "metrics", containerPort = var.ports.signer_metrics, protocol = "tcp" },
    ]
    environment = concat(local.environment, local.optional_environment)
    secrets = concat(
      [
        for env_name, json_key in local.tls_secret_keys : {
          name      = env_name
          valueFrom = "${aws_secretsmanager_secret.tls.arn}:${json_key}::"
        }
      ],
      local.password_secrets,
    )
    mountPoints = [
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
      { sourceVolume = "registry-cache", containerPath = local.registry_cache_dir, readOnly = false },
    ]
    # grpc.health.v1 over the signer's own mTLS material (docker/healthcheck.py in the image).
    healthCheck = {
      command     = ["CMD", "/opt/countersign/bin/python", "/usr/local/lib/countersign/healthcheck.py"]
      interval    = 15
      timeout     = 5
      retries     = 3
      startPeriod = 60
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.signer.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "signer"
      }
    }
  }
}

# ---------------------------------------------------------------------------------------------
# IAM: the signer's task role (the only principal that may sign) and its execution role
# ---------------------------------------------------------------------------------------------

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    sid     = "EcsTasksOfThisAccount"
    effect  = "Allow"
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }

    condition {
      test     = "ArnLike"
      variable = "aws:SourceArn"
      values   = ["arn:${local.partition}:ecs:${var.region}:${local.account_id}:*"]
    }
  }
}

resource "aws_iam_role" "signer" {
  name                 = "${var.name}-signer-${local.short_id}"
  description          = "Task role of the signer of deployer ${var.deployer_id}: the only principal allowed to sign with its KMS key"
  assume_role_policy   = data.aws_iam_policy_document.ecs_tasks_assume.json
  max_session_duration = 3600

  tags = { Deployer = var.deployer_id }
}

# The signer's own state table, and no other: every statement names this module's one table. The
# calls (signer/stores/dynamodb.py, countersign/_daemon/dynamodb.py): DescribeTable at start,
# BatchGetItem to read, TransactWriteItems of Put and Update parts to write (IAM authorises each
# part as PutItem / UpdateItem; there is no TransactWriteItems action), Scan and DeleteItem to
# collect expired items. tests/infra derives the actions from those sources.
data "aws_iam_policy_document" "task_state_table" {
  count = local.on_dynamodb ? 1 : 0

  statement {
    sid    = "OwnStateTableItems"
    effect = "Allow"
    actions = [
      "dynamodb:BatchGetItem",
      "dynamodb:DeleteItem",
      "dynamodb:DescribeTable",
      "dynamodb:PutItem",
      "dynamodb:Scan",
      "dynamodb:UpdateItem",
    ]
    resources = [aws_dynamodb_table.state[0].arn]
  }

  statement {
    sid       = "StateTableEncryptionThroughDynamoDB"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey"]
    resources = [var.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["dynamodb.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "task_state_table" {
  count = local.on_dynamodb ? 1 : 0

  name   = "own-state-table"
  role   = aws_iam_role.signer.id
  policy = data.aws_iam_policy_document.task_state_table[0].json
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-signer-${local.short_id}-exec"
  description        = "ECS execution role of the signer of deployer ${var.deployer_id} (image pull, logs, its own secrets)"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json

  tags = { Deployer = var.deployer_id }
}

data "aws_iam_policy_document" "execution" {
  statement {
    sid       = "EcrLogin"
    effect    = "Allow"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"]
  }

  statement {
    sid       = "PullCountersignImage"
    effect    = "Allow"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = [var.ecr_repository_arn]
  }

  statement {
    sid       = "WriteOwnLogGroup"
    effect    = "Allow"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.signer.arn}:*"]
  }

  statement {
    sid     = "ReadOwnSecrets"
    effect  = "Allow"
    actions = ["secretsmanager:GetSecretValue"]
    resources = concat(
      [aws_secretsmanager_secret.tls.arn],
      local.on_dynamodb ? [] : [aws_secretsmanager_secret.state_password[0].arn],
    )
  }

  statement {
    sid       = "DecryptOwnSecrets"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "execution" {
  name   = "pull-log-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution.json
}

# ---------------------------------------------------------------------------------------------
# The deployer's Ed25519 signing key
# ---------------------------------------------------------------------------------------------

resource "aws_kms_key" "signer" {
  description              = "${var.name}: Ed25519 signing key of deployer ${var.deployer_id}"
  customer_master_key_spec = "ECC_NIST_EDWARDS25519"
  key_usage                = "SIGN_VERIFY"
  # Automatic rotation does not exist for asymmetric keys; Countersign rotates by enrolling a
  # new key (with overlap) through the operator-signed registry.
  enable_key_rotation     = false
  deletion_window_in_days = 30
  is_enabled              = true
  multi_region            = false
  policy                  = jsonencode(local.key_policy)

  tags = { Deployer = var.deployer_id }
}

resource "aws_kms_alias" "signer" {
  name          = "alias/${var.name}/signer/${var.deployer_slug}"
  target_key_id = aws_kms_key.signer.key_id
}

# ---------------------------------------------------------------------------------------------
# Durable state shared by the replicas: this deployer's own DynamoDB table (the default) or its own
# PostgreSQL database, whose password is in this deployer's own secret
# ---------------------------------------------------------------------------------------------

# The table shape every Countersign store expects (countersign/_daemon/dynamodb.py): pk/sk strings,
# on-demand, TTL on expires_at (DynamoDB removes what the collector left behind), restorable to
# any second of the last 35 days, encrypted with the deployment's data key.
resource "aws_dynamodb_table" "state" {
  count = local.on_dynamodb ? 1 : 0

  name         = "${var.name}-signer-${var.deployer_slug}"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"
  range_key    = "sk"

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  ttl {
    enabled        = true
    attribute_name = "expires_at"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection

  tags = { Deployer = var.deployer_id }
}

resource "aws_secretsmanager_secret" "state_password" {
  #checkov:skip=CKV2_AWS_57:Holds the password of this deployer's own PostgreSQL login role, which the operator sets together with the role (README.md); it is rotated by ALTER ROLE and a new secret version, there is no rotation Lambda to attach.
  count = local.on_dynamodb ? 0 : 1

  name                    = "${var.name}/postgres/signer/${var.deployer_id}"
  description             = "Password of the PostgreSQL role ${local.postgres_name} of the signer of deployer ${var.deployer_id}: JSON with key password"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 30

  tags = { Deployer = var.deployer_id }
}

# ---------------------------------------------------------------------------------------------
# TLS material (written out of band: cert, key and ca as JSON keys) and logs
# ---------------------------------------------------------------------------------------------

resource "aws_secretsmanager_secret" "tls" {
  #checkov:skip=CKV2_AWS_57:Holds mTLS certificate material issued by the deployment's PKI; it is rotated by writing a new secret version when the certificate is re-issued, there is no rotation Lambda to attach.
  name                    = "${var.name}/tls/signer/${var.deployer_id}"
  description             = "mTLS material of the signer of deployer ${var.deployer_id}: JSON with keys cert, key, ca (PEM)"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 30

  tags = { Deployer = var.deployer_id }
}

resource "aws_cloudwatch_log_group" "signer" {
  name              = "/countersign/${var.name}/signer/${var.deployer_id}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn

  tags = { Deployer = var.deployer_id }
}

# ---------------------------------------------------------------------------------------------
# Service discovery, task definition, service
# ---------------------------------------------------------------------------------------------

resource "aws_service_discovery_service" "signer" {
  name = var.deployer_slug

  dns_config {
    namespace_id   = var.namespace_id
    routing_policy = "MULTIVALUE"

    dns_records {
      type = "A"
      ttl  = 10
    }
  }

  # One A record per healthy task: runtimes, peer signers and the SDK's failover reach every replica
  # under <deployer slug>.<namespace>. ECS reports task health to Cloud Map (the threshold is fixed
  # at 1 by AWS).
  health_check_custom_config {
    failure_threshold = 1
  }

  tags = { Deployer = var.deployer_id }
}

resource "aws_ecs_task_definition" "signer" {
  family                   = "${var.name}-signer-${var.deployer_slug}"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = tostring(var.cpu)
  memory                   = tostring(var.memory)
  task_role_arn            = aws_iam_role.signer.arn
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions    = jsonencode([local.container])

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  volume {
    name = "tmp"
  }

  volume {
    name = "registry-cache"
  }

  tags = { Deployer = var.deployer_id }
}

resource "aws_ecs_service" "signer" {
  name             = "signer-${var.deployer_slug}"
  cluster          = var.cluster_arn
  task_definition  = aws_ecs_task_definition.signer.arn
  desired_count    = var.desired_count
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  # Replicas over one shared state: every spend decision is a conditional write in the store, so
  # old and new tasks may run side by side. A deployment starts the new tasks first and stops an
  # old one only when a new one is healthy: the deployer never has fewer than desired_count.
  # Fargate spreads a service's tasks over its subnets' zones (one subnet per zone); rebalancing
  # moves them back after a zone returns.
  availability_zone_rebalancing      = "ENABLED"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

  # A shell in this task could sign with the deployer's key.
  enable_execute_command  = false
  enable_ecs_managed_tags = true
  propagate_tags          = "SERVICE"

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = var.subnet_ids
    security_groups  = [var.security_group_id]
    assign_public_ip = false
  }

  service_registries {
    registry_arn = aws_service_discovery_service.signer.arn
  }

  tags = { Deployer = var.deployer_id }

  depends_on = [aws_iam_role_policy.task_state_table]
}
