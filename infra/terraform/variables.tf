# Inputs of the Countersign deployment. Every variable carries a description and,
# where a wrong value would weaken the deployment, a validation block.

variable "name_prefix" {
  description = "Prefix for the names of all resources (lower-case letters, digits and hyphens). Together with environment it makes names unique in the account."
  type        = string
  default     = "countersign"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,11}$", var.name_prefix))
    error_message = "name_prefix must be 2-12 characters of a-z, 0-9 and '-', starting with a letter."
  }
}

variable "environment" {
  description = "Environment name, e.g. prod or staging; part of every resource name and tag."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{1,7}$", var.environment))
    error_message = "environment must be 2-8 characters of a-z and 0-9, starting with a letter."
  }
}

variable "region" {
  description = "AWS region to deploy into, e.g. eu-west-1. The container image must live in an ECR repository of this region (the private subnets have no route to the internet)."
  type        = string

  validation {
    condition     = can(regex("^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-[0-9]$", var.region))
    error_message = "region must look like an AWS region name, e.g. eu-west-1."
  }
}

variable "availability_zones" {
  description = "Exactly three distinct availability zones of the region; one private subnet is created in each, verifier replicas spread across all three."
  type        = list(string)

  validation {
    condition     = length(var.availability_zones) == 3 && length(distinct(var.availability_zones)) == 3
    error_message = "availability_zones must list exactly three distinct availability zones."
  }

  validation {
    condition     = alltrue([for z in var.availability_zones : startswith(z, var.region) && can(regex("^[a-z0-9-]+[a-z]$", z))])
    error_message = "Every availability zone must belong to var.region (e.g. eu-west-1a for eu-west-1)."
  }
}

variable "vpc_cidr" {
  description = "IPv4 CIDR block of the VPC (a private range, /16 to /24). The three private subnets each take one quarter of it."
  type        = string
  default     = "10.40.0.0/16"

  validation {
    condition     = can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/(1[6-9]|2[0-4])$", var.vpc_cidr)) && try(cidrsubnet(var.vpc_cidr, 0, 0) == var.vpc_cidr, false)
    error_message = "vpc_cidr must be an IPv4 network address with a prefix length from /16 to /24, e.g. 10.40.0.0/16."
  }
}

variable "image" {
  description = "The one Countersign container image (all three daemons), as an ECR URI in var.region pinned by a tag other than 'latest' or by digest, e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/countersign@sha256:<64 hex>."
  type        = string

  validation {
    condition     = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|@sha256:[0-9a-f]{64})$", var.image))
    error_message = "image must be an ECR image URI pinned by tag or by @sha256 digest."
  }

  validation {
    condition     = !endswith(var.image, ":latest")
    error_message = "image must not use the mutable 'latest' tag."
  }

  validation {
    condition     = try(split(".", var.image)[3] == var.region, false)
    error_message = "image must come from an ECR registry in var.region: the tasks reach ECR only through this VPC's endpoints."
  }
}

variable "cpu_architecture" {
  description = "CPU architecture of the Fargate tasks; must match the image (X86_64 or ARM64)."
  type        = string
  default     = "X86_64"

  validation {
    condition     = contains(["X86_64", "ARM64"], var.cpu_architecture)
    error_message = "cpu_architecture must be X86_64 or ARM64."
  }
}

variable "container_uid" {
  description = "Numeric non-root user id the containers run as."
  type        = number
  default     = 10001

  validation {
    condition     = var.container_uid >= 1000 && var.container_uid <= 65534 && floor(var.container_uid) == var.container_uid
    error_message = "container_uid must be a non-root integer user id from 1000 to 65534."
  }
}

variable "container_gid" {
  description = "Numeric group id the containers run as."
  type        = number
  default     = 10001

  validation {
    condition     = var.container_gid >= 1000 && var.container_gid <= 65534 && floor(var.container_gid) == var.container_gid
    error_message = "container_gid must be an integer group id from 1000 to 65534."
  }
}

variable "operator_public_key" {
  description = "The admission authority's (operator's) Ed25519 public key that the coordinator, the signers and the verifiers pin (setting operator_public_key): the \"public_key\" value printed by `countersign operator init`, i.e. the unpadded base64url of the 32-byte key (43 characters, no prefix). Public data, passed as an environment variable."
  type        = string

  validation {
    # 32 bytes in canonical unpadded base64url: 42 characters, then one whose low two bits are 0.
    condition     = can(regex("^[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$", var.operator_public_key))
    error_message = "operator_public_key must be the 43-character unpadded base64url Ed25519 public key printed by `countersign operator init` (no 'ed25519:' prefix)."
  }
}

variable "deployers" {
  description = <<-EOT
    One entry per deployer; each gets its own signer service (at least three replicas spread over the
    three availability zones), IAM task role, AWS KMS Ed25519 key and state store. Key: the deployer
    id (as enrolled in the registry). Value:
      allowed_children           - deployer ids this deployer may delegate to; opens signer<->signer gRPC (7401) for each such edge only.
      runtime_cidr_blocks        - IPv4 CIDRs of this deployer's agent runtime that call its signer on 7401 (optional).
      runtime_security_group_ids - security groups of this deployer's agent runtime that call its signer on 7401 (optional).
      desired_count              - signer replicas, at least 3 (optional; 3). ECS spreads them over the three zones.
      cpu, memory                - Fargate size of one signer task (optional; 512 CPU units, 1024 MiB).
      commit_batch               - signer setting commit_batch, writes sharing one PostgreSQL commit, 1-1024 (optional; the daemon's default).
      decide_attempts            - signer setting decide_attempts, 1-100 (optional; the daemon's default).
    zone_index (one zone per signer) is gone: every signer spans the three zones; an entry that still
    sets it is refused.
  EOT
  type = map(object({
    allowed_children           = optional(list(string), [])
    runtime_cidr_blocks        = optional(list(string), [])
    runtime_security_group_ids = optional(list(string), [])
    desired_count              = optional(number, 3)
    cpu                        = optional(number, 512)
    memory                     = optional(number, 1024)
    commit_batch               = optional(number)
    decide_attempts            = optional(number)
    zone_index                 = optional(number)
  }))

  validation {
    condition     = length(var.deployers) >= 1 && length(var.deployers) <= 50
    error_message = "deployers must name from 1 to 50 deployers."
  }

  validation {
    condition     = alltrue([for id in keys(var.deployers) : can(regex("^[a-z0-9][a-z0-9._-]{0,62}$", id))])
    error_message = "Every deployer id must match ^[a-z0-9][a-z0-9._-]{0,62}$."
  }

  validation {
    # The id also names the signer's DNS record (<id>.<namespace>), so it must form a DNS label.
    condition = alltrue([for id in keys(var.deployers) :
      can(regex("[a-z0-9]$", id)) && !contains(["coordinator", "verifier"], id)
    ])
    error_message = "Every deployer id must end with a letter or digit (it becomes a DNS name) and must not be 'coordinator' or 'verifier'."
  }

  validation {
    condition     = length(distinct([for id in keys(var.deployers) : replace(replace(id, ".", "-"), "_", "-")])) == length(var.deployers)
    error_message = "Deployer ids must stay distinct after '.' and '_' are replaced by '-' (the DNS and resource-name form)."
  }

  validation {
    condition     = alltrue([for d in values(var.deployers) : d.zone_index == null])
    error_message = "zone_index is no longer used: each deployer's signer runs desired_count replicas spread over all three availability zones. Remove zone_index from deployers."
  }

  validation {
    condition     = alltrue([for d in values(var.deployers) : d.desired_count >= 3 && d.desired_count <= 60 && floor(d.desired_count) == d.desired_count])
    error_message = "A signer's desired_count must be an integer from 3 to 60 (at least one replica per availability zone)."
  }

  validation {
    condition = alltrue([for d in values(var.deployers) :
      d.commit_batch == null ? true : (d.commit_batch >= 1 && d.commit_batch <= 1024 && floor(d.commit_batch) == d.commit_batch)
    ])
    error_message = "commit_batch must be an integer from 1 to 1024."
  }

  validation {
    condition = alltrue([for d in values(var.deployers) :
      d.decide_attempts == null ? true : (d.decide_attempts >= 1 && d.decide_attempts <= 100 && floor(d.decide_attempts) == d.decide_attempts)
    ])
    error_message = "decide_attempts must be an integer from 1 to 100."
  }

  validation {
    condition = alltrue(flatten([for id, d in var.deployers : [
      for c in d.allowed_children : contains(keys(var.deployers), c) && c != id
    ]]))
    error_message = "allowed_children may only name other deployers declared in var.deployers."
  }

  validation {
    condition = alltrue(flatten([for d in values(var.deployers) : [
      for c in d.runtime_cidr_blocks :
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/([89]|[12][0-9]|3[0-2])$", c)) && try(cidrsubnet(c, 0, 0) == c, false)
    ]]))
    error_message = "runtime_cidr_blocks must be IPv4 network addresses with a prefix length of /8 or longer (0.0.0.0/0 is refused)."
  }

  validation {
    condition = alltrue(flatten([for d in values(var.deployers) : [
      for g in d.runtime_security_group_ids : can(regex("^sg-[0-9a-f]{8,17}$", g))
    ]]))
    error_message = "runtime_security_group_ids must be security group ids (sg-...)."
  }

  validation {
    condition     = alltrue([for d in values(var.deployers) : contains([256, 512, 1024, 2048, 4096], d.cpu) && d.memory >= 512 && d.memory <= 30720])
    error_message = "Signer cpu must be a Fargate size (256, 512, 1024, 2048, 4096) and memory 512-30720 MiB."
  }
}

variable "verifier_count" {
  description = "Number of verifier replicas; at least three so that every availability zone runs one (ECS spreads them across the zones)."
  type        = number
  default     = 3

  validation {
    condition     = var.verifier_count >= 3 && var.verifier_count <= 60 && floor(var.verifier_count) == var.verifier_count
    error_message = "verifier_count must be an integer from 3 to 60."
  }
}

variable "verifier_cpu" {
  description = "Fargate CPU units of one verifier task."
  type        = number
  default     = 512

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096], var.verifier_cpu)
    error_message = "verifier_cpu must be 256, 512, 1024, 2048 or 4096."
  }
}

variable "verifier_memory" {
  description = "Memory (MiB) of one verifier task."
  type        = number
  default     = 1024

  validation {
    condition     = var.verifier_memory >= 512 && var.verifier_memory <= 30720
    error_message = "verifier_memory must be from 512 to 30720 MiB."
  }
}

variable "coordinator_count" {
  description = "Number of coordinator replicas over the one registry log; at least two, so that losing one task or its zone leaves a coordinator (ECS spreads them across the zones)."
  type        = number
  default     = 2

  validation {
    condition     = var.coordinator_count >= 2 && var.coordinator_count <= 10 && floor(var.coordinator_count) == var.coordinator_count
    error_message = "coordinator_count must be an integer from 2 to 10."
  }
}

variable "coordinator_refresh_ms" {
  description = "Coordinator setting refresh_ms: how often each replica reads what the others appended (10-60000). Null leaves the daemon's default."
  type        = number
  default     = null

  validation {
    condition     = var.coordinator_refresh_ms == null ? true : (var.coordinator_refresh_ms >= 10 && var.coordinator_refresh_ms <= 60000 && floor(var.coordinator_refresh_ms) == var.coordinator_refresh_ms)
    error_message = "coordinator_refresh_ms must be an integer from 10 to 60000."
  }
}

variable "coordinator_cpu" {
  description = "Fargate CPU units of one coordinator task."
  type        = number
  default     = 512

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096], var.coordinator_cpu)
    error_message = "coordinator_cpu must be 256, 512, 1024, 2048 or 4096."
  }
}

variable "coordinator_memory" {
  description = "Memory (MiB) of one coordinator task."
  type        = number
  default     = 1024

  validation {
    condition     = var.coordinator_memory >= 512 && var.coordinator_memory <= 30720
    error_message = "coordinator_memory must be from 512 to 30720 MiB."
  }
}

variable "consumer_cidr_blocks" {
  description = "IPv4 CIDRs of the consumers allowed to call VerifyPath on the internal verifier load balancer (TCP 7402). 0.0.0.0/0 is refused."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for c in var.consumer_cidr_blocks :
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/([89]|[12][0-9]|3[0-2])$", c)) && try(cidrsubnet(c, 0, 0) == c, false)
    ])
    error_message = "consumer_cidr_blocks must be IPv4 network addresses with a prefix length of /8 or longer."
  }
}

variable "consumer_security_group_ids" {
  description = "Security groups (in this VPC) of consumers allowed to call the verifier load balancer on TCP 7402."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for g in var.consumer_security_group_ids : can(regex("^sg-[0-9a-f]{8,17}$", g))])
    error_message = "consumer_security_group_ids must be security group ids (sg-...)."
  }
}

variable "operator_cidr_blocks" {
  description = "IPv4 CIDRs from which the operator's tooling submits operator-signed registry statements to the coordinator (TCP 7400). Empty: no operator path. 0.0.0.0/0 is refused."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for c in var.operator_cidr_blocks :
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/([89]|[12][0-9]|3[0-2])$", c)) && try(cidrsubnet(c, 0, 0) == c, false)
    ])
    error_message = "operator_cidr_blocks must be IPv4 network addresses with a prefix length of /8 or longer."
  }
}

variable "operator_security_group_ids" {
  description = "Security groups (in this VPC) of the operator's tooling allowed to reach the coordinator on TCP 7400."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for g in var.operator_security_group_ids : can(regex("^sg-[0-9a-f]{8,17}$", g))])
    error_message = "operator_security_group_ids must be security group ids (sg-...)."
  }
}

variable "metrics_cidr_blocks" {
  description = "IPv4 CIDRs of the Prometheus scrapers allowed to reach the metrics ports (coordinator 9400, signers 9401, verifiers 9402). 0.0.0.0/0 is refused."
  type        = list(string)
  default     = []

  validation {
    condition = alltrue([for c in var.metrics_cidr_blocks :
      can(regex("^([0-9]{1,3}\\.){3}[0-9]{1,3}/([89]|[12][0-9]|3[0-2])$", c)) && try(cidrsubnet(c, 0, 0) == c, false)
    ])
    error_message = "metrics_cidr_blocks must be IPv4 network addresses with a prefix length of /8 or longer."
  }
}

variable "metrics_security_group_ids" {
  description = "Security groups (in this VPC) of the Prometheus scrapers allowed to reach the metrics ports 9400-9402."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for g in var.metrics_security_group_ids : can(regex("^sg-[0-9a-f]{8,17}$", g))])
    error_message = "metrics_security_group_ids must be security group ids (sg-...)."
  }
}

variable "enable_postgres" {
  description = "Create an encrypted, multi-AZ, private PostgreSQL (RDS) instance, for the stores that registry_store_backend, nonce_store_backend and signer_state_backend put there."
  type        = bool
  default     = false
}

variable "registry_store_backend" {
  description = "Where the coordinators keep the registry log: 'dynamodb' (its own table, default) or 'postgresql' (needs enable_postgres = true)."
  type        = string
  default     = "dynamodb"

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.registry_store_backend)
    error_message = "registry_store_backend must be 'dynamodb' or 'postgresql'."
  }

  validation {
    condition     = var.registry_store_backend == "dynamodb" || var.enable_postgres
    error_message = "registry_store_backend = 'postgresql' needs enable_postgres = true."
  }
}

variable "signer_state_backend" {
  description = "Where each deployer's signer replicas keep their shared state: 'dynamodb' (one table per deployer, default) or 'postgresql' (one database and login role per deployer, created by the operator; needs enable_postgres = true)."
  type        = string
  default     = "dynamodb"

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.signer_state_backend)
    error_message = "signer_state_backend must be 'dynamodb' or 'postgresql'."
  }

  validation {
    condition     = var.signer_state_backend == "dynamodb" || var.enable_postgres
    error_message = "signer_state_backend = 'postgresql' needs enable_postgres = true."
  }
}

variable "nonce_store_backend" {
  description = "Durable store of the verifiers: 'dynamodb' (the nonce table, default) or 'postgresql' (needs enable_postgres = true)."
  type        = string
  default     = "dynamodb"

  validation {
    condition     = contains(["dynamodb", "postgresql"], var.nonce_store_backend)
    error_message = "nonce_store_backend must be 'dynamodb' or 'postgresql'."
  }

  validation {
    condition     = var.nonce_store_backend == "dynamodb" || var.enable_postgres
    error_message = "nonce_store_backend = 'postgresql' needs enable_postgres = true."
  }
}

variable "postgres_instance_class" {
  description = "RDS instance class of the optional PostgreSQL instance."
  type        = string
  default     = "db.t4g.medium"

  validation {
    condition     = can(regex("^db\\.[a-z0-9]+\\.[a-z0-9]+$", var.postgres_instance_class))
    error_message = "postgres_instance_class must be an RDS instance class such as db.t4g.medium."
  }
}

variable "postgres_engine_version" {
  description = "PostgreSQL major version of the optional RDS instance (minor versions are upgraded automatically)."
  type        = string
  default     = "17"

  validation {
    condition     = contains(["15", "16", "17"], var.postgres_engine_version)
    error_message = "postgres_engine_version must be 15, 16 or 17."
  }
}

variable "postgres_allocated_storage_gb" {
  description = "Initial storage (GiB) of the optional PostgreSQL instance; it may grow to four times this."
  type        = number
  default     = 20

  validation {
    condition     = var.postgres_allocated_storage_gb >= 20 && var.postgres_allocated_storage_gb <= 1000
    error_message = "postgres_allocated_storage_gb must be from 20 to 1000."
  }
}

variable "kms_admin_principal_arns" {
  description = "IAM principals that administer the signing keys (describe, enable/disable, tag, change policy, schedule deletion) but may NOT sign. Empty means the account root, i.e. IAM policies of this account decide. Must include the principal that runs Terraform."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.kms_admin_principal_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(root|role/.+|user/.+)$", a))])
    error_message = "kms_admin_principal_arns must be IAM role, user or account-root ARNs."
  }
}

variable "service_discovery_namespace" {
  description = "Private DNS namespace (Cloud Map) in the VPC; the coordinators are coordinator.<namespace>, each deployer's signer replicas <deployer-id>.<namespace> (one A record per healthy task)."
  type        = string
  default     = "countersign.internal"

  validation {
    condition     = can(regex("^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\\.)+[a-z]{2,63}$", var.service_discovery_namespace))
    error_message = "service_discovery_namespace must be a lower-case DNS name such as countersign.internal."
  }
}

variable "log_retention_days" {
  description = "Retention of every CloudWatch log group (service logs, VPC flow logs, database logs); at least one year."
  type        = number
  default     = 365

  validation {
    condition     = contains([365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a CloudWatch retention value of at least 365 days."
  }
}

variable "deletion_protection" {
  description = "Deletion protection on the load balancer, the DynamoDB tables (nonces, registry log, signer state) and the database. Turn off only to tear an environment down."
  type        = bool
  default     = true
}

variable "create_ecr_repository" {
  description = "Create the KMS-encrypted, immutable ECR repository <name_prefix>-<environment>/countersign to push the image to."
  type        = bool
  default     = false
}

variable "tags" {
  description = "Extra tags added to every resource."
  type        = map(string)
  default     = {}
}
