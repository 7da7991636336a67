# The symmetric customer-managed key that encrypts data at rest: the nonce table, log groups,
# secrets, EFS, RDS, ECR and ECS Exec sessions. The Ed25519 signing keys are separate
# (one per deployer, in modules/signer) and never encrypt anything.

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  key_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        # Usage of this data key is delegated to IAM policies of this account (services such
        # as DynamoDB, RDS and EFS act for the caller through grants).
        Sid       = "AccountIAMPoliciesDecide"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "CloudWatchLogsEncryptsThisAccountsLogGroups"
        Effect    = "Allow"
        Principal = { Service = "logs.${var.region}.amazonaws.com" }
        Action = [
          "kms:Encrypt",
          "kms:Decrypt",
          "kms:ReEncrypt*",
          "kms:GenerateDataKey*",
          "kms:DescribeKey",
        ]
        Resource = "*"
        Condition = {
          ArnLike = {
            "kms:EncryptionContext:aws:logs:arn" = "arn:${local.partition}:logs:${var.region}:${local.account_id}:log-group:*"
          }
        }
      },
    ]
  }
}

resource "aws_kms_key" "data" {
  description              = "${var.name}: encryption at rest for Countersign data (nonce table, logs, secrets, EFS, RDS)"
  key_usage                = "ENCRYPT_DECRYPT"
  customer_master_key_spec = "SYMMETRIC_DEFAULT"
  enable_key_rotation      = true
  rotation_period_in_days  = 365
  deletion_window_in_days  = 30
  is_enabled               = true
  policy                   = jsonencode(local.key_policy)
}

resource "aws_kms_alias" "data" {
  name          = "alias/${var.name}/data"
  target_key_id = aws_kms_key.data.key_id
}
