module "ray" {
  source               = "../ray-cluster"
  image                = var.image
  network              = var.network
  head                 = var.head
  workers              = var.workers
  shm_size             = var.shm_size
  hf_cache             = var.hf_cache
  jit_cache            = var.jit_cache
  model_cache          = var.weights == null ? null : var.weights.cache
  gpu_devices          = var.gpu_devices
  extra_env            = var.extra_env
  head_address         = var.head_address
  ray_args             = var.ray_args
  rdma                 = var.rdma
  nccl_ib_hca          = var.nccl_ib_hca
  nccl_socket_fallback = var.nccl_socket_fallback
}

module "serve" {
  source            = "../vllm-serve"
  model             = var.model
  weights           = var.weights
  served_model_name = var.served_model_name
  # Each node once: a head also listed as a worker, or a worker listed twice, is reported by
  # ../fabric-env by name, not here as a GPU count; other mistakes still show their checks.
  nodes                  = distinct(concat([var.head], var.workers))
  model_size_gib         = var.model_size_gib
  tensor_parallel_size   = var.tensor_parallel_size
  pipeline_parallel_size = var.pipeline_parallel_size
  gpu_memory_utilization = var.gpu_memory_utilization
  overhead_gib           = var.overhead_gib
  max_model_len          = var.max_model_len
  port                   = var.port
  extra_args             = var.extra_args
  api_key                = var.api_key
  listen                 = var.listen
  memory_release_timeout = var.memory_release_timeout
}

locals {
  fabric = module.ray.fabric
}

# vLLM's driver joins the head's Ray cluster: it shares the head's PID namespace and /tmp/ray
# (without them ray.init cannot find the raylet), and RAY_ADDRESS points it at the head (without
# it a bare ray.init starts a private cluster with no GPUs). A new Ray head breaks a running
# driver, and a replaced worker leaves it without that worker's GPUs (it answers 503), so
# replacing any member of the cluster replaces vLLM.
container "vllm" {
  node         = var.head
  name         = "sparkform-vllm"
  image        = var.image
  network_mode = local.fabric.network_mode
  ipc_mode     = local.fabric.ipc_mode
  pid_mode     = "host"
  shm_size     = local.fabric.shm_size
  gpus         = local.fabric.gpus[var.head.name]
  devices      = local.fabric.devices
  cap_add      = local.fabric.cap_add
  ulimits      = local.fabric.ulimits
  volumes      = concat(local.fabric.volumes, ["/tmp/ray:/tmp/ray"])
  cache        = local.fabric.cache
  # The API key (when there is one) by vLLM's environment, never its command line.
  env = merge(module.ray.fabric_env, {
    RAY_ADDRESS  = module.ray.address
    VLLM_HOST_IP = module.ray.head_ip
    VLLM_API_KEY = var.api_key
  })
  command = concat(
    module.serve.serve_args,
    ["--distributed-executor-backend", "ray"],
    module.serve.server_args,
  )
  restart = "no"
  # Its start loads the model on every node (Ray's workers): each unified-memory node's memory
  # is waited for first.
  memory = values(module.serve.memory)
  # A wedged engine once it serves (Ray forwards its workers' lines here): `sparkform watch`.
  watch_on_log = local.fabric.wedge

  ready {
    http     = "http://${module.ray.head_ip}:${var.port}/health"
    status   = 200
    timeout  = var.health_timeout
    interval = "5s"
    # Ray forwards its workers' output (NCCL's included) to this driver's log.
    fail_on_log = merge(local.fabric.signatures.gpu, local.fabric.signatures.vllm, local.fabric.signatures.ray)
    warn_on_log = local.fabric.warnings.gpu
    progress    = module.serve.progress
    # Ray forwards every worker's NCCL lines to this driver's log: one record for all ranks.
    record_from_log = local.fabric.record_from_log
  }

  depends_on           = [module.ray.members]
  replace_triggered_by = [module.ray.members_containers]
}
