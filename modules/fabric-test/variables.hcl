variable "image" {
  type        = string
  description = "The deployment's vLLM image: the test runs torch's NCCL all-reduce in it, the NCCL vLLM will use. The same image ID on every node."
}

variable "network" {
  type        = any
  description = "The fabric (network.roce): each node's address and interface come from its attach."
}

variable "head" {
  type        = any
  description = "Rank 0: the node whose fabric address the ranks meet at."
}

variable "workers" {
  type        = any
  default     = []
  description = "The other nodes, one rank each."
}

variable "min_busbw_gbps" {
  type        = number
  description = "The floor: the all-reduce's bus bandwidth (GB/s, as nccl-tests reports it) at `size` below which the apply fails before what depends on the test starts. Two DGX Sparks over one 200 Gb/s cable reach about 24 with both RoCE ports named and MTU 9000; about 3 without."
}

variable "size" {
  type        = string
  default     = "1g"
  description = "The largest all-reduce buffer (the figure is read at this size). The 16 GiB of some guides has frozen a Spark with a desktop session."
}

variable "iterations" {
  type    = number
  default = 20
}

variable "port" {
  type        = number
  default     = 29600
  description = "The TCP port rank 0 listens on for the rendezvous, on its fabric address (not vLLM's master port, so a test may run beside a serving deployment)."
}

variable "timeout" {
  type        = string
  default     = "5m"
  description = "How long the whole test may take."
}

variable "gpu_devices" {
  type    = bool
  default = true
}

variable "rdma" {
  type        = bool
  default     = true
  description = "As the launchers' rdma: /dev/infiniband, IPC_LOCK and memlock unlimited in every rank's container."
}

variable "nccl_ib_hca" {
  type        = string
  default     = null
  description = "As the launchers' nccl_ib_hca: by default each node's active RDMA ports on the fabric, as the plan reads them."
}

variable "extra_env" {
  type        = map(string)
  default     = {}
  description = "More environment for every rank (pass the launcher's extra_env, so the test runs with what vLLM gets)."
}

variable "shm_size" {
  type    = string
  default = "16g"
}
