# Second checkov pass (see infra/tools.mk and tests/infra): checkov drops resources whose
# count evaluates to 0 with the defaults, so this file switches every optional part on (ECR
# repository; PostgreSQL for the registry log, the nonce store and the signers' state; the
# optional tuning settings) to have them scanned too.
environment        = "ci"
region             = "eu-west-1"
availability_zones = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
image              = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/countersign@sha256:0000000000000000000000000000000000000000000000000000000000000000"

operator_public_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

deployers = {
  "deployer-a" = { allowed_children = ["deployer-b", "deployer-c"], runtime_cidr_blocks = ["10.50.0.0/24"], desired_count = 6, commit_batch = 128 }
  "deployer-b" = { allowed_children = ["deployer-c"], runtime_security_group_ids = ["sg-0123456789abcdef0"], decide_attempts = 16 }
  "deployer-c" = {}
}

consumer_cidr_blocks        = ["10.50.0.0/16"]
consumer_security_group_ids = ["sg-0123456789abcdef1"]
operator_cidr_blocks        = ["10.70.0.0/28"]
operator_security_group_ids = ["sg-0123456789abcdef3"]
metrics_cidr_blocks         = ["10.60.0.0/24"]
metrics_security_group_ids  = ["sg-0123456789abcdef2"]

coordinator_count      = 3
coordinator_refresh_ms = 500

create_ecr_repository  = true
enable_postgres        = true
nonce_store_backend    = "postgresql"
registry_store_backend = "postgresql"
signer_state_backend   = "postgresql"
