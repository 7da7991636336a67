variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "region" {
  description = "AWS region (for the log driver and the SDK inside the task)."
  type        = string
}

variable "deployer_id" {
  description = "Deployer id exactly as enrolled in the registry (^[a-z0-9][a-z0-9._-]{0,62}$)."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", var.deployer_id))
    error_message = "deployer_id must match ^[a-z0-9][a-z0-9._-]{0,62}$."
  }
}

variable "deployer_slug" {
  description = "The deployer id with '.' and '_' replaced by '-': used in DNS and resource names."
  type        = string
}

variable "allowed_children" {
  description = "Deployer ids this deployer may delegate to (passed to the signer's co-signing policy)."
  type        = list(string)
  default     = []
}

variable "operator_public_key" {
  description = "The operator's Ed25519 public key (base64url) the signer pins to verify the registry log."
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
  description = "Fargate CPU units of one signer task."
  type        = number
}

variable "memory" {
  description = "Memory (MiB) of one signer task."
  type        = number
}

variable "desired_count" {
  description = "Signer replicas of this deployer (at least three: one per availability zone)."
  type        = number

  validation {
    condition     = var.desired_count >= 3
    error_message = "At least three signer replicas are needed to cover the three availability zones."
  }
}

variable "commit_batch" {
  description = "Setting commit_batch (writes sharing one PostgreSQL commit); null leaves the daemon's default."
  type        = number
  default     = null
}

variable "decide_attempts" {
  description = "Setting decide_attempts (decisions of one call before STATE_CONFLICT); null leaves the daemon's default."
  type        = number
  default     = null
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
  description = "Private DNS namespace the signer registers in as <deployer_slug>."
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
  description = "This signer's own security group."
  type        = string
}

variable "state_backend" {
  description = "Where this signer's replicas keep their shared state: 'dynamodb' (its own table) or 'postgresql' (its own database)."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.state_backend)
    error_message = "state_backend must be 'dynamodb' or 'postgresql'."
  }
}

variable "postgres" {
  description = "PostgreSQL instance (address, port; the other fields are the master user's and unused here) when state_backend is 'postgresql'; null otherwise."
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
    condition     = var.state_backend == "dynamodb" || var.postgres != null
    error_message = "postgres must be set when state_backend is 'postgresql'."
  }
}

variable "deletion_protection" {
  description = "Deletion protection of the state table."
  type        = bool
  default     = true
}

variable "coordinator_address" {
  description = "host:port of the coordinator's registry service."
  type        = string
}

variable "kms_admin_arns" {
  description = "Principals that administer (but cannot use) the signing key."
  type        = list(string)

  validation {
    condition     = length(var.kms_admin_arns) > 0
    error_message = "At least one key administrator is needed, or the key becomes unmanageable."
  }
}

variable "kms_key_arn" {
  description = "Data-at-rest KMS key (state table, log group, secrets)."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the signer's log group in days."
  type        = number
}
