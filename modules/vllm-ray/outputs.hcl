# Readers of the endpoint wait for vLLM itself, not only for the address it will have.
output "endpoint" {
  value      = "http://${module.ray.head_ip}:${var.port}"
  depends_on = [container.vllm]
}

output "served_model_name" {
  value      = module.serve.served_name
  depends_on = [container.vllm]
}

output "ray_address" {
  value = module.ray.address
}

output "auth_headers" {
  description = "What a client of the endpoint sends: the API key as a bearer token, when there is one (sensitive then)."
  value       = module.serve.auth_headers
  sensitive   = true
}
