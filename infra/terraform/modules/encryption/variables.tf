variable "name" {
  description = "Name prefix of the deployment (<name_prefix>-<environment>)."
  type        = string
}

variable "region" {
  description = "AWS region; lets the CloudWatch Logs service of this region use the key."
  type        = string
}
