# examples/testbed-mp with the fabric's bandwidth gating vLLM (modules/fabric-test), after
# `tests/testbed/testbed up && testbed ray && testbed hub`: before any rank of vLLM starts, an
# all-reduce between the two nodes must reach min_busbw_gbps, or the apply fails and rolls back.
# The testbed has no GPU and no NCCL: the test's ranks run sparkform's real test program against
# the testbed's torch stand-in, which exchanges the ranks' values over the fabric for real and
# takes as long as standin_busbw_gbps says.

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

variable "min_busbw_gbps" {
  type        = number
  default     = 2
  description = "The floor the fabric test gates vLLM on (GB/s)."
}

variable "standin_busbw_gbps" {
  type        = number
  default     = 10
  description = "The bus bandwidth the testbed's torch stand-in takes as long as (GB/s): below min_busbw_gbps the apply fails before vLLM starts."
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
  serve_image = "sparkform-testbed/ray:latest"
}

module "fabric_test" {
  source         = "../../modules/fabric-test"
  image          = "sparkform-testbed/ray:latest"
  network        = network.roce
  head           = node.node1
  workers        = [node.node2]
  min_busbw_gbps = var.min_busbw_gbps
  size           = "64m"
  iterations     = 5
  timeout        = "1m"
  shm_size       = "1g"
  rdma           = false # the testbed's nodes have no /dev/infiniband
  extra_env = {
    PYTHONPATH                   = "/opt/sparkform-standin" # the torch stand-in (testbed only)
    SPARKFORM_STANDIN_BUSBW_GBPS = tostring(var.standin_busbw_gbps)
    NCCL_DEBUG                   = "INFO"
  }
}

module "qwen" {
  source                 = "../../modules/vllm-mp"
  depends_on             = [module.fabric_test.test]
  image                  = "sparkform-testbed/ray:latest"
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
  api_key                = var.api_key
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
