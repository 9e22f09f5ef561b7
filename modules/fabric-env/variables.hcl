# What every container of a multi-node GPU deployment on a fabric needs, whatever launches it
# (Ray in ../ray-cluster, vLLM's multiprocessing backend in ../vllm-mp): the fabric address and
# interface of each node, the environment that pins NCCL, Gloo, UCX and TensorPipe to the fabric,
# the RDMA devices and limits NCCL needs to use RoCE, and the log lines of known failures.
# It has no resources: the launchers read its outputs, so each fix is written here once.

variable "network" {
  type        = any
  description = "The fabric network (network.roce): its attachments give each node's address and interface."
}

variable "nodes" {
  type        = any
  description = "Every node of the deployment, the head first ([node.spark1, node.spark2])."

  # Checked here, once for every launcher: the launchers take their node lists from this
  # module's outputs, so a bad list stops at these messages instead of GPU counts or duplicate
  # keys further on.
  validation {
    condition     = !contains([for n in slice(var.nodes, 1, length(var.nodes)) : n.name], var.nodes[0].name)
    error_message = "the head node ${var.nodes[0].name} is also listed in workers: the head runs its own share of the model; remove ${var.nodes[0].name} from workers"
  }
  validation {
    condition     = length(distinct([for n in slice(var.nodes, 1, length(var.nodes)) : n.name if n.name != var.nodes[0].name])) == length([for n in slice(var.nodes, 1, length(var.nodes)) : n.name if n.name != var.nodes[0].name])
    error_message = "a worker is listed twice in workers (${join(", ", distinct([for i, n in var.nodes : n.name if i > 0 && length([for m in var.nodes : m if m.name == n.name]) > 1]))}): each node runs one worker; list it once"
  }
}

variable "head_address" {
  type        = string
  default     = null
  description = "The address the head listens on for the other nodes; by default the head node's fabric address. Set only to override, and only within the fabric subnet."
}

variable "extra_env" {
  type        = map(string)
  default     = {}
  description = "More environment for every container; wins over everything but VLLM_HOST_IP."
}

variable "launcher_env" {
  type        = map(string)
  default     = {}
  description = "Environment the launcher needs in every container (Ray's memory monitor switch); extra_env wins over it."
}

variable "shm_size" {
  type        = string
  default     = "16g"
  description = "Shared memory (/dev/shm) of every container: NCCL and vLLM's message queues live there, and Docker's 64 MiB default is too small."
}

variable "model_cache" {
  type        = string
  default     = null
  description = "A model block's cache folder (model.qwen.cache): mounted at the same path in every container, which then runs with HF_HUB_OFFLINE=1."
}

variable "hf_cache" {
  type        = string
  default     = "/root/.cache/huggingface"
  description = "Host folder with the Hugging Face cache, mounted in every container."
}

variable "jit_cache" {
  type        = string
  default     = "/var/cache/sparkform-jit"
  description = "Host folder of the compile and JIT caches (vLLM's torch.compile, Triton, TorchInductor, FlashInfer): each container mounts its image's own folder in it (IMAGE_ID under it), so a replacement with the same image skips compiling again and a new image starts clean. `destroy` keeps it unless -purge-caches. Null: no cache survives a container."
}

variable "gpu_devices" {
  type        = bool
  default     = true
  description = "Hand the nodes' GPUs to the containers. False on test beds without GPUs."
}

variable "rdma" {
  type        = bool
  default     = true
  description = "Give every container the RDMA devices (/dev/infiniband), IPC_LOCK and an unlimited memlock limit, so NCCL can use RoCE. False only where the nodes have no RDMA devices (the testbed)."
}

variable "nccl_ib_hca" {
  type        = string
  default     = null
  description = "NCCL_IB_HCA for every container, e.g. \"rocep1s0f1,roceP2p1s0f1\": with one cable, list both twin devices of the port (one alone gives about 3 GB/s). Unset: each node's active RDMA ports on the fabric, as the plan reads them (a warning when a declared value differs)."
}

variable "nccl_socket_fallback" {
  type        = string
  default     = "fail"
  description = "\"fail\": NCCL_DEBUG=INFO is set and a log showing NCCL on TCP sockets instead of RoCE fails the ready check; \"warn\": the same log line is reported as a warning and the start goes on; \"allow\": neither. Without rdma it is always allowed."

  validation {
    condition     = contains(["fail", "warn", "allow"], var.nccl_socket_fallback)
    error_message = "nccl_socket_fallback must be \"fail\", \"warn\" or \"allow\""
  }
}
