module "ray" {
  source       = "../ray-cluster"
  image        = var.image
  network      = var.network
  head         = var.head
  workers      = var.workers
  shm_size     = var.shm_size
  hf_cache     = var.hf_cache
  gpu_devices  = var.gpu_devices
  extra_env    = var.extra_env
  head_address = var.head_address
  ray_args     = var.ray_args
}

locals {
  served_name = var.served_model_name == null ? var.model : var.served_model_name
  nodes       = concat([var.head], var.workers)
  gpus_needed = var.tensor_parallel_size * var.pipeline_parallel_size
  min_memory  = min([for n in local.nodes : n.memory_gib == null ? 0 : n.memory_gib]...)
  per_node    = var.model_size_gib == null ? 0 : var.model_size_gib / length(local.nodes) + var.overhead_gib

  vllm_args = concat(
    [
      "vllm", "serve", var.model,
      "--tensor-parallel-size", tostring(var.tensor_parallel_size),
      "--pipeline-parallel-size", tostring(var.pipeline_parallel_size),
      "--distributed-executor-backend", "ray",
      "--host", "0.0.0.0",
      "--port", tostring(var.port),
      "--served-model-name", local.served_name,
      "--gpu-memory-utilization", tostring(var.gpu_memory_utilization),
    ],
    var.max_model_len == null ? [] : ["--max-model-len", tostring(var.max_model_len)],
    var.extra_args,
  )
}

check "parallelism_matches_gpus" {
  condition     = local.gpus_needed == module.ray.gpus_total
  error_message = "tensor_parallel_size × pipeline_parallel_size = ${local.gpus_needed}, but the head and workers declare ${module.ray.gpus_total} GPUs; vLLM's placement group would wait forever"
}

check "utilization_on_unified_memory" {
  condition     = var.gpu_memory_utilization <= 0.85 || length([for n in local.nodes : n.name if n.unified_memory == true]) == 0
  error_message = "gpu_memory_utilization ${var.gpu_memory_utilization} is above 0.85 on unified-memory nodes: the GPU shares memory with the OS and Ray, and CUDA graph capture has been killed there at 95%"
  severity      = "warning"
}

check "model_fits" {
  condition     = var.model_size_gib == null || local.per_node <= local.min_memory * var.gpu_memory_utilization
  error_message = "the model needs about ${local.per_node} GiB per node (weights split over ${length(local.nodes)} nodes plus ${var.overhead_gib} GiB), more than ${local.min_memory} GiB × ${var.gpu_memory_utilization}; add nodes or raise gpu_memory_utilization"
}

# vLLM's driver joins the head's Ray cluster: it shares the head's PID namespace and /tmp/ray
# (without them ray.init cannot find the raylet), and RAY_ADDRESS points it at the head (without
# it a bare ray.init starts a private cluster with no GPUs). A new Ray head breaks a running
# driver, so replacing the head replaces vLLM.
container "vllm" {
  node         = var.head
  name         = "sparkform-vllm"
  image        = var.image
  network_mode = "host"
  ipc_mode     = "host"
  pid_mode     = "host"
  shm_size     = var.shm_size
  gpus         = var.gpu_devices && var.head.gpus != null ? "all" : null
  volumes      = ["${var.hf_cache}:/root/.cache/huggingface", "/tmp/ray:/tmp/ray"]
  env = merge(module.ray.fabric_env, var.extra_env, {
    RAY_ADDRESS  = module.ray.address
    VLLM_HOST_IP = module.ray.head_ip
  })
  command = local.vllm_args
  restart = "no"

  ready {
    http     = "http://${module.ray.head_ip}:${var.port}/health"
    status   = 200
    timeout  = var.health_timeout
    interval = "5s"
    # Known ways vLLM on Ray fails slowly: stop at the first sign, with the fix.
    fail_on_log = {
      "Waiting for creating a placement group of specs"                                    = "vLLM's placement group waits for GPUs Ray does not offer: RAY_ADDRESS must point at the head (a bare ray.init() starts a private cluster without GPUs), every worker must have joined (see the ray_members probe), and tensor_parallel_size × pipeline_parallel_size must equal the GPUs of the nodes"
      "(?i)(killed due to the node running low on memory|OutOfMemoryError|memory monitor)" = "Ray's memory monitor killed a worker: keep RAY_memory_monitor_refresh_ms=0 in every container and lower gpu_memory_utilization (≤ 0.85 on GB10)"
      "Gloo connectFullMesh failed"                                                        = "Gloo could not connect the nodes: GLOO_SOCKET_IFNAME and VLLM_HOST_IP must name the fabric interface and each node's own fabric address in every container"
      "Model architectures \\[.*\\] are not supported"                                     = "this image's vLLM does not know the model's architecture: use an image whose vLLM supports the model"
      "Free memory on device .* is less than desired"                                      = "the GPU has less free memory than gpu_memory_utilization asks for: lower it, or stop whatever else holds GPU memory (an old vLLM?)"
    }
  }

  depends_on           = [module.ray.members]
  replace_triggered_by = [module.ray.head]
}
