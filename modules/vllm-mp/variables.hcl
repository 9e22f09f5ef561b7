# vLLM across nodes without Ray: vLLM's multiprocessing backend, one container per node. Rank 0
# (the head) serves the API and hosts torch.distributed's store on the master port of its fabric
# address; every other node runs `vllm serve --headless` with its node rank and joins it.
#
# Supported vLLM versions: 0.13 and later (multi-node `mp`: --nnodes, --node-rank, --master-addr,
# --master-port and --headless, documented since December 2025); the Ray-less stock images are
# 0.18 and later. Checked against vLLM's ParallelConfig (master_addr, master_port 29501,
# node_rank, nnodes) and its multi-node serving guide.

variable "image" {
  type        = string
  description = "Image with vLLM (no Ray needed); the same image ID on every node. It must support the model's architecture."
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
  description = "Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8 (vLLM fetches it); or set `weights`."
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

variable "gpu_memory_utilization" {
  type        = number
  default     = 0.80
  description = "In (0, 0.95]; at most 0.85 on unified-memory nodes."
}

variable "overhead_gib" {
  type        = number
  default     = 8
  description = "Memory per node beyond the weights (activations, CUDA graphs, KV cache floor)."
}

variable "max_model_len" {
  type    = number
  default = null
}

variable "port" {
  type        = number
  default     = 8000
  description = "The API port of rank 0."
}

variable "extra_args" {
  type        = list(string)
  default     = []
  description = "More vllm serve flags, given to every rank (they are one process group)."
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
  description = "Seconds a vLLM start on a unified-memory node waits for its memory (after a stopped engine releases it) before it fails naming what holds the GPU."
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

variable "master_port" {
  type        = number
  default     = 29501
  description = "The port of torch.distributed's store on rank 0 (vLLM's default)."
  validation {
    condition     = var.master_port >= 1 && var.master_port <= 65535 && floor(var.master_port) == var.master_port
    error_message = "the master port must be a whole number from 1 to 65535, not ${var.master_port}"
  }
}

variable "rendezvous_timeout" {
  type        = string
  default     = "2m"
  description = "How long the rendezvous gate waits for every rank's connection from its fabric address."
}

variable "container_prefix" {
  type        = string
  default     = "sparkform"
  description = "Docker container names start with this; each rank's container is PREFIX-vllm-NODE."
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
  description = "The API key clients send as a bearer token (../vllm-serve: through vLLM's environment, never its command line); the output `auth_headers` carries it for probes."
}

variable "listen" {
  type        = string
  default     = "0.0.0.0"
  description = "The address the API server listens on; plan warns when it is beyond the node and there is no api_key."
}
