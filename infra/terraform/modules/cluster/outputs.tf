output "cluster_arn" {
  description = "ARN of the ECS cluster."
  value       = aws_ecs_cluster.this.arn
}

output "cluster_name" {
  description = "Name of the ECS cluster."
  value       = aws_ecs_cluster.this.name
}

output "namespace_id" {
  description = "ID of the private DNS namespace."
  value       = aws_service_discovery_private_dns_namespace.this.id
}

output "namespace_name" {
  description = "Name of the private DNS namespace."
  value       = aws_service_discovery_private_dns_namespace.this.name
}

output "ecr_repository_url" {
  description = "URL of the ECR repository (null when not created)."
  value       = try(aws_ecr_repository.countersign[0].repository_url, null)
}
