output "served_name" {
  value = local.served_name
}

output "serve_args" {
  description = "`vllm serve MODEL` and its parallelism: the launcher's flags come next."
  value       = local.serve_args
}

output "server_args" {
  description = "The server, memory and extra flags, after the launcher's."
  value       = local.server_args
}
