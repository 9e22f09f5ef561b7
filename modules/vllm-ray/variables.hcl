# vLLM served across a Ray cluster: the Ray head and workers from ../ray-cluster, and vLLM in a
# container of its own on the head node, so changing a vLLM flag replaces only that container.

variable "image" {
  type        = string
  description = "Image with vLLM and Ray; it must support the model's architecture."
}

variable "network" {
  type        = any
  description = "The fabric network (network.roce)."
}

variable "head" {
  type        = any
  description = "The node running the Ray head and vLLM."
}

variable "workers" {
  type    = any
  default = []
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
  type    = number
  default = 8000
}

variable "extra_args" {
  type    = list(string)
  default = []
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
  description = "How long vLLM may take to load the weights and answer /health."
}

variable "head_address" {
  type    = string
  default = null
}

variable "ray_args" {
  type    = list(string)
  default = []
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
