output "key_arn" {
  description = "ARN of the data-at-rest KMS key."
  value       = aws_kms_key.data.arn
}

output "alias_name" {
  description = "Alias of the data-at-rest KMS key."
  value       = aws_kms_alias.data.name
}
