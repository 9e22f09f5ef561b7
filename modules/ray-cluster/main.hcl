locals {
  # Each node's attachment to the fabric, by node name.
  attach     = { for a in values(var.network.attach) : a.node.name => a }
  head_ip    = var.head_address == null ? local.attach[var.head.name].address : var.head_address
  workers    = { for w in var.workers : w.name => w }
  all_nodes  = concat([var.head], var.workers)
  interfaces = distinct([for n in local.all_nodes : local.attach[n.name].interface])
  gpus_total = sum([for n in local.all_nodes : n.gpus == null ? 0 : n.gpus])

  # Every container talks over the fabric: Ray, NCCL, Gloo, UCX and TensorPipe all pick the
  # fabric interface instead of the default route, and Ray's memory monitor stays off (it killed
  # vLLM during CUDA graph capture on unified-memory nodes).
  fabric_env = {
    NCCL_SOCKET_IFNAME            = local.interfaces[0]
    GLOO_SOCKET_IFNAME            = local.interfaces[0]
    UCX_NET_DEVICES               = local.interfaces[0]
    TP_SOCKET_IFNAME              = local.interfaces[0]
    RAY_memory_monitor_refresh_ms = "0"
    HF_HOME                       = "/root/.cache/huggingface"
  }
}

check "head_on_fabric" {
  condition     = cidrcontains(var.network.subnet, local.head_ip)
  error_message = "the Ray head address ${local.head_ip} is not in the fabric subnet ${var.network.subnet} of network ${var.network.name}: Ray, NCCL and Gloo would talk over the management network, where the workers cannot reach the head (the first failure of the manual deployment). Leave head_address unset to use the head node's fabric address"
}

check "every_node_on_fabric" {
  condition     = length([for n in local.all_nodes : n.name if !contains(keys(local.attach), n.name)]) == 0
  error_message = "every Ray node needs an attachment to network ${var.network.name}; missing: ${join(", ", [for n in local.all_nodes : n.name if !contains(keys(local.attach), n.name)])}"
}

check "same_interface_everywhere" {
  condition     = length(local.interfaces) == 1
  error_message = "the fabric interface differs between nodes (${join(", ", local.interfaces)}); vLLM copies NCCL_SOCKET_IFNAME from the driver to every worker, so all nodes must use the same interface name"
}

container "ray_head" {
  node         = var.head
  name         = "${var.container_prefix}-ray-head"
  image        = var.image
  network_mode = "host"
  ipc_mode     = "host"
  pid_mode     = "host"
  shm_size     = var.shm_size
  gpus         = var.gpu_devices && var.head.gpus != null ? "all" : null
  volumes      = ["${var.hf_cache}:/root/.cache/huggingface", "${var.ray_tmp}:/tmp/ray"]
  env = merge(local.fabric_env, var.extra_env, {
    VLLM_HOST_IP = local.head_ip
  })
  command = concat([
    "ray", "start", "--head", "--block",
    "--node-ip-address=${local.head_ip}",
    "--port=${var.ray_port}",
    "--num-gpus=${var.head.gpus == null ? 0 : var.head.gpus}",
    "--disable-usage-stats",
    "--include-dashboard=false",
  ], var.ray_args)
  restart = "no"

  ready {
    exec     = ["ray", "status", "--address=${local.head_ip}:${var.ray_port}"]
    timeout  = "2m"
    interval = "2s"
  }
}

container "ray_worker" {
  for_each     = local.workers
  node         = each.value
  name         = "${var.container_prefix}-ray-worker-${each.key}"
  image        = var.image
  network_mode = "host"
  ipc_mode     = "host"
  pid_mode     = "host"
  shm_size     = var.shm_size
  gpus         = var.gpu_devices && each.value.gpus != null ? "all" : null
  volumes      = ["${var.hf_cache}:/root/.cache/huggingface"]
  env = merge(local.fabric_env, var.extra_env, {
    VLLM_HOST_IP = local.attach[each.key].address
  })
  command = concat([
    "ray", "start", "--block",
    "--address=${local.head_ip}:${var.ray_port}",
    "--node-ip-address=${local.attach[each.key].address}",
    "--num-gpus=${each.value.gpus == null ? 0 : each.value.gpus}",
    "--disable-usage-stats",
  ], var.ray_args)
  restart              = "no"
  replace_triggered_by = [container.ray_head]
}

# Gate between Ray and vLLM: Ray's alive nodes must be exactly the planned fabric addresses,
# with the planned number of GPUs. A node that registered another address (the default route)
# is named in the output.
probe "ray_members" {
  exec {
    container = container.ray_head
    command = [
      "python3", "-c", file("ray_members.py"),
      join(",", [for n in local.all_nodes : local.attach[n.name].address]),
      tostring(local.gpus_total),
    ]
  }
  expect {
    exit_code       = 0
    stdout_contains = "ray-members-ok"
  }
  timeout    = "3m"
  interval   = "5s"
  depends_on = [container.ray_worker]
}
