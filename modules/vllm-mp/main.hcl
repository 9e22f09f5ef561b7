module "fabric" {
  source               = "../fabric-env"
  network              = var.network
  nodes                = concat([var.head], var.workers)
  head_address         = var.head_address
  extra_env            = var.extra_env
  shm_size             = var.shm_size
  hf_cache             = var.hf_cache
  jit_cache            = var.jit_cache
  model_cache          = var.weights == null ? null : var.weights.cache
  gpu_devices          = var.gpu_devices
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
  master = module.fabric.head_ip
  ranks  = { for i, w in module.fabric.workers : w.name => { node = w, rank = i + 1 } }
  mp_args = [
    "--distributed-executor-backend", "mp",
    "--nnodes", tostring(length(var.workers) + 1),
    "--master-addr", local.master,
    "--master-port", tostring(var.master_port),
  ]
  s           = module.fabric.signatures
  fail_on_log = merge(local.s.gpu, local.s.vllm, local.s.mp)
}

check "workers_present" {
  condition     = length(var.workers) > 0
  error_message = "vllm-mp spreads vLLM over several nodes and needs at least one worker; on one node run vLLM in a plain container"
}

# The ranks start together: a headless rank waits for rank 0's master port itself (vLLM's
# launcher retries the connection), so nothing here waits for it. They are one process group:
# the apply starts them through one gate (every rank's image ready on its node before any old
# rank stops; every old rank stopped before any new one starts), so a new rank can only join
# the new rank 0, and the group's outage is its slowest rank's own start. Every rank is ready
# when rank 0 answers /health (once every rank has joined and the weights are loaded), and each
# rank's own log is watched meanwhile.
container "rank0" {
  node         = var.head
  name         = "${var.container_prefix}-vllm-${var.head.name}"
  image        = var.image
  network_mode = module.fabric.network_mode
  ipc_mode     = module.fabric.ipc_mode
  shm_size     = module.fabric.shm_size
  gpus         = module.fabric.gpus[var.head.name]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
  ulimits      = module.fabric.ulimits
  volumes      = module.fabric.volumes
  cache        = module.fabric.cache
  # The API key (when there is one) by vLLM's environment, never its command line.
  env     = merge(module.fabric.node_env[var.head.name], { VLLM_API_KEY = var.api_key })
  command = concat(module.serve.serve_args, local.mp_args, ["--node-rank", "0"], module.serve.server_args)
  restart = "no"
  # The ranks are one torch.distributed process group: a rank that must be replaced for any
  # reason (drift, an untracked copy a kill left, a failed start) replaces every rank, and a
  # rollback brings back all of them or none.
  process_group = "vllm"
  # This rank loads its share of the model on its node: a unified-memory node's memory first.
  memory = [for n, m in module.serve.memory : m if n == var.head.name]
  # A wedged engine once it serves: `sparkform watch` restarts every rank on these lines.
  watch_on_log = module.fabric.wedge

  ready {
    http            = "http://${local.master}:${var.port}/health"
    status          = 200
    timeout         = var.health_timeout
    interval        = "2s"
    fail_on_log     = local.fail_on_log
    warn_on_log     = module.fabric.warnings.gpu
    progress        = module.serve.progress
    record_from_log = module.fabric.record_from_log
  }
}

container "rank" {
  for_each     = local.ranks
  node         = each.value.node
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
  env          = module.fabric.node_env[each.key]
  command = concat(
    module.serve.serve_args,
    local.mp_args,
    ["--node-rank", tostring(each.value.rank), "--headless"],
    module.serve.server_args,
  )
  restart = "no"
  # A headless rank's own shutdown waits 5 s for its workers, then SIGTERMs them, then kills
  # them ("[shutdown] Executor: workers still running after grace period; sending SIGTERM",
  # then "... sending SIGKILL"): about 10 s measured on vLLM 0.32.0, whatever signal it gets.
  # It is only ever stopped with its whole group, which nothing of it outlives, so 2 s is all
  # it gets before Docker kills it: otherwise that wait is part of every replacement's outage.
  stop_timeout  = "2s"
  process_group = "vllm"
  memory        = [for n, m in module.serve.memory : m if n == each.key]
  watch_on_log  = module.fabric.wedge

  ready {
    http            = "http://${local.master}:${var.port}/health"
    status          = 200
    timeout         = var.health_timeout
    interval        = "5s"
    fail_on_log     = local.fail_on_log
    warn_on_log     = module.fabric.warnings.gpu
    progress        = module.serve.progress
    record_from_log = module.fabric.record_from_log
  }
}

# Rendezvous gate: every headless rank holds a connection to rank 0's master port from its own
# planned fabric address, and nothing else has joined. A rank whose connection leaves from
# another address (a second address on its fabric interface that comes first, a route over the
# management network) is named with that address.
probe "rendezvous" {
  exec {
    container = container.rank0
    command = [
      "python3", "-c", module.fabric.rendezvous_program,
      tostring(var.master_port),
      local.master,
      join(",", [for w in var.workers : module.fabric.addresses[w.name]]),
    ]
  }
  expect {
    exit_code       = 0
    stdout_contains = "rendezvous-ok"
  }
  timeout    = var.rendezvous_timeout
  interval   = "2s"
  depends_on = [container.rank]
}
