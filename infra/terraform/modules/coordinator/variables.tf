variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "region" {
  description = "AWS region (for the log driver and the SDK inside the task)."
  type        = string
}

variable "image" {
  description = "The countersign container image (ECR URI pinned by tag or digest)."
  type        = string
}

variable "ecr_repository_arn" {
  description = "ARN of the ECR repository holding the image; the execution role may pull only from it."
  type        = string
}

variable "cpu_architecture" {
  description = "CPU architecture of the task (X86_64 or ARM64)."
  type        = string
}

variable "cpu" {
  description = "Fargate CPU units of the coordinator task."
  type        = number
}

variable "memory" {
  description = "Memory (MiB) of the coordinator task."
  type        = number
}

variable "container_uid" {
  description = "Non-root user id the container runs as; owns the registry directory on EFS."
  type        = number
}

variable "container_gid" {
  description = "Group id the container runs as."
  type        = number
}

variable "ports" {
  description = "gRPC and metrics ports of the three daemons."
  type = object({
    coordinator         = number
    signer              = number
    verifier            = number
    coordinator_metrics = number
    signer_metrics      = number
    verifier_metrics    = number
  })
}

variable "cluster_arn" {
  description = "ECS cluster the service runs in."
  type        = string
}

variable "namespace_id" {
  description = "Private DNS namespace the coordinator registers in as 'coordinator'."
  type        = string
}

variable "subnet_ids" {
  description = "The three private subnets (the task may run in any; EFS has a mount target in each)."
  type        = list(string)
}

variable "security_group_id" {
  description = "Security group of the coordinator task."
  type        = string
}

variable "efs_security_group_id" {
  description = "Security group of the EFS mount targets (null when the registry is in PostgreSQL)."
  type        = string
  default     = null
}

variable "kms_key_arn" {
  description = "Data-at-rest KMS key (EFS, log group, TLS secret)."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the coordinator's log group in days."
  type        = number
}

variable "operator_public_key" {
  description = "Operator (admission authority) public key the coordinator checks registry statements against."
  type        = string
}

variable "registry_backend" {
  description = "Where the append-only registry log lives: 'efs' (encrypted EFS) or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["efs", "postgresql"], var.registry_backend)
    error_message = "registry_backend must be 'efs' or 'postgresql'."
  }
}

variable "postgres" {
  description = "PostgreSQL connection (address, port, database, username, password_secret ARN, secret_kms_key_arn) when registry_backend is 'postgresql'; null otherwise."
  type = object({
    address            = string
    port               = number
    database           = string
    username           = string
    password_secret    = string
    secret_kms_key_arn = string
  })
  default = null

  validation {
    condition     = var.registry_backend == "efs" || var.postgres != null
    error_message = "postgres must be set when registry_backend is 'postgresql'."
  }
}
