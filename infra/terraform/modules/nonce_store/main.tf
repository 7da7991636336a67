# The verifiers' durable nonce store: one item per consumed nonce (and per parent's child set),
# written with conditional puts so a nonce is accepted exactly once across all replicas, and
# removed by DynamoDB's TTL once the record it belongs to has expired (expires_at, epoch seconds).

resource "aws_dynamodb_table" "nonces" {
  name         = "${var.name}-nonces"
  billing_mode = "PAY_PER_REQUEST"
  hash_key     = "pk"
  range_key    = "sk"

  attribute {
    name = "pk"
    type = "S"
  }

  attribute {
    name = "sk"
    type = "S"
  }

  ttl {
    enabled        = true
    attribute_name = "expires_at"
  }

  point_in_time_recovery {
    enabled = true
  }

  server_side_encryption {
    enabled     = true
    kms_key_arn = var.kms_key_arn
  }

  deletion_protection_enabled = var.deletion_protection
}
