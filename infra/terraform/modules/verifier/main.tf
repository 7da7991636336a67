# Verifier replicas, stateless apart from the shared durable store, spread over the three
# availability zones behind an INTERNAL network load balancer. The listener is plain TCP so that
# mTLS runs end to end between consumer and verifier (the NLB never sees plaintext).

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id  = data.aws_caller_identity.current.account_id
  partition   = data.aws_partition.current.partition
  on_dynamodb = var.nonce_store_backend == "dynamodb"

  # collect=scan (the store's default, spelled out): each replica's collector deletes expired
  # nonces and child-set entries itself, in bounded batches, and decrements the parents' counters
  # in the same transaction, which is the behaviour the conformance suite checks against the
  # reference model. DynamoDB's TTL on expires_at still deletes whatever is left. It needs
  # dynamodb:Scan (granted below), which the collector's entry count needs in any case.
  store_url = (
    local.on_dynamodb
    ? "dynamodb://${var.nonce_table_name}?region=${var.region}&collect=scan"
    : "postgresql://${var.postgres.username}@${var.postgres.address}:${var.postgres.port}/${var.postgres.database}?sslmode=require&schema=countersign"
  )

  # The verified copy of the registry log (setting registry_cache), in the task's own storage. A
  # replica has no stable identity in an ECS service, and replicas must not share one file (each
  # rewrites it through the same temporary name), so a new replica fetches the whole log again and
  # verifies every statement under the pinned operator key; until its first fresh heartbeat it
  # answers REGISTRY_STALE (fails closed). See docs/deploy.md.
  registry_cache_dir = "/var/lib/countersign/registry-cache"

  tls_secret_keys = {
    COUNTERSIGN_TLS_CERT_PEM = "cert"
    COUNTERSIGN_TLS_KEY_PEM  = "key"
    COUNTERSIGN_TLS_CA_PEM   = "ca"
  }

  # The database password comes from the RDS-managed secret, never from a plain variable.
  password_secrets = local.on_dynamodb ? [] : [
    { name = "COUNTERSIGN_STORE_PASSWORD", valueFrom = "${var.postgres.password_secret}:password::" },
  ]

  container = {
    name      = "verifier"
    image     = var.image
    essential = true
    # Runs `countersign verifier serve`.
    entryPoint             = ["countersign"]
    command                = ["verifier", "serve"]
    user                   = "${var.container_uid}:${var.container_gid}"
    readonlyRootFilesystem = true
    privileged             = false
    stopTimeout            = 30
    linuxParameters = {
      initProcessEnabled = true
      capabilities       = { add = [], drop = ["ALL"] }
    }
    portMappings = [
      { name = "grpc", containerPort = var.ports.verifier, protocol = "tcp" },
      { name = "metrics", containerPort = var.ports.verifier_metrics, protocol = "tcp" },
    ]
    # Setting names: verifier/daemon.py VerifierConfig (COUNTERSIGN_<SETTING>).
    environment = [
      { name = "COUNTERSIGN_STORE_URL", value = local.store_url },
      { name = "COUNTERSIGN_COORDINATOR", value = var.coordinator_address },
      { name = "COUNTERSIGN_OPERATOR_PUBLIC_KEY", value = var.operator_public_key },
      { name = "COUNTERSIGN_REGISTRY_CACHE", value = "${local.registry_cache_dir}/registry.json" },
      { name = "COUNTERSIGN_LISTEN", value = "0.0.0.0:${var.ports.verifier}" },
      { name = "COUNTERSIGN_METRICS_LISTEN", value = "0.0.0.0:${var.ports.verifier_metrics}" },
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
    mountPoints = [
      { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
      { sourceVolume = "registry-cache", containerPath = local.registry_cache_dir, readOnly = false },
    ]
    # grpc.health.v1 over the verifier's own mTLS material (docker/healthcheck.py in the image);
    # the NLB's own health check stays a TCP check.
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
        awslogs-group         = aws_cloudwatch_log_group.verifier.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "verifier"
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
  name                 = "${var.name}-verifier"
  description          = "Task role of the verifiers: the nonce table and nothing else (no KMS signing)"
  assume_role_policy   = data.aws_iam_policy_document.ecs_tasks_assume.json
  max_session_duration = 3600
}

data "aws_iam_policy_document" "task_nonce_table" {
  count = local.on_dynamodb ? 1 : 0

  statement {
    sid    = "NonceTableItems"
    effect = "Allow"
    actions = [
      # BatchGetItem, BatchWriteItem: the verdict log (verifier/stores/dynamodb.py).
      "dynamodb:BatchGetItem",
      "dynamodb:BatchWriteItem",
      "dynamodb:ConditionCheckItem",
      "dynamodb:DeleteItem",
      "dynamodb:DescribeTable",
      "dynamodb:GetItem",
      "dynamodb:PutItem",
      "dynamodb:Query",
      "dynamodb:UpdateItem",
    ]
    resources = [var.nonce_table_arn]
  }

  statement {
    # collect=scan: the collector's bounded, resumable Scan for expired items, and entry_count
    # (the countersign_store_entries gauge) after each collection round.
    sid       = "NonceTableCollectorScan"
    effect    = "Allow"
    actions   = ["dynamodb:Scan"]
    resources = [var.nonce_table_arn]
  }

  statement {
    sid       = "NonceTableEncryptionThroughDynamoDB"
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

resource "aws_iam_role_policy" "task_nonce_table" {
  count = local.on_dynamodb ? 1 : 0

  name   = "nonce-table"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.task_nonce_table[0].json
}

resource "aws_iam_role" "execution" {
  name               = "${var.name}-verifier-exec"
  description        = "ECS execution role of the verifiers (image pull, logs, secrets)"
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
    resources = ["${aws_cloudwatch_log_group.verifier.arn}:*"]
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
# TLS secret and logs
# ---------------------------------------------------------------------------------------------

resource "aws_secretsmanager_secret" "tls" {
  #checkov:skip=CKV2_AWS_57:Holds mTLS certificate material issued by the deployment's PKI; it is rotated by writing a new secret version when the certificate is re-issued, there is no rotation Lambda to attach.
  name                    = "${var.name}/tls/verifier"
  description             = "mTLS material of the verifiers: JSON with keys cert, key, ca (PEM)"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = 30
}

resource "aws_cloudwatch_log_group" "verifier" {
  name              = "/countersign/${var.name}/verifier"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

# ---------------------------------------------------------------------------------------------
# Internal network load balancer (TCP 7402, health-checked targets in all three zones)
# ---------------------------------------------------------------------------------------------

resource "aws_lb" "verifier" {
  #checkov:skip=CKV_AWS_91:An NLB writes access logs only for TLS listeners; this listener is TCP pass-through so that mTLS terminates in the verifier. Connections are recorded by the VPC flow logs and every verdict by the verifier's own logs.
  name                             = "${var.name}-verifier"
  internal                         = true
  load_balancer_type               = "network"
  ip_address_type                  = "ipv4"
  subnets                          = var.subnet_ids
  security_groups                  = [var.nlb_security_group_id]
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.deletion_protection

  enforce_security_group_inbound_rules_on_private_link_traffic = "on"
}

resource "aws_lb_target_group" "verifier" {
  name                 = "${var.name}-vrf-grpc"
  port                 = var.ports.verifier
  protocol             = "TCP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 30
  # Verifiers see the NLB's addresses, so their security group admits only the NLB's group.
  preserve_client_ip = false

  health_check {
    enabled             = true
    protocol            = "TCP"
    port                = "traffic-port"
    interval            = 10
    timeout             = 5
    healthy_threshold   = 3
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "grpc" {
  load_balancer_arn = aws_lb.verifier.arn
  port              = var.ports.verifier
  protocol          = "TCP"

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.verifier.arn
  }
}

# ---------------------------------------------------------------------------------------------
# Task definition and service
# ---------------------------------------------------------------------------------------------

resource "aws_ecs_task_definition" "verifier" {
  family                   = "${var.name}-verifier"
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

  volume {
    name = "registry-cache"
  }
}

resource "aws_ecs_service" "verifier" {
  name             = "verifier"
  cluster          = var.cluster_arn
  task_definition  = aws_ecs_task_definition.verifier.arn
  desired_count    = var.desired_count
  launch_type      = "FARGATE"
  platform_version = "LATEST"

  # ECS spreads Fargate tasks over the subnets' zones; rebalancing keeps them spread.
  availability_zone_rebalancing      = "ENABLED"
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  health_check_grace_period_seconds  = 30

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

  load_balancer {
    target_group_arn = aws_lb_target_group.verifier.arn
    container_name   = "verifier"
    container_port   = var.ports.verifier
  }

  depends_on = [aws_lb_listener.grpc]
}
