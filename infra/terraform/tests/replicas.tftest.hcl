# `terraform test` with a mocked AWS provider: Terraform evaluates the whole configuration (every
# count, for_each, conditional and module input) and "applies" it in memory, with no AWS account
# and no credentials; only the provider's schema is needed. Run it with the inputs to check:
#
#   terraform test -var-file=terraform.tfvars.example
#   terraform test -var-file=../checkov-all-features.tfvars
#
# tests/infra runs both (test_infra_tools.py). The assertions hold for any valid inputs.

mock_provider "aws" {
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }

  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }

  # The generated JSON of a policy document is not inspected here (tests/infra reads the HCL).
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }

  # The provider checks that these attributes hold ARNs: mocked resources get well-formed ones.
  mock_resource "aws_cloudwatch_log_group" {
    defaults = { arn = "arn:aws:logs:eu-west-1:123456789012:log-group:mocked" }
  }

  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/mocked" }
  }

  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000" }
  }

  # RDS fills master_user_secret when it manages the password; the services read its ARN.
  mock_resource "aws_db_instance" {
    defaults = {
      master_user_secret = [{
        kms_key_id    = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000"
        secret_arn    = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:rds-mocked"
        secret_status = "active"
      }]
    }
  }

  mock_resource "aws_service_discovery_service" {
    defaults = { arn = "arn:aws:servicediscovery:eu-west-1:123456789012:service/srv-mocked" }
  }

  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/net/mocked/0123456789abcdef" }
  }

  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/mocked/0123456789abcdef" }
  }
}

# The whole deployment with the given inputs.
run "deployment" {
  command = apply

  assert {
    condition     = length(output.signer_addresses) == length(var.deployers) && length(distinct(values(output.signer_addresses))) == length(var.deployers)
    error_message = "every deployer needs its own signer address (one DNS name for all its replicas)"
  }

  assert {
    condition = (
      var.signer_state_backend == "dynamodb"
      ? length(output.signer_state_tables) == length(var.deployers) && length(distinct(values(output.signer_state_tables))) == length(var.deployers) && length(output.signer_state_postgres) == 0
      : length(output.signer_state_postgres) == length(var.deployers) && length(distinct([for p in values(output.signer_state_postgres) : p.database])) == length(var.deployers) && length(output.signer_state_tables) == 0
    )
    error_message = "every deployer needs its own state store (a table, or a database and role), shared by no one"
  }

  assert {
    condition     = (output.registry_table_name != null) == (var.registry_store_backend == "dynamodb")
    error_message = "the registry log lives in its own table exactly when registry_store_backend is dynamodb"
  }

  assert {
    condition     = length(output.private_subnet_ids) == 3
    error_message = "three private subnets, one per zone"
  }
}

# One deployer's signer module on its own, so that its evaluated resources can be read.
run "signer_replicas" {
  command = apply

  module {
    source = "./modules/signer"
  }

  variables {
    name                = "countersign-test"
    region              = "eu-west-1"
    deployer_id         = "deployer.a"
    deployer_slug       = "deployer-a"
    allowed_children    = ["deployer-b"]
    operator_public_key = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    image               = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/countersign:1.0.0"
    ecr_repository_arn  = "arn:aws:ecr:eu-west-1:123456789012:repository/countersign"
    cpu_architecture    = "X86_64"
    cpu                 = 512
    memory              = 1024
    desired_count       = 3
    container_uid       = 10001
    container_gid       = 10001
    ports               = { coordinator = 7400, signer = 7401, verifier = 7402, coordinator_metrics = 9400, signer_metrics = 9401, verifier_metrics = 9402 }
    cluster_arn         = "arn:aws:ecs:eu-west-1:123456789012:cluster/countersign-test"
    namespace_id        = "ns-0123456789abcdef"
    subnet_ids          = ["subnet-0a", "subnet-0b", "subnet-0c"]
    security_group_id   = "sg-0123456789abcdef0"
    coordinator_address = "coordinator.countersign.internal:7400"
    kms_admin_arns      = ["arn:aws:iam::123456789012:root"]
    kms_key_arn         = "arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000"
    log_retention_days  = 365
    state_backend       = "dynamodb"
  }

  assert {
    condition     = aws_ecs_service.signer.desired_count == 3 && toset(aws_ecs_service.signer.network_configuration[0].subnets) == toset(["subnet-0a", "subnet-0b", "subnet-0c"])
    error_message = "three replicas over the three zones' subnets"
  }

  assert {
    condition     = aws_ecs_service.signer.deployment_minimum_healthy_percent == 100 && aws_ecs_service.signer.deployment_maximum_percent == 200 && aws_ecs_service.signer.availability_zone_rebalancing == "ENABLED"
    error_message = "start-first rolling deployments, rebalanced over the zones"
  }

  assert {
    condition     = contains([for e in jsondecode(aws_ecs_task_definition.signer.container_definitions)[0].environment : e.value], "dynamodb://${aws_dynamodb_table.state[0].name}?region=eu-west-1")
    error_message = "every replica's state_url names the deployer's own table"
  }

  assert {
    condition     = aws_dynamodb_table.state[0].name == "countersign-test-signer-deployer-a" && aws_dynamodb_table.state[0].point_in_time_recovery[0].enabled && aws_dynamodb_table.state[0].deletion_protection_enabled
    error_message = "the deployer's own table, recoverable and protected"
  }

  assert {
    condition     = flatten([for s in data.aws_iam_policy_document.task_state_table[0].statement : s.resources if anytrue([for a in s.actions : startswith(a, "dynamodb:")])]) == [aws_dynamodb_table.state[0].arn]
    error_message = "the task role's DynamoDB statements name the deployer's own table and nothing else"
  }

  assert {
    condition     = aws_iam_role_policy.task_state_table[0].role == aws_iam_role.signer.id && aws_ecs_task_definition.signer.task_role_arn == aws_iam_role.signer.arn
    error_message = "the table policy is on the role the tasks run as"
  }
}
