terraform {
  # 1.9 or newer: variable validations below refer to other variables.
  required_version = ">= 1.9.0, < 2.0.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Pinned to one minor release. Raise it on purpose, run `terraform init -upgrade`
      # somewhere with registry access, and commit the refreshed .terraform.lock.hcl.
      version = "~> 6.57.0"
    }
  }
}
