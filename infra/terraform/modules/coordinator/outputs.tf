output "service_name" {
  description = "Name of the coordinators' ECS service."
  value       = aws_ecs_service.coordinator.name
}

output "role_arn" {
  description = "ARN of the coordinator's task role."
  value       = aws_iam_role.task.arn
}

output "tls_secret_arn" {
  description = "Secrets Manager secret to fill with the coordinator's TLS material (JSON keys cert, key, ca)."
  value       = aws_secretsmanager_secret.tls.arn
}

output "registry_table_name" {
  description = "DynamoDB table holding the registry log (null when PostgreSQL holds it)."
  value       = try(aws_dynamodb_table.registry[0].name, null)
}
