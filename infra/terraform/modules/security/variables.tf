variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "vpc_id" {
  description = "VPC the security groups belong to."
  type        = string
}

variable "ports" {
  description = "gRPC and metrics ports of the three daemons (coordinator 7400/9400, signer 7401/9401, verifier 7402/9402)."
  type = object({
    coordinator         = number
    signer              = number
    verifier            = number
    coordinator_metrics = number
    signer_metrics      = number
    verifier_metrics    = number
  })
}

variable "deployers" {
  description = "Deployers by id, with the networks of their agent runtimes that may call their signer."
  type = map(object({
    runtime_cidr_blocks        = list(string)
    runtime_security_group_ids = list(string)
  }))
}

variable "delegation_edges" {
  description = "Declared delegation edges (parent deployer id -> child deployer id); signer-to-signer traffic is opened for these pairs only."
  type = list(object({
    parent = string
    child  = string
  }))
  default = []
}

variable "consumer_cidr_blocks" {
  description = "IPv4 CIDRs allowed to call the verifier load balancer (validated by the root module: never 0.0.0.0/0)."
  type        = list(string)
  default     = []
}

variable "consumer_security_group_ids" {
  description = "Security groups allowed to call the verifier load balancer."
  type        = list(string)
  default     = []
}

variable "operator_cidr_blocks" {
  description = "IPv4 CIDRs of the operator's tooling allowed to reach the coordinator (validated by the root module)."
  type        = list(string)
  default     = []
}

variable "operator_security_group_ids" {
  description = "Security groups of the operator's tooling allowed to reach the coordinator."
  type        = list(string)
  default     = []
}

variable "metrics_cidr_blocks" {
  description = "IPv4 CIDRs of Prometheus scrapers allowed on the metrics ports."
  type        = list(string)
  default     = []
}

variable "metrics_security_group_ids" {
  description = "Security groups of Prometheus scrapers allowed on the metrics ports."
  type        = list(string)
  default     = []
}

variable "endpoint_security_group_id" {
  description = "Security group of the interface VPC endpoints; the services may send HTTPS to it."
  type        = string
}

variable "s3_prefix_list_id" {
  description = "Prefix list of the S3 gateway endpoint (ECR layers)."
  type        = string
}

variable "dynamodb_prefix_list_id" {
  description = "Prefix list of the DynamoDB gateway endpoint (nonce, registry and signer state tables)."
  type        = string
}

variable "postgres_enabled" {
  description = "Whether the optional PostgreSQL instance exists (its security group is created with it)."
  type        = bool
}

variable "registry_store_backend" {
  description = "Where the coordinators keep the registry log: 'dynamodb' or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.registry_store_backend)
    error_message = "registry_store_backend must be 'dynamodb' or 'postgresql'."
  }
}

variable "signer_state_backend" {
  description = "Where each deployer's signer replicas keep their state: 'dynamodb' or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.signer_state_backend)
    error_message = "signer_state_backend must be 'dynamodb' or 'postgresql'."
  }
}

variable "nonce_store_backend" {
  description = "Durable store of the verifiers: 'dynamodb' or 'postgresql'."
  type        = string

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.nonce_store_backend)
    error_message = "nonce_store_backend must be 'dynamodb' or 'postgresql'."
  }
}
