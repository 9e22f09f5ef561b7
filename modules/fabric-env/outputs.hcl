output "head_ip" {
  value = local.head_ip
}

output "addresses" {
  description = "Each node's fabric address, by node name."
  value       = { for n in var.nodes : n.name => lookup(local.addr, n.name, null) }
}

output "interface" {
  value = local.interface
}

output "nodes" {
  description = "Every node, the head first, once checked (the launchers read their nodes here)."
  value       = var.nodes
}

output "workers" {
  description = "The nodes but the head, once checked."
  value       = slice(var.nodes, 1, length(var.nodes))
}

# A Ray driver takes this, never node_env: vLLM copies every NCCL_ variable of the driver to every
# Ray worker (vllm/ray/ray_env.py), so a node's own GID index or ports there would overwrite the
# other nodes' values.
output "env" {
  description = "The environment every container shares (without VLLM_HOST_IP and the per-node NCCL_IB_GID_INDEX and NCCL_IB_HCA)."
  value       = local.env
}

output "node_env" {
  description = "The whole environment of a container, by the name of its node (VLLM_HOST_IP included)."
  value       = local.node_env
}

output "gpus" {
  description = "The `gpus` attribute of a container, by the name of its node."
  value       = { for n in var.nodes : n.name => var.gpu_devices && n.gpu_devices && n.gpus != null ? "all" : null }
}

# Host network: every process binds and advertises its node's own fabric address, which a bridge
# network would hide. Host IPC: NCCL and vLLM share memory between the processes of a node.
output "network_mode" {
  value = "host"
}

output "ipc_mode" {
  value = "host"
}

output "shm_size" {
  value = var.shm_size
}

output "volumes" {
  value = concat(
    ["${var.hf_cache}:/root/.cache/huggingface"],
    var.model_cache == null ? [] : ["${var.model_cache}:${var.model_cache}:ro"],
  )
}

output "rendezvous_program" {
  description = "A Python program for an exec probe in rank 0: every other rank holds a connection to the rendezvous port from its planned fabric address (arguments: PORT MASTER_ADDRESS WORKER_ADDRESSES, comma-separated); the Ray-less launchers gate their endpoint on it."
  value       = file("rendezvous.py")
}

output "sglang_wedge" {
  description = "watch_on_log patterns of a wedged SGLang engine (its scheduler's watchdog, NCCL's)."
  value       = local.sglang_wedge
}

output "cache" {
  description = "The `cache` attribute of every vLLM container: the node's folder per image, mounted where the environment points the compile and JIT caches; a warm one skips the `compiling` phase of ../vllm-serve's progress."
  value       = var.jit_cache == null ? null : { host = var.jit_cache, path = local.jit_path, skips = ["compiling"] }
}

output "devices" {
  value = local.devices
}

output "cap_add" {
  value = local.cap_add
}

output "ulimits" {
  value = local.ulimits
}

output "wedge" {
  description = "watch_on_log patterns of a wedged engine, for every vLLM container: what `sparkform watch` acts on once it serves."
  value       = local.wedge
}

output "signatures" {
  description = "fail_on_log patterns by where they apply: gpu, vllm, ray, mp."
  value       = local.signatures
}

output "warnings" {
  description = "warn_on_log patterns by where they apply (gpu): reported, the start goes on."
  value       = local.warnings
}

output "record_from_log" {
  description = "record_from_log patterns for a vLLM container's ready check: the transport NCCL chose, per rank."
  value       = local.record_from_log
}

output "benign_log" {
  description = "Log lines that are normal on DGX Spark; no signature matches them."
  value       = local.benign_log
}
