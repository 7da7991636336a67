variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "subnet_ids" {
  description = "The three private subnets the instance (and its standby) may live in."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) == 3
    error_message = "Exactly three private subnets are expected."
  }
}

variable "security_group_id" {
  description = "Security group of the instance (5432 from the coordinator and, optionally, the verifiers)."
  type        = string
}

variable "kms_key_arn" {
  description = "KMS key for storage, Performance Insights, the master password secret and the database log groups."
  type        = string
}

variable "instance_class" {
  description = "RDS instance class."
  type        = string
}

variable "engine_version" {
  description = "PostgreSQL major version (15, 16 or 17)."
  type        = string
}

variable "allocated_storage_gb" {
  description = "Initial storage in GiB; autoscaling may grow it to four times this."
  type        = number
}

variable "deletion_protection" {
  description = "Protect the instance from deletion."
  type        = bool
  default     = true
}

variable "log_retention_days" {
  description = "Retention of the exported database log groups in days."
  type        = number
}

variable "database_name" {
  description = "Name of the database created on the instance."
  type        = string
}

variable "master_username" {
  description = "Master user name; its password is generated and kept by RDS in Secrets Manager."
  type        = string
}
