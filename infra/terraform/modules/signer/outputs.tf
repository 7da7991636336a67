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

output "state_file_system_id" {
  description = "EFS file system holding this signer's durable state (SQLite and registry copy)."
  value       = aws_efs_file_system.state.id
}
