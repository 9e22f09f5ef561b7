# The part of `vllm serve` that does not depend on how vLLM reaches the other nodes: the model,
# its parallelism, memory and server flags, and the plan-time checks on them. ../vllm-ray and
# ../vllm-mp put their launcher's flags between `serve_args` and `server_args`.

variable "model" {
  type        = string
  default     = null
  description = "Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8 (vLLM fetches it); or set `weights`."
}

variable "weights" {
  type        = any
  default     = null
  description = "A model block (model.qwen): vLLM serves its verified local snapshot (`path`) offline, and the memory check uses its size."
}

variable "served_model_name" {
  type    = string
  default = null
}

variable "memory_release_timeout" {
  type        = number
  default     = 120
  description = "Seconds a vLLM start on a unified-memory node waits for its memory (an engine that stopped releasing it) before it fails naming what holds the GPU."
}

variable "nodes" {
  type        = any
  description = "Every node the model is spread over."
}

variable "model_size_gib" {
  type    = number
  default = null
}

variable "tensor_parallel_size" {
  type    = number
  default = 1
}

variable "pipeline_parallel_size" {
  type    = number
  default = 1
}

variable "engine" {
  type        = any
  default     = { name = "vLLM", memory_setting = "gpu_memory_utilization" }
  description = "Who serves, for the checks' messages: its name and the launcher's variable for the memory share (../sglang-mp reuses the checks, outputs and memory needs; its command is its own)."
}

variable "gpu_memory_utilization" {
  type    = number
  default = 0.80

  validation {
    condition     = var.gpu_memory_utilization > 0 && var.gpu_memory_utilization <= 0.95
    error_message = "gpu_memory_utilization must be in (0, 0.95]"
  }
}

variable "overhead_gib" {
  type    = number
  default = 8
}

variable "max_model_len" {
  type    = number
  default = null
}

variable "port" {
  type    = number
  default = 8000
  validation {
    condition     = var.port >= 1 && var.port <= 65535 && floor(var.port) == var.port
    error_message = "the API port must be a whole number from 1 to 65535, not ${var.port}"
  }
}

variable "extra_args" {
  type    = list(string)
  default = []
}

variable "large_model_gib" {
  type        = number
  default     = 30
  description = "From this size on (or when the size is unknown) --enforce-eager earns a plan warning."
}

variable "api_key" {
  type        = string
  default     = null
  sensitive   = true
  description = "The key clients send as `Authorization: Bearer KEY` on /v1 (vLLM's VLLM_API_KEY: it reaches vLLM through its environment, never its command line). Pass it from a sensitive variable (SPARKFORM_VAR_api_key); the state keeps only its keyed hash."
}

variable "listen" {
  type        = string
  default     = "0.0.0.0"
  description = "The address the API server listens on (`--host`): every network of the node by default; 127.0.0.1 keeps it to the node (reach it with `sparkform tunnel`)."
}
