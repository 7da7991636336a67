# One deployer's signer: its own IAM task role, its own AWS KMS Ed25519 key (which only that
# role may use to sign), its TLS secret, its own EFS file system for its durable state, and one
# Fargate task in the deployer's availability zone.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  # Readable but bounded: IAM role names are limited to 64 characters.
  short_id = length(var.deployer_slug) <= 24 ? var.deployer_slug : "${substr(var.deployer_slug, 0, 15)}-${substr(sha256(var.deployer_id), 0, 8)}"

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

  # Grants, issued records, per-parent child counts, session counters and the verified copy of the
  # registry must survive a restart (a restarted signer must neither forget a limit nor reuse a
  # grant), so they live on this signer's own EFS file system, not in the task's ephemeral storage.
  state_dir = "/var/lib/countersign/signer"

  tls_secret_keys = {
    COUNTERSIGN_TLS_CERT_PEM = "cert"
    COUNTERSIGN_TLS_KEY_PEM  = "key"
    COUNTERSIGN_TLS_CA_PEM   = "ca"
  }

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
    # Setting names: signer/daemon.py SignerConfig (COUNTERSIGN_<SETTING>). A parent signer's
    # address is not configured: it travels in each AcceptDelegation request (parent_signer).
    environment = [
      { name = "COUNTERSIGN_DEPLOYER", value = var.deployer_id },
      { name = "COUNTERSIGN_SIGNER_KEY", value = "awskms:${aws_kms_key.signer.arn}" },
      { name = "COUNTERSIGN_OPERATOR_PUBLIC_KEY", value = var.operator_public_key },
      { name = "COUNTERSIGN_COORDINATOR", value = var.coordinator_address },
      { name = "COUNTERSIGN_STATE_URL", value = "sqlite:///${local.state_dir}/signer.db" },
      { name = "COUNTERSIGN_REGISTRY_CACHE", value = "${local.state_dir}/registry.json" },
      { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.signer}" },
      { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.signer_metrics}" },
      { name = "COUNTERSIGN_ALLOWED_CHILDREN", value = join(",", var.allowed_children) },
      { name = "AWS_REGION", value = var.region },
    ]
    secrets = [
      for env_name, json_key in local.tls_secret_keys : {
        name      = env_name
        valueFrom = "${aws_secretsmanager_secret.tls.arn}:${json_key}::"
      }
    ]
    mountPoints = [
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
      { sourceVolume = "state", containerPath = local.state_dir, readOnly = false },
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

data "aws_iam_policy_document" "task_efs" {
  statement {
    sid       = "MountOwnStateThroughAccessPoint"
    effect    = "Allow"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    resources = [aws_efs_file_system.state.arn]

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.state.arn]
    }
  }
}

resource "aws_iam_role_policy" "task_efs" {
  name   = "mount-state"
  role   = aws_iam_role.signer.id
  policy = data.aws_iam_policy_document.task_efs.json
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-signer-${local.short_id}-exec"
  description        = "ECS execution role of the signer of deployer ${var.deployer_id} (image pull, logs, TLS secret)"
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
    sid       = "ReadOwnTlsSecret"
    effect    = "Allow"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [aws_secretsmanager_secret.tls.arn]
  }

  statement {
    sid       = "DecryptOwnTlsSecret"
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
# Durable state on EFS: one file system per signer, reachable only by its task role through its
# access point, over TLS, from its own security group
# ---------------------------------------------------------------------------------------------

resource "aws_efs_file_system" "state" {
  # Backed up by EFS automatic backups (aws_efs_backup_policy below), i.e. AWS Backup's default plan.
  creation_token   = "${var.name}-signer-${var.deployer_slug}-state"
  encrypted        = true
  kms_key_id       = var.kms_key_arn
  performance_mode = "generalPurpose"
  throughput_mode  = "elastic"

  tags = { Name = "${var.name}-signer-${var.deployer_slug}-state", Deployer = var.deployer_id }
}

resource "aws_efs_backup_policy" "state" {
  file_system_id = aws_efs_file_system.state.id

  backup_policy {
    status = "ENABLED"
  }
}

# One mount target, in the deployer's zone: the signer task runs only there. The data itself is
# stored across the region's zones by EFS.
resource "aws_efs_mount_target" "state" {
  file_system_id  = aws_efs_file_system.state.id
  subnet_id       = var.subnet_id
  security_groups = [var.efs_security_group_id]
}

resource "aws_efs_access_point" "state" {
  file_system_id = aws_efs_file_system.state.id

  posix_user {
    uid = var.container_uid
    gid = var.container_gid
  }

  root_directory {
    path = "/signer"

    creation_info {
      owner_uid   = var.container_uid
      owner_gid   = var.container_gid
      permissions = "0750"
    }
  }

  tags = { Name = "${var.name}-signer-${var.deployer_slug}-state", Deployer = var.deployer_id }
}

data "aws_iam_policy_document" "efs" {
  statement {
    sid       = "SignerThroughAccessPointOnly"
    effect    = "Allow"
    actions   = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    resources = [aws_efs_file_system.state.arn]

    principals {
      type        = "AWS"
      identifiers = [aws_iam_role.signer.arn]
    }

    condition {
      test     = "StringEquals"
      variable = "elasticfilesystem:AccessPointArn"
      values   = [aws_efs_access_point.state.arn]
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
    resources = [aws_efs_file_system.state.arn]

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

resource "aws_efs_file_system_policy" "state" {
  file_system_id = aws_efs_file_system.state.id
  policy         = data.aws_iam_policy_document.efs.json
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

  # ECS reports task health to Cloud Map (the threshold is fixed at 1 by AWS).
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
    name = "state"

    efs_volume_configuration {
      file_system_id     = aws_efs_file_system.state.id
      transit_encryption = "ENABLED"

      authorization_config {
        access_point_id = aws_efs_access_point.state.id
        iam             = "ENABLED"
      }
    }
  }

  tags = { Deployer = var.deployer_id }
}

resource "aws_ecs_service" "signer" {
  name             = "signer-${var.deployer_slug}"
  cluster          = var.cluster_arn
  task_definition  = aws_ecs_task_definition.signer.arn
  desired_count    = 1
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  # One signer per deployer, never two at once (open grants are single-use).
  deployment_minimum_healthy_percent = 0
  deployment_maximum_percent         = 100

  # A shell in this task could sign with the deployer's key.
  enable_execute_command  = false
  enable_ecs_managed_tags = true
  propagate_tags          = "SERVICE"

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  network_configuration {
    subnets          = [var.subnet_id]
    security_groups  = [var.security_group_id]
    assign_public_ip = false
  }

  service_registries {
    registry_arn = aws_service_discovery_service.signer.arn
  }

  tags = { Deployer = var.deployer_id }

  depends_on = [aws_efs_mount_target.state, aws_efs_file_system_policy.state, aws_iam_role_policy.task_efs]
}
