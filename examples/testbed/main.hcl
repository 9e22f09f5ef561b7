# The seed deployment's modules on the local testbed (tests/testbed/testbed up && testbed ray):
# two Docker-in-Docker nodes behind a jump host, a fabric at MTU 9000 on 192.168.200.0/24, real
# Ray, and a stand-in for `vllm serve` that places its TP×PP GPU bundles on the nodes exactly as
# vLLM does (each node declares one logical GPU) and answers chat completions.

variable "testbed_dir" {
  type        = string
  default     = "/tmp/sparkform-testbed"
  description = "Where `testbed up` keeps its keys and known_hosts (SPARKFORM_TESTBED_DIR)."
}

variable "model" {
  type    = string
  default = "Qwen/Qwen3-0.6B"
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

module "qwen" {
  source                 = "../../modules/vllm-ray"
  image                  = "sparkform-testbed/ray:latest"
  network                = network.roce
  head                   = node.node1
  workers                = [node.node2]
  model                  = var.model
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  max_model_len          = var.max_model_len
  port                   = 30000
  hf_cache               = "/tmp/sparkform-hf-cache"
  shm_size               = "1g"
  rdma                   = false # the testbed's nodes have no /dev/infiniband
  ray_args               = ["--object-store-memory=100000000", "--num-cpus=1"]
  health_timeout         = "5m"
}

probe "hello" {
  http {
    via    = node.node1
    url    = "${module.qwen.endpoint}/v1/chat/completions"
    method = "POST"
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
