variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "region" {
  description = "AWS region; used in the VPC endpoint service names."
  type        = string
}

variable "vpc_cidr" {
  description = "IPv4 CIDR block of the VPC; each private subnet takes one quarter of it."
  type        = string
}

variable "availability_zones" {
  description = "Exactly three distinct availability zones, one private subnet in each."
  type        = list(string)

  validation {
    condition     = length(var.availability_zones) == 3 && length(distinct(var.availability_zones)) == 3
    error_message = "Exactly three distinct availability zones are required."
  }
}

variable "kms_key_arn" {
  description = "KMS key that encrypts the VPC flow log group."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the VPC flow log group in days."
  type        = number
}

variable "interface_endpoint_services" {
  description = "AWS services reached through interface VPC endpoints, so that no NAT or internet gateway is needed."
  type        = list(string)
  default     = ["kms", "logs", "ecr.api", "ecr.dkr", "secretsmanager"]
}
