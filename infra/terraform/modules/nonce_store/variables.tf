variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "kms_key_arn" {
  description = "Customer-managed KMS key for the table's server-side encryption."
  type        = string
}

variable "deletion_protection" {
  description = "Protect the table from deletion."
  type        = bool
  default     = true
}
