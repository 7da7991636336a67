variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "region" {
  description = "AWS region (for the store URL, the log driver and the SDK inside the task)."
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
  description = "CPU architecture of the tasks (X86_64 or ARM64)."
  type        = string
}

variable "cpu" {
  description = "Fargate CPU units of one verifier task."
  type        = number
}

variable "memory" {
  description = "Memory (MiB) of one verifier task."
  type        = number
}

variable "desired_count" {
  description = "Number of verifier replicas (at least three: one per availability zone)."
  type        = number

  validation {
    condition     = var.desired_count >= 3
    error_message = "At least three verifier replicas are needed to cover the three availability zones."
  }
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

variable "vpc_id" {
  description = "VPC of the target group."
  type        = string
}

variable "cluster_arn" {
  description = "ECS cluster the service runs in."
  type        = string
}

variable "subnet_ids" {
  description = "The three private subnets; the NLB has a node in each and the replicas spread over them."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) == 3
    error_message = "Exactly three private subnets (three availability zones) are expected."
  }
}

variable "security_group_id" {
  description = "Security group of the verifier tasks."
  type        = string
}

variable "nlb_security_group_id" {
  description = "Security group of the internal network load balancer."
  type        = string
}

variable "coordinator_address" {
  description = "host:port of the coordinator's registry service."
  type        = string
}

variable "operator_public_key" {
  description = "Operator (admission authority) public key the verifiers pin."
  type        = string
}

variable "kms_key_arn" {
  description = "Data-at-rest KMS key (log group, TLS secret, nonce table)."
  type        = string
}

variable "log_retention_days" {
  description = "Retention of the verifiers' log group in days."
  type        = number
}

variable "deletion_protection" {
  description = "Deletion protection of the load balancer."
  type        = bool
  default     = true
}

variable "nonce_store_backend" {
  description = "Durable store: 'dynamodb' (nonce table) or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.nonce_store_backend)
    error_message = "nonce_store_backend must be 'dynamodb' or 'postgresql'."
  }
}

variable "nonce_table_name" {
  description = "Name of the DynamoDB nonce table."
  type        = string
}

variable "nonce_table_arn" {
  description = "ARN of the DynamoDB nonce table."
  type        = string
}

variable "postgres" {
  description = "PostgreSQL connection (address, port, database, username, password_secret ARN, secret_kms_key_arn) when nonce_store_backend is 'postgresql'; may be null otherwise."
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
    condition     = var.nonce_store_backend == "dynamodb" || var.postgres != null
    error_message = "postgres must be set when nonce_store_backend is 'postgresql'."
  }
}
