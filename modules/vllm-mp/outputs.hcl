# Readers of the endpoint wait for the whole process group, checked by the rendezvous gate.
output "endpoint" {
  value      = "http://${local.master}:${var.port}"
  depends_on = [probe.rendezvous]
}

output "served_model_name" {
  value      = module.serve.served_name
  depends_on = [probe.rendezvous]
}

output "master" {
  value = "${local.master}:${var.master_port}"
}

output "rendezvous" {
  value = probe.rendezvous
}

output "auth_headers" {
  description = "What a client of the endpoint sends: the API key as a bearer token, when there is one (sensitive then)."
  value       = module.serve.auth_headers
  sensitive   = true
}

output "replica" {
  description = "This engine group as one replica behind modules/router: where the router reaches its API (rank 0's fabric address and port) and the resources a change to it replaces (its ranks and the rendezvous gate; add its own completion probe to `members`)."
  value = {
    address = "${local.master}:${var.port}"
    members = concat([container.rank0], [for k in keys(container.rank) : container.rank[k]], [probe.rendezvous])
  }
}
