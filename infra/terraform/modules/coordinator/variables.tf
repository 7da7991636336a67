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
  description = "Fargate CPU units of one coordinator task."
  type        = number
}

variable "memory" {
  description = "Memory (MiB) of one coordinator task."
  type        = number
}

variable "desired_count" {
  description = "Coordinator replicas over the one registry log (at least two, in different zones)."
  type        = number

  validation {
    condition     = var.desired_count >= 2
    error_message = "At least two coordinator replicas are needed to survive the loss of one (or of its zone)."
  }
}

variable "refresh_ms" {
  description = "Setting refresh_ms (how often a replica reads what the others appended); null leaves the daemon's default."
  type        = number
  default     = null
}

variable "deletion_protection" {
  description = "Deletion protection of the registry table."
  type        = bool
  default     = true
}

variable "container_uid" {
  description = "Non-root user id the container runs as."
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
  description = "Private DNS namespace the coordinators register in as 'coordinator' (one A record per task)."
  type        = string
}

variable "subnet_ids" {
  description = "The three private subnets, one per availability zone; the replicas spread over them."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) == 3
    error_message = "Exactly three private subnets (three availability zones) are expected."
  }
}

variable "security_group_id" {
  description = "Security group of the coordinator task."
  type        = string
}

variable "kms_key_arn" {
  description = "Data-at-rest KMS key (registry table, log group, TLS secret)."
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
  description = "Where the append-only registry log lives: 'dynamodb' (its own table) or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.registry_backend)
    error_message = "registry_backend must be 'dynamodb' or 'postgresql'."
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
    condition     = var.registry_backend == "dynamodb" || var.postgres != null
    error_message = "postgres must be set when registry_backend is 'postgresql'."
  }
}
