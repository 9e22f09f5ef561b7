# Readers of the endpoint wait for the whole process group, checked by the rendezvous gate.
output "endpoint" {
  value      = "http://${local.master}:${var.port}"
  depends_on = [probe.rendezvous]
}

output "served_model_name" {
  value      = module.serve.served_name
  depends_on = [probe.rendezvous]
}

output "dist_init_addr" {
  value = "${local.master}:${var.dist_init_port}"
}

output "rendezvous" {
  value = probe.rendezvous
}

output "auth_headers" {
  description = "What a client of the endpoint sends: the API key as a bearer token, when there is one (sensitive then)."
  value       = module.serve.auth_headers
  sensitive   = true
}
