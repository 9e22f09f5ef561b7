locals {
  repo = var.weights == null ? var.model : var.weights.repo
  # The local snapshot when there is a model block: its commit is in the path, so a new commit
  # replaces the containers that serve it (and only them).
  model_arg   = var.weights == null ? var.model : var.weights.path
  size_gib    = var.weights == null ? var.model_size_gib : (var.weights.size_gib == null ? var.model_size_gib : var.weights.size_gib)
  served_name = var.served_model_name == null ? local.repo : var.served_model_name
  gpus_needed = var.tensor_parallel_size * var.pipeline_parallel_size
  gpus_total  = sum([for n in var.nodes : n.gpus == null ? 0 : n.gpus])
  min_memory  = min([for n in var.nodes : n.memory_gib == null ? 0 : n.memory_gib]...)
  per_node    = local.size_gib == null ? 0 : local.size_gib / length(var.nodes) + var.overhead_gib
  large_model = local.size_gib == null ? true : local.size_gib >= var.large_model_gib
  # On a unified-memory node the GPU's memory is the node's: vLLM starts only when the memory
  # the kernel holds free covers gpu_memory_utilization of it, the page cache of weights just
  # copied counting as used. What a start needs of each node, by node name: the engine that
  # loads there waits for it (an old one releasing its memory), the weights' cache dropped first.
  memory = {
    for n in var.nodes : n.name => {
      node            = n
      min_free_gib    = var.gpu_memory_utilization * n.memory_gib
      drop_page_cache = var.weights == null ? [] : [var.weights.path]
      timeout         = var.memory_release_timeout
    } if n.unified_memory == true && n.memory_gib != null
  }
  # Only the node itself can reach an endpoint on loopback.
  listens_beyond_the_node = !contains(["127.0.0.1", "localhost", "::1"], var.listen)

  serve_args = [
    "vllm", "serve", local.model_arg,
    "--tensor-parallel-size", tostring(var.tensor_parallel_size),
    "--pipeline-parallel-size", tostring(var.pipeline_parallel_size),
  ]
  server_args = concat(
    [
      "--host", var.listen,
      "--port", tostring(var.port),
      "--served-model-name", local.served_name,
      "--gpu-memory-utilization", tostring(var.gpu_memory_utilization),
    ],
    var.max_model_len == null ? [] : ["--max-model-len", tostring(var.max_model_len)],
    var.extra_args,
  )
}

check "a_model" {
  condition     = var.model != null || var.weights != null
  error_message = "no model: set `model` (a Hugging Face id ${var.engine.name} fetches) or `weights` (a model block, served from its verified local copy)"
}

# A start must not need the internet: the nodes behind a jump host often cannot reach it, and a
# restart in an incident should not depend on the hub. With `weights` every node holds a
# verified copy and the engine runs offline; with a hub id alone each start fetches it.
check "starts_offline" {
  condition     = var.weights != null
  error_message = "`model = \"${coalesce(var.model, "?")}\"` without `weights`: every start of ${var.engine.name} fetches the model from the hub, so a restart, a rollback or a watch restart fails when the hub cannot be reached; declare a model block and pass it as `weights` (the nodes keep verified copies and ${var.engine.name} starts offline)"
  severity      = "warning"
}

check "parallelism_matches_gpus" {
  condition     = local.gpus_needed == local.gpus_total
  error_message = "tensor_parallel_size × pipeline_parallel_size = ${local.gpus_needed}, but the head and workers declare ${local.gpus_total} GPUs; ${var.engine.name} would wait forever for the missing ones"
}

check "utilization_on_unified_memory" {
  condition     = var.gpu_memory_utilization <= 0.85 || length([for n in var.nodes : n.name if n.unified_memory == true]) == 0
  error_message = "${var.engine.memory_setting} ${var.gpu_memory_utilization} is above 0.85 on unified-memory nodes: the GPU shares memory with the OS (a desktop session alone takes 2-3 GiB), and CUDA graph capture has been killed there at 95%"
  severity      = "warning"
}

# Before a plan reads the nodes' facts (validate, or nodes that do not say), whether a node is
# unified-memory is unknown: the same limit is said as a warning that could not be checked.
check "utilization_unknown_memory" {
  condition     = var.gpu_memory_utilization <= 0.85 || length([for n in var.nodes : n.name if n.unified_memory == null]) == 0
  error_message = "could not check ${var.engine.memory_setting} ${var.gpu_memory_utilization} against ${join(", ", [for n in var.nodes : n.name if n.unified_memory == null])}: whether they are unified-memory nodes is not known yet (a plan reads it, or set unified_memory on the node); on one (a DGX Spark) above 0.85 leaves the system too little"
  severity      = "warning"
}

check "model_fits" {
  condition     = local.size_gib == null || local.min_memory == 0 || local.per_node <= local.min_memory * var.gpu_memory_utilization
  error_message = "the model needs about ${local.per_node} GiB per node (weights split over ${length(var.nodes)} nodes plus ${var.overhead_gib} GiB), more than ${local.min_memory} GiB × ${var.gpu_memory_utilization}; add nodes or raise ${var.engine.memory_setting}"
}

check "enforce_eager_on_a_large_model" {
  condition     = !(contains(var.extra_args, "--enforce-eager") && local.large_model)
  error_message = "--enforce-eager in extra_args: on a large model it cost about 55% of throughput in one report and did not cure wedged servers in another; remove it unless CUDA graph capture itself fails"
  severity      = "warning"
}

check "endpoint_without_a_key" {
  condition     = var.api_key != null || !local.listens_beyond_the_node
  error_message = "the API server listens on ${var.listen} without an api_key: anyone on a network this node is on can use the model; set api_key from a sensitive variable, or listen = \"127.0.0.1\" and reach it with `sparkform tunnel`"
  severity      = "warning"
}
