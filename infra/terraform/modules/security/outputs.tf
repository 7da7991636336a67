# Every output waits for all rules, so that no task starts before its network paths exist.

output "nlb_security_group_id" {
  description = "Security group of the internal verifier load balancer."
  value       = aws_security_group.nlb.id

  depends_on = [terraform_data.paths_open]
}

output "verifier_security_group_id" {
  description = "Security group of the verifier tasks."
  value       = aws_security_group.verifier.id

  depends_on = [terraform_data.paths_open]
}

output "coordinator_security_group_id" {
  description = "Security group of the coordinator tasks."
  value       = aws_security_group.coordinator.id

  depends_on = [terraform_data.paths_open]
}

output "signer_security_group_ids" {
  description = "Security group of each deployer's signer tasks (all its replicas), by deployer id."
  value       = { for id, sg in aws_security_group.signer : id => sg.id }

  depends_on = [terraform_data.paths_open]
}

output "postgres_security_group_id" {
  description = "Security group of the PostgreSQL instance (null when PostgreSQL is off)."
  value       = try(aws_security_group.postgres[0].id, null)

  depends_on = [terraform_data.paths_open]
}
