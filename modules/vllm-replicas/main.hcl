module "fabric" {
  source      = "../fabric-env"
  network     = var.network
  nodes       = var.replicas
  extra_env   = var.extra_env
  shm_size    = var.shm_size
  hf_cache    = var.hf_cache
  jit_cache   = var.jit_cache
  model_cache = var.weights.cache
  gpu_devices = var.gpu_devices
  rdma        = var.rdma
}

# The flags of one engine: the checks (parallelism, memory) are one replica's, on its node.
module "serve" {
  source                 = "../vllm-serve"
  weights                = var.weights
  served_model_name      = var.served_model_name
  nodes                  = [var.replicas[0]]
  model_size_gib         = var.model_size_gib
  gpu_memory_utilization = var.gpu_memory_utilization
  max_model_len          = var.max_model_len
  port                   = var.port
  extra_args             = var.extra_args
  api_key                = var.api_key
  listen                 = "0.0.0.0"
}

locals {
  replicas = { for n in var.replicas : n.name => n }
  address  = { for k, n in local.replicas : k => module.fabric.addresses[k] }
  s        = module.fabric.signatures
}

check "one_replica_per_node" {
  condition     = length(distinct([for n in var.replicas : n.name])) == length(var.replicas)
  error_message = "two replicas on one node would share its GPUs and memory: list each node once in `replicas`"
}

check "replicas_present" {
  condition     = length(var.replicas) > 0
  error_message = "`replicas` lists no node: a deployment of replicas needs at least one"
}

container "engine" {
  for_each     = local.replicas
  node         = each.value
  name         = "${var.container_prefix}-vllm-${each.key}"
  image        = var.image
  network_mode = module.fabric.network_mode
  ipc_mode     = module.fabric.ipc_mode
  shm_size     = module.fabric.shm_size
  gpus         = module.fabric.gpus[each.key]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
  ulimits      = module.fabric.ulimits
  volumes      = module.fabric.volumes
  cache        = module.fabric.cache
  env          = merge(module.fabric.node_env[each.key], lookup(var.replica_env, each.key, {}), { VLLM_API_KEY = var.api_key })
  # The engine listens on its node's fabric address only: the router and the probes reach it
  # there (vLLM takes the last --host it is given).
  # One node's engine: never Ray (vLLM's own executors), its GPUs its own.
  command = concat(
    module.serve.serve_args,
    var.executor == null ? [] : ["--distributed-executor-backend", var.executor],
    module.serve.server_args,
    ["--host", local.address[each.key]],
  )
  restart      = "no"
  memory       = [for n, m in module.serve.memory : m if n == each.key]
  watch_on_log = module.fabric.wedge

  ready {
    http        = "http://${local.address[each.key]}:${var.port}/health"
    status      = 200
    timeout     = var.health_timeout
    interval    = "2s"
    fail_on_log = merge(local.s.gpu, local.s.vllm)
    warn_on_log = module.fabric.warnings.gpu
    progress    = module.serve.progress
  }
}

# Each replica answers a real completion on its own, before the router sends it anything.
probe "direct" {
  for_each = local.replicas
  http {
    via     = each.value
    url     = "http://${local.address[each.key]}:${var.port}/v1/chat/completions"
    method  = "POST"
    headers = module.serve.auth_headers
    json = {
      model      = module.serve.served_name
      max_tokens = 4
      messages   = [{ role = "user", content = "ping" }]
      # The engine's name as the OpenAI API's `user` (vLLM ignores it): naming that replica's
      # engine makes the probe wait for it alone.
      user = container.engine[each.key].name
    }
  }
  expect {
    status = 200
  }
  timeout  = var.probe_timeout
  interval = "2s"
}

module "router" {
  source        = "../router"
  node          = var.router_node
  image         = var.router_image
  name          = "${var.container_prefix}-router"
  port          = var.router_port
  address       = var.router_address
  api_key       = var.api_key
  drain_timeout = var.drain_timeout
  replicas = {
    for k in keys(local.replicas) : k => {
      address = "${local.address[k]}:${var.port}"
      members = [container.engine[k], probe.direct[k]]
    }
  }
}
