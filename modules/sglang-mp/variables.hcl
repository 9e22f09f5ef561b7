# SGLang across nodes with its own multi-node launcher, one container per node: every node runs
# `python3 -m sglang.launch_server` with the same model and parallelism, `--nnodes`, its
# `--node-rank` and `--dist-init-addr` on the head's fabric address (torch.distributed's store,
# hosted by rank 0); rank 0 also serves the OpenAI-compatible API.
#
# Supports SGLang 0.5.6 and later: `bench/compat` (docs/compat.md) checks the oldest claimed and
# the newest release: their own parser takes every rank's command (--dist-init-addr, --nnodes,
# --node-rank, --config) with the values the plan means, and their sources print the lines the
# progress, failure and wedge patterns look for.

variable "image" {
  type        = string
  description = "Image with SGLang (`python3 -m sglang.launch_server`); the same image ID on every node. It must support the model's architecture."
}

variable "network" {
  type        = any
  description = "The fabric network (network.roce)."
}

variable "head" {
  type        = any
  description = "The node running rank 0: the API server and the master of the process group."
}

variable "workers" {
  type        = any
  description = "The other nodes, ranks 1, 2, … in this order; at least one."
}

variable "model" {
  type        = string
  default     = null
  description = "Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8 (SGLang fetches it); or set `weights`."
}

variable "weights" {
  type        = any
  default     = null
  description = "A model block (model.qwen): its verified copy on every node is served offline; every container waits for it."
}

variable "served_model_name" {
  type    = string
  default = null
}

variable "model_size_gib" {
  type        = number
  default     = null
  description = "Size of the weights; when set, plan checks that they fit the nodes' memory."
}

variable "tensor_parallel_size" {
  type    = number
  default = 1
}

variable "pipeline_parallel_size" {
  type    = number
  default = 1
}

variable "mem_fraction_static" {
  type        = number
  default     = 0.80
  description = "SGLang's --mem-fraction-static: the share of the GPU's memory for the weights and the KV cache pool. In (0, 0.95]; at most 0.85 on unified-memory nodes."
}

variable "overhead_gib" {
  type        = number
  default     = 8
  description = "Memory per node beyond the weights (activations, CUDA graphs, KV cache floor)."
}

variable "context_length" {
  type        = number
  default     = null
  description = "SGLang's --context-length; the model's own when null."
}

variable "port" {
  type        = number
  default     = 30000
  description = "The API port of rank 0 (SGLang's default)."
}

variable "extra_args" {
  type        = list(string)
  default     = []
  description = "More sglang.launch_server flags, given to every rank (they are one process group)."
}

variable "shm_size" {
  type    = string
  default = "16g"
}

variable "jit_cache" {
  type        = string
  default     = "/var/cache/sparkform-jit"
  description = "Host folder of the compile and JIT caches, one folder per image ID under it (../fabric-env); null: none survives a replacement."
}

variable "hf_cache" {
  type    = string
  default = "/root/.cache/huggingface"
}

variable "gpu_devices" {
  type    = bool
  default = true
}

variable "extra_env" {
  type    = map(string)
  default = {}
}

variable "memory_release_timeout" {
  type        = number
  default     = 120
  description = "Seconds an SGLang start on a unified-memory node waits for its memory (after a stopped engine releases it) before it fails naming what holds the GPU."
}

variable "health_timeout" {
  type        = string
  default     = "30m"
  description = "How long the ranks may take to load the weights until rank 0 answers /health."
}

variable "head_address" {
  type        = string
  default     = null
  description = "The master address; by default the head node's fabric address. Set only to override, and only within the fabric subnet."
}

variable "dist_init_port" {
  type        = number
  default     = 20000
  description = "The port of `--dist-init-addr` on rank 0's fabric address: torch.distributed's store, which every other rank joins."
  validation {
    condition     = var.dist_init_port >= 1 && var.dist_init_port <= 65535 && floor(var.dist_init_port) == var.dist_init_port
    error_message = "the dist-init port must be a whole number from 1 to 65535, not ${var.dist_init_port}"
  }
}

variable "start_timeout" {
  type        = string
  default     = "10m"
  description = "How long rank 0 may take to open the dist-init port (the image starts, Python imports torch and SGLang)."
}

variable "rendezvous_timeout" {
  type        = string
  default     = "2m"
  description = "How long the rendezvous gate waits for every rank's connection from its fabric address."
}

variable "container_prefix" {
  type        = string
  default     = "sparkform"
  description = "Docker container names start with this; each rank's container is PREFIX-sglang-NODE."
}

variable "rdma" {
  type        = bool
  default     = true
  description = "Give every container the RDMA devices, IPC_LOCK and an unlimited memlock limit (NCCL over RoCE). False only on nodes without RDMA devices."
}

variable "nccl_ib_hca" {
  type        = string
  default     = null
  description = "NCCL_IB_HCA for every container (both twin devices of the port with one cable). Unset: each node's active RDMA ports on the fabric, as the plan reads them."
}

variable "nccl_socket_fallback" {
  type        = string
  default     = "fail"
  description = "\"fail\" or \"allow\": whether a log showing NCCL on TCP sockets instead of RoCE fails the ready check."
}

variable "api_key" {
  type        = string
  default     = null
  sensitive   = true
  description = "The API key clients send as a bearer token: through the container's environment into a config file SGLang reads (`--config`), never its command line; the output `auth_headers` carries it for probes. SGLang 0.5 prints its settings, the key among them, in its log: sparkform scrubs it from what it shows, `docker logs` on the node does not."
}

variable "listen" {
  type        = string
  default     = "0.0.0.0"
  description = "The address the API server listens on; plan warns when it is beyond the node and there is no api_key."
}
