module "fabric" {
  source               = "../fabric-env"
  network              = var.network
  nodes                = concat([var.head], var.workers)
  head_address         = var.head_address
  extra_env            = var.extra_env
  shm_size             = var.shm_size
  hf_cache             = var.hf_cache
  jit_cache            = var.jit_cache
  model_cache          = var.model_cache
  gpu_devices          = var.gpu_devices
  rdma                 = var.rdma
  nccl_ib_hca          = var.nccl_ib_hca
  nccl_socket_fallback = var.nccl_socket_fallback
  # Ray's memory monitor killed vLLM during CUDA graph capture on unified-memory nodes.
  launcher_env = { RAY_memory_monitor_refresh_ms = "0" }
}

locals {
  head_ip   = module.fabric.head_ip
  workers   = { for w in module.fabric.workers : w.name => w }
  all_nodes = module.fabric.nodes
  # The GPUs each node offers Ray: its declared count, none when unknown.
  num_gpus   = { for n in local.all_nodes : n.name => n.gpus == null ? 0 : n.gpus }
  gpus_total = sum(values(local.num_gpus))
}

container "ray_head" {
  node         = var.head
  name         = "${var.container_prefix}-ray-head"
  image        = var.image
  network_mode = module.fabric.network_mode
  ipc_mode     = module.fabric.ipc_mode
  pid_mode     = "host"
  shm_size     = module.fabric.shm_size
  gpus         = module.fabric.gpus[var.head.name]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
  ulimits      = module.fabric.ulimits
  volumes      = concat(module.fabric.volumes, ["${var.ray_tmp}:/tmp/ray"])
  cache        = module.fabric.cache
  env          = module.fabric.node_env[var.head.name]
  command = concat([
    "ray", "start", "--head", "--block",
    "--node-ip-address=${local.head_ip}",
    "--port=${var.ray_port}",
    "--num-gpus=${local.num_gpus[var.head.name]}",
    "--disable-usage-stats",
    "--include-dashboard=false",
  ], var.ray_args)
  restart = "no"

  ready {
    exec        = ["ray", "status", "--address=${local.head_ip}:${var.ray_port}"]
    timeout     = "2m"
    interval    = "2s"
    fail_on_log = module.fabric.signatures.ray
  }
}

container "ray_worker" {
  for_each     = local.workers
  node         = each.value
  name         = "${var.container_prefix}-ray-worker-${each.key}"
  image        = var.image
  network_mode = module.fabric.network_mode
  ipc_mode     = module.fabric.ipc_mode
  pid_mode     = "host"
  shm_size     = module.fabric.shm_size
  gpus         = module.fabric.gpus[each.key]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
  ulimits      = module.fabric.ulimits
  volumes      = module.fabric.volumes
  cache        = module.fabric.cache
  env          = module.fabric.node_env[each.key]
  command = concat([
    "ray", "start", "--block",
    "--address=${local.head_ip}:${var.ray_port}",
    "--node-ip-address=${module.fabric.addresses[each.key]}",
    "--num-gpus=${local.num_gpus[each.key]}",
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
      join(",", [for n in local.all_nodes : module.fabric.addresses[n.name]]),
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
