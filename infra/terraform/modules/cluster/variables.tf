variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "vpc_id" {
  description = "VPC of the private DNS namespace."
  type        = string
}

variable "service_discovery_namespace" {
  description = "Name of the private DNS namespace for service discovery, e.g. countersign.internal."
  type        = string
}

variable "kms_key_arn" {
  description = "KMS key for ECS Exec session data, the ECS Exec audit log group and the ECR repository."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the ECS Exec audit log group in days."
  type        = number
}

variable "create_ecr_repository" {
  description = "Create an immutable, KMS-encrypted ECR repository for the countersign image."
  type        = bool
  default     = false
}
