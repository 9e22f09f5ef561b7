# Two replicas of one model behind one router on the local testbed (tests/testbed/testbed up &&
# testbed ray && testbed router && testbed hub): one engine on each node, HAProxy on the first
# node in front of both. A change that replaces the engines (a flag, an image, the weights' revision)
# rolls through them: each replica is taken out of the router, replaced, checked with its own
# completion, and put back before the next, so the endpoint keeps answering. The engine is the
# vLLM stand-in by default; `-var image=sparkform-testbed/vllm-cpu:latest` (after `testbed
# engine`) runs the real vLLM, its CPU build.

variable "testbed_dir" {
  type        = string
  default     = "/tmp/sparkform-testbed"
  description = "Where `testbed up` keeps its keys and known_hosts (SPARKFORM_TESTBED_DIR)."
}

variable "nodes" {
  type        = list(string)
  default     = ["sf-node1", "sf-node2"]
  description = "The two testbed nodes, one replica on each; the router runs on the first."
}

variable "replicas" {
  type        = number
  default     = 2
  description = "How many replicas serve, one per node in the order of `nodes`: changing it adds or removes replicas behind the router, which keeps serving."
  validation {
    condition     = var.replicas >= 1 && var.replicas <= 2 && floor(var.replicas) == var.replicas
    error_message = "replicas must be 1 or 2: the testbed pair has two nodes, one replica each"
  }
}

variable "fabric_addresses" {
  type        = list(string)
  default     = ["192.168.200.1", "192.168.200.2"]
  description = "The two nodes' addresses on the fabric, in the order of `nodes`: each engine listens there."
}

variable "rev" {
  type    = string
  default = "main"
}

variable "repo" {
  type        = string
  default     = "testbed/standin-qwen3"
  description = "The model on the hub (the real engine needs testbed/tiny-qwen3)."
}

variable "hub" {
  type    = string
  default = "http://10.199.0.3:8080"
}

variable "image" {
  type        = string
  default     = "sparkform-testbed/ray:latest"
  description = "The engines' image: the vLLM stand-in, or the real vLLM's CPU build (sparkform-testbed/vllm-cpu:latest)."
}

variable "router_image" {
  type        = string
  default     = "sparkform-testbed/router:latest"
  description = "HAProxy and socat from Debian (`testbed router`)."
}

variable "max_model_len" {
  type    = number
  default = 512
}

variable "extra_args" {
  type        = list(string)
  default     = []
  description = "More `vllm serve` flags for every replica: changing them rolls through the replicas."
}

variable "extra_env" {
  type        = map(string)
  default     = { VLLM_CPU_KVCACHE_SPACE = "1", VLLM_USE_AOT_COMPILE = "0" }
  description = "What a CPU build needs (the stand-in ignores it): see examples/testbed."
}

variable "health_timeout" {
  type        = string
  default     = "8m"
  description = "How long an engine may take to answer /health: the real engine compiles its model on two shared cores."
}

variable "executor" {
  type        = string
  default     = "mp"
  description = "vLLM's executor in each engine: the stand-in serves without Ray with `mp`; the real CPU build runs one process with `uni`."
}

variable "replica_env" {
  type        = map(map(string))
  default     = { node1 = { VLLM_CPU_OMP_THREADS_BIND = "0" }, node2 = { VLLM_CPU_OMP_THREADS_BIND = "1" } }
  description = "The testbed's nodes share the machine's cores: each CPU engine gets its own (the stand-in ignores it)."
}

variable "api_key" {
  type        = string
  default     = "sparkform-testbed-key"
  sensitive   = true
  description = "The endpoint's API key: a throwaway for the testbed; a real deployment passes its own in SPARKFORM_VAR_api_key."
}

jump "testbed" {
  address       = "127.0.0.1"
  user          = "root"
  port          = 2222
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
}

node "node1" {
  address       = var.nodes[0]
  user          = "root"
  jump          = jump.testbed
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
  gpus          = 1
  gpu_devices   = false # no GPU on the testbed: one engine per node, counted as its logical GPU
}

node "node2" {
  address       = var.nodes[1]
  user          = "root"
  jump          = jump.testbed
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
  gpus          = 1
  gpu_devices   = false # no GPU on the testbed: one engine per node, counted as its logical GPU
}

network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000

  attach "node1" {
    node      = node.node1
    interface = "enp1s0f0np0"
    address   = var.fabric_addresses[0]
  }
  attach "node2" {
    node      = node.node2
    interface = "enp1s0f0np0"
    address   = var.fabric_addresses[1]
  }
}

model "qwen" {
  repo        = var.repo
  revision    = var.rev
  nodes       = [node.node1, node.node2]
  cache       = "/tmp/sparkform-models"
  network     = network.roce
  image       = "sparkform-testbed/ray:latest"
  endpoint    = var.hub
  serve_image = var.image
}

module "qwen" {
  source         = "../../modules/vllm-replicas"
  image          = var.image
  network        = network.roce
  replicas       = slice([node.node1, node.node2], 0, var.replicas)
  weights        = model.qwen
  max_model_len  = var.max_model_len
  port           = 30000
  hf_cache       = "/tmp/sparkform-hf-cache"
  shm_size       = "1g"
  rdma           = false # the testbed's nodes have no /dev/infiniband
  gpu_devices    = false
  health_timeout = "8m"
  extra_args     = var.extra_args
  extra_env      = var.extra_env
  replica_env    = var.replica_env
  executor       = var.executor
  api_key        = var.api_key
  router_node    = node.node1
  router_image   = var.router_image
  router_port    = 8000
  router_address = var.fabric_addresses[0]
  drain_timeout  = "30s"
}

# A real completion through the router: what a client of the endpoint gets.
probe "hello" {
  http {
    via     = node.node1
    url     = "${module.qwen.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.qwen.auth_headers
    json = {
      model      = module.qwen.served_model_name
      max_tokens = 16
      messages   = [{ role = "user", content = "Hello! What model are you? Reply briefly." }]
    }
  }
  expect {
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "\\S"
  }
  timeout  = "2m"
  interval = "2s"
}

output "endpoint" {
  value = module.qwen.endpoint
}
