# The coordinator: serves the operator-signed, append-only registry log. It holds only public
# keys (no KMS signing permission at all). The log lives on a small KMS-encrypted EFS file
# system (default) or in the optional PostgreSQL.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  on_efs     = var.registry_backend == "efs"

  # The registry log (setting log_store): SQLite on the KMS-encrypted EFS file system, written by
  # this one task only (desired_count 1, stop-first deployments), or the optional PostgreSQL in
  # its own schema (the verifiers' nonce store, when also there, uses the schema "countersign").
  registry_dir = "/var/lib/countersign/registry"
  log_store = (
    local.on_efs
    ? "sqlite:///${local.registry_dir}/registry.db"
    : "postgresql://${var.postgres.username}@${var.postgres.address}:${var.postgres.port}/${var.postgres.database}?sslmode=require&schema=countersign_registry"
  )

  tls_secret_keys = {
    COUNTERSIGN_TLS_CERT_PEM = "cert"
    COUNTERSIGN_TLS_KEY_PEM  = "key"
    COUNTERSIGN_TLS_CA_PEM   = "ca"
  }

  # The database password comes from the RDS-managed secret, never from a plain variable.
  # The store reads it from COUNTERSIGN_LOG_STORE_PASSWORD when the URL has none (coordinator/postgres_store.py).
  password_secrets = local.on_efs ? [] : [
    { name = "COUNTERSIGN_LOG_STORE_PASSWORD", valueFrom = "${var.postgres.password_secret}:password::" },
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
    # Setting names: coordinator/daemon.py CoordinatorConfig (COUNTERSIGN_<SETTING>).
    environment = [
      { name = "COUNTERSIGN_LOG_STORE", value = local.log_store },
      { name = "COUNTERSIGN_OPERATOR_PUBLIC_KEY", value = var.operator_public_key },
      { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.coordinator}" },
      { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.coordinator_metrics}" },
      { name = "AWS_REGION", value = var.region },
    ]
    secrets = concat(
      [
        for env_name, json_key in local.tls_secret_keys : {
          name      = env_name
          valueFrom = "${aws_secretsmanager_secret.tls.arn}:${json_key}::"
        }
      ],
      local.password_secrets,
    )
    mountPoints = concat(
      [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }],
      local.on_efs ? [{ sourceVolume = "registry", containerPath = local.registry_dir, readOnly = false }] : [],
    )
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
  description          = "Task role of the coordinator: mounts its registry file system, nothing else (no KMS signing)"
  assume_role_policy   = data.aws_iam_policy_document.ecs_tasks_assume.json
  max_session_duration = 3600
}

data "aws_iam_policy_document" "task_efs" {
  count = local.on_efs ? 1 : 0

  statement {
    sid       = "MountRegistryThroughAccessPoint"
    effect    = "Allow"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    resources = [aws_efs_file_system.registry[0].arn]

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.registry[0].arn]
    }
  }
}

resource "aws_iam_role_policy" "task_efs" {
  count = local.on_efs ? 1 : 0

  name   = "mount-registry"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task_efs[0].json
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
      local.on_efs ? [] : [var.postgres.password_secret],
    )
  }

  statement {
    sid       = "DecryptOwnSecrets"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = distinct(concat([var.kms_key_arn], local.on_efs ? [] : [var.postgres.secret_kms_key_arn]))

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
# Registry log on EFS (when PostgreSQL is off)
# ---------------------------------------------------------------------------------------------

resource "aws_efs_file_system" "registry" {
  # Backed up by EFS automatic backups (aws_efs_backup_policy below), i.e. AWS Backup's default plan.
  count = local.on_efs ? 1 : 0

  creation_token   = "${var.name}-registry"
  encrypted        = true
  kms_key_id       = var.kms_key_arn
  performance_mode = "generalPurpose"
  throughput_mode  = "elastic"

  tags = { Name = "${var.name}-registry" }
}

resource "aws_efs_backup_policy" "registry" {
  count = local.on_efs ? 1 : 0

  file_system_id = aws_efs_file_system.registry[0].id

  backup_policy {
    status = "ENABLED"
  }
}

resource "aws_efs_mount_target" "registry" {
  count = local.on_efs ? length(var.subnet_ids) : 0

  file_system_id  = aws_efs_file_system.registry[0].id
  subnet_id       = var.subnet_ids[count.index]
  security_groups = [var.efs_security_group_id]
}

resource "aws_efs_access_point" "registry" {
  count = local.on_efs ? 1 : 0

  file_system_id = aws_efs_file_system.registry[0].id

  posix_user {
    uid = var.container_uid
    gid = var.container_gid
  }

  root_directory {
    path = "/registry"

    creation_info {
      owner_uid   = var.container_uid
      owner_gid   = var.container_gid
      permissions = "0750"
    }
  }

  tags = { Name = "${var.name}-registry" }
}

data "aws_iam_policy_document" "efs" {
  count = local.on_efs ? 1 : 0

  statement {
    sid       = "CoordinatorThroughAccessPointOnly"
    effect    = "Allow"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    resources = [aws_efs_file_system.registry[0].arn]

    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.task.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.registry[0].arn]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["true"]
    }
  }

  statement {
    sid       = "DenyWithoutTls"
    effect    = "Deny"
    actions   = ["*"]
    resources = [aws_efs_file_system.registry[0].arn]

    principals {
      type        = "AWS"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_efs_file_system_policy" "registry" {
  count = local.on_efs ? 1 : 0

  file_system_id = aws_efs_file_system.registry[0].id
  policy         = data.aws_iam_policy_document.efs[0].json
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

  # ECS reports task health to Cloud Map (the threshold is fixed at 1 by AWS).
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

  dynamic "volume" {
    for_each = local.on_efs ? [1] : []

    content {
      name = "registry"

      efs_volume_configuration {
        file_system_id     = aws_efs_file_system.registry[0].id
        transit_encryption = "ENABLED"

        authorization_config {
          access_point_id = aws_efs_access_point.registry[0].id
          iam             = "ENABLED"
        }
      }
    }
  }
}

resource "aws_ecs_service" "coordinator" {
  name             = "coordinator"
  cluster          = var.cluster_arn
  task_definition  = aws_ecs_task_definition.coordinator.arn
  desired_count    = 1
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  # A single writer of the append-only registry log: stop the old task before starting a new one.
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

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

  depends_on = [aws_efs_mount_target.registry, aws_efs_file_system_policy.registry]
}
