output "endpoint" {
  description = "The endpoint clients use: it stays the same whatever the replicas."
  value       = "http://${coalesce(var.address, var.listen == "0.0.0.0" ? var.node.address : var.listen)}:${var.port}"
  depends_on  = [router.endpoint]
}

output "router" {
  value = router.endpoint
}
