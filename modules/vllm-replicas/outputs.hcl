output "endpoint" {
  description = "The router's endpoint: the same whatever the replicas."
  value       = module.router.endpoint
}

output "served_model_name" {
  value = module.serve.served_name
}

output "auth_headers" {
  value     = module.serve.auth_headers
  sensitive = true
}

output "replicas" {
  description = "Each replica's engine as the router reaches it."
  value       = { for k, a in local.address : k => "${a}:${var.port}" }
}
