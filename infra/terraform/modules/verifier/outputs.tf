output "nlb_dns_name" {
  description = "DNS name of the internal network load balancer in front of the verifiers."
  value       = aws_lb.verifier.dns_name
}

output "nlb_arn" {
  description = "ARN of the internal network load balancer."
  value       = aws_lb.verifier.arn
}

output "target_group_arn" {
  description = "ARN of the verifiers' target group."
  value       = aws_lb_target_group.verifier.arn
}

output "role_arn" {
  description = "ARN of the verifiers' task role."
  value       = aws_iam_role.task.arn
}

output "tls_secret_arn" {
  description = "Secrets Manager secret to fill with the verifiers' TLS material (JSON keys cert, key, ca)."
  value       = aws_secretsmanager_secret.tls.arn
}
