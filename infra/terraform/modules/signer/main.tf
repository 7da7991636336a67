# One deployer's signer: its own IAM task role, its own AWS KMS Ed25519 key (which only that
# role may use to sign), its TLS secret, and one Fargate task in the deployer's availability zone.

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
        Sid       = "OnlyThisDeployersSignerSigns"
        Effect    = "Allow"
        Principal = { AWS = aws_iam_role.signer.arn }
        Action    = ["kms:Sign", "kms:GetPublicKey", "kms:DescribeKey"]
        Resource  = "*"
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
    environment = [
      { name = "COUNTERSIGN_DEPLOYER", value = var.deployer_id },
      { name = "COUNTERSIGN_SIGNER_KEY", value = "awskms:${aws_kms_key.signer.arn}" },
      { name = "COUNTERSIGN_COORDINATOR", value = var.coordinator_address },
      { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.signer}" },
      { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.signer_metrics}" },
      { name = "COUNTERSIGN_ALLOWED_CHILDREN", value = join(",", var.allowed_children) },
      { name = "COUNTERSIGN_PEER_SIGNERS", value = join(",", [for id, addr in var.peer_addresses : "${id}=${addr}"]) },
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
    ]
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
}
