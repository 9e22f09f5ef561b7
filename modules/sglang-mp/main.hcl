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

# The model, the checks on parallelism and memory, what each unified-memory node's start needs
# and the client's headers, as for vLLM: the command below is SGLang's own.
module "serve" {
  source            = "../vllm-serve"
  engine            = { name = "SGLang", memory_setting = "mem_fraction_static" }
  model             = var.model
  weights           = var.weights
  served_model_name = var.served_model_name
  # Each node once: a duplicate is reported by ../fabric-env by name.
  nodes                  = distinct(concat([var.head], var.workers))
  model_size_gib         = var.model_size_gib
  tensor_parallel_size   = var.tensor_parallel_size
  pipeline_parallel_size = var.pipeline_parallel_size
  gpu_memory_utilization = var.mem_fraction_static
  overhead_gib           = var.overhead_gib
  port                   = var.port
  extra_args             = var.extra_args
  api_key                = var.api_key
  listen                 = var.listen
  memory_release_timeout = var.memory_release_timeout
}

locals {
  master = module.fabric.head_ip
  ranks  = { for i, w in module.fabric.workers : w.name => { node = w, rank = i + 1 } }
  model  = var.weights == null ? var.model : var.weights.path
  # Every rank runs the same command but for its node rank: one process group.
  args = concat(
    [
      "python3", "-m", "sglang.launch_server",
      "--model-path", local.model,
      "--served-model-name", module.serve.served_name,
      "--tp-size", tostring(var.tensor_parallel_size),
      "--pp-size", tostring(var.pipeline_parallel_size),
      "--nnodes", tostring(length(var.workers) + 1),
      "--dist-init-addr", "${local.master}:${var.dist_init_port}",
      "--host", var.listen,
      "--port", tostring(var.port),
      "--mem-fraction-static", tostring(var.mem_fraction_static),
    ],
    var.context_length == null ? [] : ["--context-length", tostring(var.context_length)],
    var.extra_args,
  )
  # SGLang takes its API key only as a setting: written from the environment into a config
  # file it reads (`--config`, YAML; JSON is YAML), so the key is in no process's arguments.
  key_file = "/tmp/sparkform-sglang-settings.yaml"
  with_key = [
    "sh", "-c",
    "umask 077 && python3 -c 'import json, os, sys; open(sys.argv[1], \"w\").write(json.dumps({\"api-key\": os.environ[\"SGLANG_API_KEY\"]}))' \"$0\" && exec \"$@\" --config \"$0\"",
    local.key_file,
  ]
  s           = module.fabric.signatures
  fail_on_log = merge(local.s.gpu, local.s.sglang, local.s.mp)
  # SGLang's start, as 0.5 logs it: the tensor-parallel workers' weight loading (tqdm's bar in
  # the plain format, as vLLM's), the KV cache pool, the CUDA graph capture (0.5.23: "Capture
  # target decode CUDA graph begin."; older: "Capture cuda graph begin."), then the HTTP server.
  progress = {
    "Load weight begin"                               = "loading weights"
    "Loading safetensors checkpoint shards: +(\\d+)%" = "loading weights"
    "Load weight end"                                 = "weights loaded"
    "Memory pool end"                                 = "memory pool allocated"
    "Capture (?:.* )?(?:cuda|CUDA) graph begin"       = "capturing CUDA graphs"
    "Capture (?:.* )?(?:cuda|CUDA) graph end"         = "CUDA graphs captured"
    "The server is fired up and ready to roll"        = "API server up"
  }
  # The compile and JIT caches survive a replacement; SGLang names no phase they skip.
  cache = module.fabric.cache == null ? null : merge(module.fabric.cache, { skips = [] })
}

check "workers_present" {
  condition     = length(var.workers) > 0
  error_message = "sglang-mp spreads SGLang over several nodes and needs at least one worker; on one node run SGLang in a plain container"
}

# Order as in ../vllm-mp: rank 0 first, ready once the dist-init port is open (its /health answers
# only when every rank joined and the weights are loaded); each other rank is ready when rank 0
# answers /health, its own log watched meanwhile. A changed setting is in every rank's command,
# and a new rank 0 replaces the others: an old rank can only ever join an old rank 0.
container "rank0" {
  node         = var.head
  name         = "${var.container_prefix}-sglang-${var.head.name}"
  image        = var.image
  network_mode = module.fabric.network_mode
  ipc_mode     = module.fabric.ipc_mode
  shm_size     = module.fabric.shm_size
  gpus         = module.fabric.gpus[var.head.name]
  devices      = module.fabric.devices
  cap_add      = module.fabric.cap_add
  ulimits      = module.fabric.ulimits
  volumes      = module.fabric.volumes
  cache        = local.cache
  env          = merge(module.fabric.node_env[var.head.name], { SGLANG_API_KEY = var.api_key })
  entrypoint   = var.api_key == null ? null : local.with_key
  command      = concat(local.args, ["--node-rank", "0"])
  restart      = "no"
  # One torch.distributed process group: a rank replaced for any reason replaces every rank.
  process_group = "sglang"
  memory        = [for n, m in module.serve.memory : m if n == var.head.name]
  watch_on_log  = module.fabric.sglang_wedge

  ready {
    tcp             = "${local.master}:${var.dist_init_port}"
    timeout         = var.start_timeout
    interval        = "2s"
    fail_on_log     = local.fail_on_log
    warn_on_log     = module.fabric.warnings.gpu
    progress        = local.progress
    record_from_log = module.fabric.record_from_log
  }
}

container "rank" {
  for_each      = local.ranks
  node          = each.value.node
  name          = "${var.container_prefix}-sglang-${each.key}"
  image         = var.image
  network_mode  = module.fabric.network_mode
  ipc_mode      = module.fabric.ipc_mode
  shm_size      = module.fabric.shm_size
  gpus          = module.fabric.gpus[each.key]
  devices       = module.fabric.devices
  cap_add       = module.fabric.cap_add
  ulimits       = module.fabric.ulimits
  volumes       = module.fabric.volumes
  cache         = local.cache
  env           = module.fabric.node_env[each.key]
  command       = concat(local.args, ["--node-rank", tostring(each.value.rank)])
  restart       = "no"
  process_group = "sglang"
  memory        = [for n, m in module.serve.memory : m if n == each.key]
  watch_on_log  = module.fabric.sglang_wedge

  ready {
    http            = "http://${local.master}:${var.port}/health"
    status          = 200
    timeout         = var.health_timeout
    interval        = "5s"
    fail_on_log     = local.fail_on_log
    warn_on_log     = module.fabric.warnings.gpu
    progress        = local.progress
    record_from_log = module.fabric.record_from_log
  }

  depends_on           = [container.rank0]
  replace_triggered_by = [container.rank0]
}

# Rendezvous gate, as ../vllm-mp's: every other rank holds a connection to rank 0's dist-init
# port from its own planned fabric address, and nothing else has joined.
probe "rendezvous" {
  exec {
    container = container.rank0
    command = [
      "python3", "-c", module.fabric.rendezvous_program,
      tostring(var.dist_init_port),
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
