output "head" {
  value = container.ray_head
}

# Every container of the cluster, head and workers: a process that joins the cluster (vLLM's
# driver in ../vllm-ray) loses a member when any of them is replaced, so it names this in its
# `replace_triggered_by` and is replaced with any of them.
output "members_containers" {
  description = "Every container of the Ray cluster, the head and each worker."
  value       = [container.ray_head, container.ray_worker]
}

output "head_ip" {
  value = local.head_ip
}

output "address" {
  value = "${local.head_ip}:${var.ray_port}"
}

output "fabric_env" {
  value = module.fabric.env
}

output "interface" {
  value = module.fabric.interface
}

output "gpus_total" {
  value = local.gpus_total
}

output "members" {
  value = probe.ray_members
}

# The fabric's container settings and log signatures, for the containers that join this cluster
# (vLLM's driver in ../vllm-ray), so they are written once in ../fabric-env.
output "fabric" {
  value = {
    network_mode = module.fabric.network_mode
    ipc_mode     = module.fabric.ipc_mode
    shm_size     = module.fabric.shm_size
    gpus         = module.fabric.gpus
    devices      = module.fabric.devices
    cap_add      = module.fabric.cap_add
    ulimits      = module.fabric.ulimits
    volumes      = module.fabric.volumes
    cache        = module.fabric.cache
    signatures   = module.fabric.signatures
    wedge        = module.fabric.wedge
    warnings     = module.fabric.warnings
    benign_log   = module.fabric.benign_log
    # What the vLLM driver records from its log: the transport NCCL chose, per rank.
    record_from_log = module.fabric.record_from_log
  }
}

output "nodes" {
  description = "Every node, the head first, as ../fabric-env checked them."
  value       = module.fabric.nodes
}
