output "served_name" {
  value = local.served_name
}

output "serve_args" {
  description = "`vllm serve MODEL` and its parallelism: the launcher's flags come next."
  value       = local.serve_args
}

output "server_args" {
  description = "The server, memory and extra flags, after the launcher's."
  value       = local.server_args
}

output "progress" {
  description = "`progress` patterns for a ready block: the phases of a vLLM start, as vLLM 0.13 to 0.34 logs them (bench/compat checks them against each release's source, docs/compat.md)."
  # Each key is matched anywhere in a line, so the prefixes Ray and the engine core put before
  # a worker's lines do not matter. The weight and graph bars are tqdm's, in vLLM's plain bar
  # format: one line per update, its percentage captured. The API server's line is "Starting
  # vLLM API server N on URL" up to 0.20 (0.13's api_server.py) and "Starting vLLM server on
  # URL" since (0.21's and 0.33's). 0.34's model runner says "Loading model from scratch..." where
  # the older ones said "Starting to load model", and names its graph bars "Capturing CUDA
  # graphs (MODE)"; vLLM's torch.compile names its cache folder first, then compiles or, from a
  # warm cache, loads what it compiled before (the phase a warm `cache` skips); the CPU build's
  # model runner says "Warming up model for the compilation..." instead. The KV cache's size is
  # "GPU KV cache size: N tokens" (the CPU build: "CPU KV cache size"), and a CPU worker's own
  # share "Explicitly set (X/Y) GiB for KV cache on node N".
  value = {
    "Starting to load model|Loading model from scratch"       = "loading the model"
    "Loading safetensors checkpoint shards: +(\\d+)%"         = "loading weights"
    "Loading weights took|Model loading took"                 = "weights loaded"
    "Using cache directory: .* for vLLM's torch\\.compile"    = "compiling"
    "Warming up model for the compilation"                    = "compiling"
    "Memory profiling takes|Available KV cache memory:"       = "memory profiled"
    "KV cache size: [\\d,.]+ tokens|GiB for KV cache on node" = "KV cache allocated"
    "Capturing CUDA graphs[^:]*: +(\\d+)%"                    = "capturing CUDA graphs"
    "Graph capturing finished in"                             = "CUDA graphs captured"
    "Starting vLLM (API )?server"                             = "starting the API server"
    "Application startup complete"                            = "API server up"
  }
}

output "memory" {
  description = "What a vLLM start needs of each unified-memory node's memory, by node name: a container's `memory` entries."
  value       = local.memory
}

output "auth_headers" {
  description = "The headers a client of the endpoint sends: the API key as a bearer token, when there is one."
  value       = var.api_key == null ? {} : { Authorization = "Bearer ${var.api_key}" }
  sensitive   = true
}
