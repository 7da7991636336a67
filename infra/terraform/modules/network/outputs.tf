output "vpc_id" {
  description = "ID of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_cidr" {
  description = "CIDR block of the VPC."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "IDs of the three private subnets, in the order of var.availability_zones."
  value       = aws_subnet.private[*].id
}

output "availability_zones" {
  description = "Availability zones of the private subnets, in the same order."
  value       = aws_subnet.private[*].availability_zone
}

output "private_route_table_id" {
  description = "Route table of the private subnets (local routes and gateway endpoints only); add peering or Transit Gateway routes to consumer and agent networks here."
  value       = aws_route_table.private.id
}

output "endpoint_security_group_id" {
  description = "Security group of the interface VPC endpoints (HTTPS 443)."
  value       = aws_security_group.endpoints.id
}

output "s3_prefix_list_id" {
  description = "Prefix list of the S3 gateway endpoint (ECR image layers are served from S3)."
  value       = aws_vpc_endpoint.gateway["s3"].prefix_list_id
}

output "dynamodb_prefix_list_id" {
  description = "Prefix list of the DynamoDB gateway endpoint."
  value       = aws_vpc_endpoint.gateway["dynamodb"].prefix_list_id
}
