# vLLM across the testbed's two nodes without Ray (modules/vllm-mp), after
# `tests/testbed/testbed up && testbed ray && testbed hub`: the same jump host, nodes, fabric and
# weights as examples/testbed-standin, and the vLLM stand-in in its multiprocessing mode (rank 0 on node1
# hosts the master port, node2 joins it headless; rank 0 answers only once every rank has joined).

variable "testbed_dir" {
  type        = string
  default     = "/tmp/sparkform-testbed"
  description = "Where `testbed up` keeps its keys and known_hosts (SPARKFORM_TESTBED_DIR)."
}

variable "nodes" {
  type        = list(string)
  default     = ["sf-node1", "sf-node2"]
  description = "The two testbed nodes it runs on, rank 0's first (`testbed up -n N` names them sf-node1 to sf-nodeN)."
}

variable "fabric_addresses" {
  type        = list(string)
  default     = ["192.168.200.1", "192.168.200.2"]
  description = "The two nodes' addresses on the fabric (192.168.200.0/24), in the order of `nodes`."
}

variable "rev" {
  type        = string
  default     = "main"
  description = "The model's revision on the hub: a branch, a tag or a 40-hex commit (the stand-in hub has `main` and `v2`)."
}

variable "hub" {
  type        = string
  default     = "http://10.199.0.3:8080"
  description = "The hub the download node fetches from: `testbed hub` serves one on the management network."
}

variable "hf_token" {
  type        = string
  default     = null
  ephemeral   = true
  description = "A token, if the hub asks for one (the stand-in asks with --token-file): set SPARKFORM_VAR_hf_token in the environment. Ephemeral: the download uses it, and neither the state nor a plan file holds it, not even hashed."
}

variable "max_model_len" {
  type    = number
  default = 8192
}

variable "probe_timeout" {
  type    = string
  default = "2m"
}

variable "rendezvous_timeout" {
  type    = string
  default = "1m"
}

variable "memory_release_timeout" {
  type        = number
  default     = 120
  description = "Seconds a rank's start waits for its node's memory on a unified-memory node (`testbed gpu NODE on` fakes one)."
}

variable "standin_wedge_after" {
  type        = number
  default     = 0
  description = "The vLLM stand-in wedges after this many chat completions (0: never), for `sparkform watch`."
}

variable "standin_compile_secs" {
  type        = number
  default     = 0
  description = "Seconds the vLLM stand-in's torch.compile takes when its cache folder holds nothing for the image and model (a warm one loads at once)."
}

variable "image" {
  type        = string
  default     = "sparkform-testbed/ray:latest"
  description = "The image of the ranks; another build (another image ID) gets a cache folder of its own."
}

variable "api_key" {
  type        = string
  default     = "sparkform-testbed-key"
  sensitive   = true
  description = "The endpoint's API key. The testbed's is a throwaway written here; a real deployment passes its own in SPARKFORM_VAR_api_key and writes it in no file."
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
  gpu_devices   = false # no GPU on the testbed: the declared one is logical, for the placement checks
}

node "node2" {
  address       = var.nodes[1]
  user          = "root"
  jump          = jump.testbed
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
  gpus          = 1
  gpu_devices   = false # no GPU on the testbed: the declared one is logical, for the placement checks
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

# One resource per node: model.qwen["node1"] downloads, model.qwen["node2"] pulls over the fabric.
model "qwen" {
  repo        = "testbed/standin-qwen3"
  revision    = var.rev
  nodes       = [node.node1, node.node2]
  cache       = "/tmp/sparkform-models"
  network     = network.roce
  image       = "sparkform-testbed/ray:latest"
  endpoint    = var.hub
  token       = var.hf_token
  serve_image = "sparkform-testbed/ray:latest"
}

module "qwen" {
  source                 = "../../modules/vllm-mp"
  image                  = var.image
  network                = network.roce
  head                   = node.node1
  workers                = [node.node2]
  weights                = model.qwen
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  max_model_len          = var.max_model_len
  port                   = 30000
  hf_cache               = "/tmp/sparkform-hf-cache"
  shm_size               = "1g"
  rdma                   = false # the testbed's nodes have no /dev/infiniband
  health_timeout         = "3m"
  rendezvous_timeout     = var.rendezvous_timeout
  memory_release_timeout = var.memory_release_timeout
  extra_env = merge(
    var.standin_wedge_after > 0 ? { VLLM_STANDIN_WEDGE_AFTER = tostring(var.standin_wedge_after) } : {},
    var.standin_compile_secs > 0 ? { VLLM_STANDIN_COMPILE_SECS = tostring(var.standin_compile_secs) } : {},
  )
  api_key = var.api_key
}

# The stand-in's answer names the fabric address of every rank that joined rank 0.
probe "hello" {
  http {
    via     = node.node1
    url     = "${module.qwen.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.qwen.auth_headers
    json = {
      model      = module.qwen.served_model_name
      max_tokens = 64
      messages   = [{ role = "user", content = "Hello! What model are you? Reply briefly." }]
    }
  }
  expect {
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "(?i)qwen"
  }
  timeout  = var.probe_timeout
  interval = "2s"
}

output "endpoint" {
  value = module.qwen.endpoint
}
