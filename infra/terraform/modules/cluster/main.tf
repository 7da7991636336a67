# The ECS cluster (Fargate only), the private DNS namespace the services register in, and an
# optional ECR repository for the one countersign image.

resource "aws_cloudwatch_log_group" "exec_audit" {
  name              = "/countersign/${var.name}/ecs-exec-audit"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  # ECS Exec is switched off on every service (a shell in a signer task could use its key);
  # should an operator ever enable it, sessions are encrypted and audited.
  configuration {
    execute_command_configuration {
      kms_key_id = var.kms_key_arn
      logging    = "OVERRIDE"

      log_configuration {
        cloud_watch_encryption_enabled = true
        cloud_watch_log_group_name     = aws_cloudwatch_log_group.exec_audit.name
      }
    }
  }
}

resource "aws_ecs_cluster_capacity_providers" "this" {
  cluster_name       = aws_ecs_cluster.this.name
  capacity_providers = ["FARGATE"]

  default_capacity_provider_strategy {
    capacity_provider = "FARGATE"
    weight            = 1
  }
}

resource "aws_service_discovery_private_dns_namespace" "this" {
  name        = var.service_discovery_namespace
  description = "Countersign services of ${var.name}"
  vpc         = var.vpc_id
}

resource "aws_ecr_repository" "countersign" {
  count = var.create_ecr_repository ? 1 : 0

  name                 = "${var.name}/countersign"
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = var.kms_key_arn
  }
}

resource "aws_ecr_lifecycle_policy" "countersign" {
  count = var.create_ecr_repository ? 1 : 0

  repository = aws_ecr_repository.countersign[0].name
  policy = jsonencode({
    rules = [
      {
        rulePriority = 1
        description  = "Expire untagged images after 14 days"
        selection = {
          tagStatus   = "untagged"
          countType   = "sinceImagePushed"
          countUnit   = "days"
          countNumber = 14
        }
        action = { type = "expire" }
      },
    ]
  })
}
