# The coordinators: desired_count (at least two) replicas serving one operator-signed, append-only
# registry log. They hold only public keys (no KMS signing permission at all). The log lives in
# its own DynamoDB table (default) or in the optional PostgreSQL; any replica accepts a statement
# (the store takes each sequence once) and reads what the others appended every refresh_ms.
# Followers reach them all under one DNS name (Cloud Map, one A record per healthy task).

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id  = data.aws_caller_identity.current.account_id
  partition   = data.aws_partition.current.partition
  on_dynamodb = var.registry_backend == "dynamodb"

  # The registry log (setting log_store), shared by every replica: its own DynamoDB table, or the
  # optional PostgreSQL in its own schema (the verifiers' nonce store, when also there, uses the
  # schema "countersign").
  log_store = (
    local.on_dynamodb
    ? "dynamodb://${aws_dynamodb_table.registry[0].name}?region=${var.region}"
    : "postgresql://${var.postgres.username}@${var.postgres.address}:${var.postgres.port}/${var.postgres.database}?sslmode=require&schema=countersign_registry"
  )

  tls_secret_keys = {
    COUNTERSIGN_TLS_CERT_PEM = "cert"
    COUNTERSIGN_TLS_KEY_PEM  = "key"
    COUNTERSIGN_TLS_CA_PEM   = "ca"
  }

  # The database password comes from the RDS-managed secret, never from a plain variable.
  # The store reads it from COUNTERSIGN_LOG_STORE_PASSWORD when the URL has none (coordinator/postgres_store.py).
  password_secrets = local.on_dynamodb ? [] : [
    { name = "COUNTERSIGN_LOG_STORE_PASSWORD", valueFrom = "${var.postgres.password_secret}:password::" },
  ]

  # Setting names: coordinator/daemon.py CoordinatorConfig (COUNTERSIGN_<SETTING>).
  environment = [
    { name = "COUNTERSIGN_LOG_STORE", value = local.log_store },
    { name = "COUNTERSIGN_OPERATOR_PUBLIC_KEY", value = var.operator_public_key },
    { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.coordinator}" },
    { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.coordinator_metrics}" },
    { name = "AWS_REGION", value = var.region },
  ]

  # refresh_ms (how often a replica reads what the others appended), set only when given.
  optional_environment = var.refresh_ms == null ? [] : [
    { name = "COUNTERSIGN_REFRESH_MS", value = tostring(var.refresh_ms) },
  ]

  container = {
    name      = "coordinator"
    image     = var.image
    essential = true
    # Runs `countersign coordinator serve`.
    entryPoint             = ["countersign"]
    command                = ["coordinator", "serve"]
    user                   = "${var.container_uid}:${var.container_gid}"
    readonlyRootFilesystem = true
    privileged             = false
    stopTimeout            = 30
    linuxParameters = {
      initProcessEnabled = true
      capabilities       = { add = [], drop = ["ALL"] }
    }
    portMappings = [
      { name = "grpc", containerPort = var.ports.coordinator, protocol = "tcp" },
      { name = "metrics", containerPort = var.ports.coordinator_metrics, protocol = "tcp" },
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
    ]
    # grpc.health.v1 over the coordinator's own mTLS material (docker/healthcheck.py in the image).
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
        awslogs-group         = aws_cloudwatch_log_group.coordinator.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "coordinator"
      }
    }
  }
}

# ---------------------------------------------------------------------------------------------
# IAM
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

resource "aws_iam_role" "task" {
  name                 = "${var.name}-coordinator"
  description          = "Task role of the coordinators: the registry table and nothing else (no KMS signing)"
  assume_role_policy   = data.aws_iam_policy_document.ecs_tasks_assume.json
  max_session_duration = 3600
}

# The registry table, and no other. The calls (coordinator/dynamodb_store.py,
# countersign/_daemon/dynamodb.py): DescribeTable at start, Query and GetItem to read,
# TransactWriteItems of Put parts (authorised as PutItem) and PutItem to append. No UpdateItem,
# no DeleteItem: nothing is ever changed or removed in the log.
data "aws_iam_policy_document" "task_registry_table" {
  count = local.on_dynamodb ? 1 : 0

  statement {
    sid       = "RegistryTableItems"
    effect    = "Allow"
    actions   = ["dynamodb:DescribeTable", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"]
    resources = [aws_dynamodb_table.registry[0].arn]
  }

  statement {
    sid       = "RegistryTableEncryptionThroughDynamoDB"
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

resource "aws_iam_role_policy" "task_registry_table" {
  count = local.on_dynamodb ? 1 : 0

  name   = "registry-table"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task_registry_table[0].json
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-coordinator-exec"
  description        = "ECS execution role of the coordinator (image pull, logs, secrets)"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
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
    resources = ["${aws_cloudwatch_log_group.coordinator.arn}:*"]
  }

  statement {
    sid     = "ReadOwnSecrets"
    effect  = "Allow"
    actions = ["secretsmanager:GetSecretValue"]
    resources = concat(
      [aws_secretsmanager_secret.tls.arn],
      local.on_dynamodb ? [] : [var.postgres.password_secret],
    )
  }

  statement {
    sid       = "DecryptOwnSecrets"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = distinct(concat([var.kms_key_arn], local.on_dynamodb ? [] : [var.postgres.secret_kms_key_arn]))

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
# Registry log in DynamoDB (unless it is in PostgreSQL)
# ---------------------------------------------------------------------------------------------

# The table shape every Countersign store expects (countersign/_daemon/dynamodb.py), without TTL:
# nothing in an append-only log may ever expire, so the table has no deletion mechanism at all.
resource "aws_dynamodb_table" "registry" {
  count = local.on_dynamodb ? 1 : 0

  name         = "${var.name}-registry"
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

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection
}

# ---------------------------------------------------------------------------------------------
# TLS secret and logs
# ---------------------------------------------------------------------------------------------

resource "aws_secretsmanager_secret" "tls" {
  #checkov:skip=CKV2_AWS_57:Holds mTLS certificate material issued by the deployment's PKI; it is rotated by writing a new secret version when the certificate is re-issued, there is no rotation Lambda to attach.
  name                    = "${var.name}/tls/coordinator"
  description             = "mTLS material of the coordinator: JSON with keys cert, key, ca (PEM)"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 30
}

resource "aws_cloudwatch_log_group" "coordinator" {
  name              = "/countersign/${var.name}/coordinator"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

# ---------------------------------------------------------------------------------------------
# Service discovery, task definition, service
# ---------------------------------------------------------------------------------------------

resource "aws_service_discovery_service" "coordinator" {
  name = "coordinator"

  dns_config {
    namespace_id   = var.namespace_id
    routing_policy = "MULTIVALUE"

    dns_records {
      type = "A"
      ttl  = 10
    }
  }

  # One A record per healthy task: followers and the operator's tooling name
  # coordinator.<namespace> and gRPC tries its addresses. ECS reports task health to Cloud Map (the
  # threshold is fixed at 1 by AWS).
  health_check_custom_config {
    failure_threshold = 1
  }
}

resource "aws_ecs_task_definition" "coordinator" {
  family                   = "${var.name}-coordinator"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = tostring(var.cpu)
  memory                   = tostring(var.memory)
  task_role_arn            = aws_iam_role.task.arn
  execution_role_arn       = aws_iam_role.execution.arn
  container_definitions    = jsonencode([local.container])

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = var.cpu_architecture
  }

  volume {
    name = "tmp"
  }
}

resource "aws_ecs_service" "coordinator" {
  name             = "coordinator"
  cluster          = var.cluster_arn
  task_definition  = aws_ecs_task_definition.coordinator.arn
  desired_count    = var.desired_count
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  # Any number of replicas may append to the one log (the store takes each sequence once), so a
  # deployment starts the new tasks before it stops the old ones; Fargate spreads the tasks over
  # the subnets' zones and rebalancing moves them back after a zone returns.
  availability_zone_rebalancing      = "ENABLED"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200

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
    registry_arn = aws_service_discovery_service.coordinator.arn
  }

  depends_on = [aws_iam_role_policy.task_registry_table]
}
