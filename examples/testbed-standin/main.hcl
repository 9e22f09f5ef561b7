# The seed deployment's modules on the local testbed (tests/testbed/testbed up && testbed ray &&
# testbed hub): two Docker-in-Docker nodes behind a jump host, a fabric at MTU 9000 on
# 192.168.200.0/24, real Ray, and a stand-in for `vllm serve` that places its TP×PP GPU bundles on
# the nodes exactly as vLLM does (each node declares one logical GPU) and answers chat
# completions. The weights come from the stand-in hub: node1 downloads them once, node2 copies
# them from node1 over the fabric, both verify them, and vLLM serves the local snapshot offline.

variable "testbed_dir" {
  type        = string
  default     = "/tmp/sparkform-testbed"
  description = "Where `testbed up` keeps its keys and known_hosts (SPARKFORM_TESTBED_DIR)."
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

variable "image" {
  type        = string
  default     = "sparkform-testbed/ray:latest"
  description = "The Ray and vLLM image; the apply checks that its vLLM knows the model's architecture before anything starts on it."
}

variable "probe_timeout" {
  type    = string
  default = "2m"
}

variable "max_model_len" {
  type    = number
  default = 8192
}

variable "expect_model" {
  type        = string
  default     = "Qwen"
  description = "What the hello probe expects the model to call itself."
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
  address       = "sf-node1"
  user          = "root"
  jump          = jump.testbed
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
  gpus          = 1
  gpu_devices   = false # no GPU on the testbed: the declared one is logical, for the placement checks
}

node "node2" {
  address       = "sf-node2"
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
    address   = "192.168.200.1"
  }
  attach "node2" {
    node      = node.node2
    interface = "enp1s0f0np0"
    address   = "192.168.200.2"
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
  serve_image = var.image
}

module "qwen" {
  source                 = "../../modules/vllm-ray"
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
  ray_args               = ["--object-store-memory=100000000", "--num-cpus=1"]
  health_timeout         = "5m"
  api_key                = var.api_key
}

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
    matches   = "(?i)${var.expect_model}"
  }
  timeout  = var.probe_timeout
  interval = "2s"
}

output "endpoint" {
  value = module.qwen.endpoint
}
