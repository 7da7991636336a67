output "kms_key_arn" {
  description = "ARN of this deployer's Ed25519 signing key."
  value       = aws_kms_key.signer.arn
}

output "kms_key_alias" {
  description = "Alias of this deployer's signing key."
  value       = aws_kms_alias.signer.name
}

output "role_arn" {
  description = "ARN of the signer's task role, the only principal allowed to sign with the key."
  value       = aws_iam_role.signer.arn
}

output "service_name" {
  description = "Name of the signer's ECS service."
  value       = aws_ecs_service.signer.name
}

output "tls_secret_arn" {
  description = "Secrets Manager secret to fill with this signer's TLS material (JSON keys cert, key, ca)."
  value       = aws_secretsmanager_secret.tls.arn
}

output "state_table_name" {
  description = "DynamoDB table holding this signer's shared state (null when it is on PostgreSQL)."
  value       = try(aws_dynamodb_table.state[0].name, null)
}

output "state_table_arn" {
  description = "ARN of this signer's state table; only its task role may use it (null on PostgreSQL)."
  value       = try(aws_dynamodb_table.state[0].arn, null)
}

output "state_postgres" {
  description = "On PostgreSQL: the database and login role (same name) to create for this signer, and the secret to fill with the role's password (JSON key password); null on DynamoDB."
  value = local.on_dynamodb ? null : {
    database        = local.postgres_name
    role            = local.postgres_name
    password_secret = aws_secretsmanager_secret.state_password[0].arn
  }
}
