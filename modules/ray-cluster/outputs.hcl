output "head" {
  value = container.ray_head
}

output "head_ip" {
  value = local.head_ip
}

output "address" {
  value = "${local.head_ip}:${var.ray_port}"
}

output "fabric_env" {
  value = local.fabric_env
}

output "interface" {
  value = local.interfaces[0]
}

output "gpus_total" {
  value = local.gpus_total
}

output "members" {
  value = probe.ray_members
}
