# Replicas of one model, one vLLM per node, behind one router (../router): each replica is its
# own engine with its own probe, so a change replaces them one at a time while the others serve.
# The replicas' keys are their nodes' names; two replicas never share a node (its GPUs and
# memory are one engine's). A tensor-parallel replica over a pair of nodes is not offered here.

variable "image" {
  type        = string
  description = "Image with vLLM; the same image ID on every node. It must support the model's architecture."
}

variable "network" {
  type        = any
  description = "The fabric network (network.roce): each engine listens on its node's address there, which is where the router and the probes reach it."
}

variable "replicas" {
  type        = any
  description = "The nodes, one replica on each (a list of node references); at least one."
}

variable "weights" {
  type        = any
  description = "A model block (model.qwen) whose nodes include every replica's: each engine serves its node's verified copy, offline."
}

variable "served_model_name" {
  type    = string
  default = null
}

variable "model_size_gib" {
  type    = number
  default = null
}

variable "gpu_memory_utilization" {
  type    = number
  default = 0.80
}

variable "max_model_len" {
  type    = number
  default = null
}

variable "port" {
  type        = number
  default     = 8000
  description = "The port each engine listens on, on its node's fabric address."
}

variable "extra_args" {
  type    = list(string)
  default = []
}

variable "extra_env" {
  type    = map(string)
  default = {}
}

variable "executor" {
  type        = string
  default     = null
  description = "vLLM's `--distributed-executor-backend` for each engine: `uni` (one process: one GPU), `mp` (a worker process per GPU); unset, vLLM chooses."
}

variable "replica_env" {
  type        = map(map(string))
  default     = {}
  description = "More environment for one replica, by its node's name: `{ node1 = { VLLM_CPU_OMP_THREADS_BIND = \"0\" } }` (CPU builds on nodes that share cores bind each engine to its own)."
}

variable "shm_size" {
  type    = string
  default = "16g"
}

variable "hf_cache" {
  type    = string
  default = null
}

variable "jit_cache" {
  type    = string
  default = null
}

variable "gpu_devices" {
  type    = bool
  default = true
}

variable "rdma" {
  type    = bool
  default = true
}

variable "health_timeout" {
  type        = string
  default     = "30m"
  description = "How long an engine may take to answer /health once started."
}

variable "probe_timeout" {
  type        = string
  default     = "2m"
  description = "How long each replica's own completion probe keeps trying once its engine answers /health."
}

variable "container_prefix" {
  type    = string
  default = "sparkform"
}

variable "api_key" {
  type        = string
  default     = null
  sensitive   = true
  description = "The key clients send as `Authorization: Bearer KEY`: every engine and the router ask for it."
}

variable "router_node" {
  type        = any
  description = "The node the router runs on."
}

variable "router_image" {
  type        = string
  description = "The router's image: HAProxy and socat (../router)."
}

variable "router_port" {
  type    = number
  default = 8000
}

variable "router_address" {
  type        = string
  default     = null
  description = "How clients reach the router's node (its address by default)."
}

variable "drain_timeout" {
  type    = string
  default = "60s"
}
