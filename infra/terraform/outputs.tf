output "verifier_nlb_dns_name" {
  description = "DNS name of the internal network load balancer in front of the verifiers."
  value       = module.verifier.nlb_dns_name
}

output "verifier_endpoint" {
  description = "gRPC endpoint consumers call VerifyPath on (host:port)."
  value       = "${module.verifier.nlb_dns_name}:${local.ports.verifier}"
}

output "coordinator_address" {
  description = "gRPC address of the coordinators' registry service inside the VPC (host:port; the name resolves to every healthy coordinator task)."
  value       = local.coordinator_address
}

output "signer_addresses" {
  description = "gRPC address of each deployer's signer replicas inside the VPC (host:port; the name resolves to every healthy replica), by deployer id."
  value       = { for id in keys(module.signer) : id => local.signer_addresses[id] }
}

output "signer_state_tables" {
  description = "DynamoDB table holding each deployer's signer state, by deployer id (empty when signer_state_backend is 'postgresql')."
  value       = { for id, signer in module.signer : id => signer.state_table_name if signer.state_table_name != null }
}

output "signer_state_postgres" {
  description = "With signer_state_backend = 'postgresql': per deployer id, the database and login role to create and the secret to fill with its password (see README.md); empty otherwise."
  value       = { for id, signer in module.signer : id => signer.state_postgres if signer.state_postgres != null }
}

output "registry_table_name" {
  description = "DynamoDB table holding the registry log (null when registry_store_backend is 'postgresql')."
  value       = module.coordinator.registry_table_name
}

output "signer_kms_key_arns" {
  description = "ARN of each deployer's Ed25519 signing key (COUNTERSIGN_SIGNER_KEY=awskms:<arn>), by deployer id."
  value       = { for id, signer in module.signer : id => signer.kms_key_arn }
}

output "signer_role_arns" {
  description = "ARN of each deployer's signer task role, the only principal allowed to sign with that deployer's key."
  value       = { for id, signer in module.signer : id => signer.role_arn }
}

output "nonce_table_name" {
  description = "Name of the DynamoDB nonce table."
  value       = module.nonce_store.table_name
}

output "postgres_endpoint" {
  description = "host:port of the optional PostgreSQL instance (null when enable_postgres is false)."
  value       = var.enable_postgres ? module.postgres[0].endpoint : null
}

output "tls_secret_arns" {
  description = "Secrets Manager secrets to fill with TLS material (JSON keys cert, key, ca) before the services can start."
  value = merge(
    {
      coordinator = module.coordinator.tls_secret_arn
      verifier    = module.verifier.tls_secret_arn
    },
    { for id, signer in module.signer : "signer:${id}" => signer.tls_secret_arn },
  )
}

output "ecs_cluster_name" {
  description = "Name of the ECS cluster."
  value       = module.cluster.cluster_name
}

output "ecr_repository_url" {
  description = "URL of the ECR repository (null unless create_ecr_repository is true)."
  value       = module.cluster.ecr_repository_url
}

output "vpc_id" {
  description = "ID of the VPC."
  value       = module.network.vpc_id
}

output "private_route_table_id" {
  description = "Route table of the private subnets; routes to peered consumer / agent networks go here."
  value       = module.network.private_route_table_id
}

output "private_subnet_ids" {
  description = "IDs of the three private subnets, one per availability zone."
  value       = module.network.private_subnet_ids
}
