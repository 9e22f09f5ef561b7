# A Ray cluster on a fabric: one head container and one worker container per worker node,
# every one of them pinned to its node's fabric address (never the default route).

variable "image" {
  type        = string
  description = "Image with Ray (and vLLM, when the vllm-ray module uses this cluster)."
}

variable "network" {
  type        = any
  description = "The fabric network (network.roce): its attachments give each node's address and interface."
}

variable "head" {
  type        = any
  description = "The node that runs the Ray head (node.spark1)."
}

variable "workers" {
  type        = any
  default     = []
  description = "The nodes that run Ray workers ([node.spark2])."
}

variable "ray_port" {
  type    = number
  default = 6379
  validation {
    condition     = var.ray_port >= 1 && var.ray_port <= 65535 && floor(var.ray_port) == var.ray_port
    error_message = "the Ray port must be a whole number from 1 to 65535, not ${var.ray_port}"
  }
}

variable "shm_size" {
  type        = string
  default     = "16g"
  description = "Shared memory for Ray's object store and NCCL."
}

variable "model_cache" {
  type        = string
  default     = null
  description = "A model block's cache folder, mounted in every container (../fabric-env)."
}

variable "jit_cache" {
  type        = string
  default     = "/var/cache/sparkform-jit"
  description = "Host folder of the compile and JIT caches, one folder per image ID under it (../fabric-env); null: none survives a replacement."
}

variable "hf_cache" {
  type        = string
  default     = "/root/.cache/huggingface"
  description = "Host folder with the Hugging Face cache, mounted in every container."
}

variable "ray_tmp" {
  type        = string
  default     = "/tmp/ray"
  description = "Host folder for Ray's sockets and logs; the vLLM container mounts the same one."
}

variable "gpu_devices" {
  type        = bool
  default     = true
  description = "Hand the nodes' GPUs to the containers. False on test beds without GPUs (Ray still declares the node's gpus)."
}

variable "extra_env" {
  type    = map(string)
  default = {}
}

variable "container_prefix" {
  type        = string
  default     = "sparkform"
  description = "Docker container names start with this."
}

variable "head_address" {
  type        = string
  default     = null
  description = "The address Ray's head listens on; by default the head node's fabric address. Set only to override, and only within the fabric subnet."
}

variable "ray_args" {
  type        = list(string)
  default     = []
  description = "Extra arguments for every `ray start` (e.g. --object-store-memory=100000000)."
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
