output "connection" {
  description = "How the services connect: host, port, database, user and the Secrets Manager secret that holds the password (JSON key 'password')."
  value = {
    address            = aws_db_instance.this.address
    port               = aws_db_instance.this.port
    database           = var.database_name
    username           = var.master_username
    password_secret    = aws_db_instance.this.master_user_secret[0].secret_arn
    secret_kms_key_arn = var.kms_key_arn
  }
}

output "endpoint" {
  description = "host:port of the PostgreSQL instance."
  value       = aws_db_instance.this.endpoint
}
