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
  description = "Hugging Face model id, e.g. Qwen/Qwen3.5-122B-A10B-FP8."
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
  type    = number
  default = 0.80

  validation {
    condition     = var.gpu_memory_utilization > 0 && var.gpu_memory_utilization <= 0.95
    error_message = "gpu_memory_utilization must be in (0, 0.95]"
  }
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
