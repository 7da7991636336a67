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
  description = "Fargate CPU units of the signer task."
  type        = number
}

variable "memory" {
  description = "Memory (MiB) of the signer task."
  type        = number
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

variable "subnet_id" {
  description = "Private subnet (the deployer's availability zone) the signer task runs in."
  type        = string
}

variable "security_group_id" {
  description = "This signer's own security group."
  type        = string
}

variable "efs_security_group_id" {
  description = "Security group of this signer's state EFS mount target (NFS from this signer only)."
  type        = string
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
  description = "Data-at-rest KMS key (log group, TLS secret)."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the signer's log group in days."
  type        = number
}
