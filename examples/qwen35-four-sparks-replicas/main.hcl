# Qwen3.5-122B on four DGX Sparks as two replicas, each tensor parallel over a pair (vLLM's own
# multi-node mode, modules/vllm-mp), behind one HAProxy on spark1 (modules/router): one
# endpoint, requests spread across the pairs, and a change that replaces the engines rolls
# through them one pair at a time, so the endpoint keeps answering (docs/replicas.md).
#
#   sparkform plan examples/qwen35-four-sparks-replicas

variable "rev" {
  type        = string
  default     = "main"
  description = "The model's revision: a branch, a tag or a 40-hex commit. The plan resolves it to a commit on spark1 and the state pins that; pin a commit here to keep it."
}

variable "hf_token" {
  type        = string
  default     = null
  ephemeral   = true
  description = "A Hugging Face token, if the hub asks for one: set SPARKFORM_VAR_hf_token in the environment, never in a committed file. Ephemeral: the download uses it, and neither the state nor a plan file holds it, not even hashed."
}

variable "api_key" {
  type        = string
  default     = null
  sensitive   = true
  description = "The endpoint's API key (clients send `Authorization: Bearer KEY`): set SPARKFORM_VAR_api_key. Without one, plan warns that anyone on the nodes' networks can use the model."
}

locals {
  image = "vllm/vllm-openai:v0.21.0"
  # vLLM refuses --enable-auto-tool-choice without a --tool-call-parser (0.13.0 to 0.33.0,
  # bench/compat); qwen3_coder is the parser of Qwen3.5's tool-call format.
  extra_args = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"]
  sparks     = { spark1 = "192.168.200.1", spark2 = "192.168.200.2", spark3 = "192.168.200.3", spark4 = "192.168.200.4" }
}

jump "proxmox" {
  address = "10.1.230.180"
  user    = "root"
}

node "spark1" {
  address        = "spark1"
  user           = "nvidia"
  jump           = jump.proxmox
  gpus           = 1
  memory_gib     = 120
  unified_memory = true
}

node "spark2" {
  address        = "spark2"
  user           = "nvidia"
  jump           = jump.proxmox
  gpus           = 1
  memory_gib     = 120
  unified_memory = true
}

node "spark3" {
  address        = "spark3"
  user           = "nvidia"
  jump           = jump.proxmox
  gpus           = 1
  memory_gib     = 120
  unified_memory = true
}

node "spark4" {
  address        = "spark4"
  user           = "nvidia"
  jump           = jump.proxmox
  gpus           = 1
  memory_gib     = 120
  unified_memory = true
}

# One switch between the four: each pair's ranks talk over it, and HAProxy on spark1 reaches
# pair b's rank 0 there too.
network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000

  attach "spark1" {
    node      = node.spark1
    interface = "enp1s0f0np0"
    address   = local.sparks.spark1
  }
  attach "spark2" {
    node      = node.spark2
    interface = "enp1s0f0np0"
    address   = local.sparks.spark2
  }
  attach "spark3" {
    node      = node.spark3
    interface = "enp1s0f0np0"
    address   = local.sparks.spark3
  }
  attach "spark4" {
    node      = node.spark4
    interface = "enp1s0f0np0"
    address   = local.sparks.spark4
  }
}

model "qwen" {
  repo        = "Qwen/Qwen3.5-122B-A10B-FP8"
  revision    = var.rev
  nodes       = [node.spark1, node.spark2, node.spark3, node.spark4]
  cache       = "/home/nvidia/.cache/huggingface/hub"
  network     = network.roce
  token       = var.hf_token
  image       = local.image
  serve_image = local.image
}

module "pair_a" {
  source                 = "../../modules/vllm-mp"
  image                  = local.image
  network                = network.roce
  head                   = node.spark1
  workers                = [node.spark2]
  weights                = model.qwen
  model_size_gib         = 111
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  port                   = 30000
  extra_args             = local.extra_args
  nccl_ib_hca            = "rocep1s0f0,roceP2p1s0f0"
  api_key                = var.api_key
}

module "pair_b" {
  source                 = "../../modules/vllm-mp"
  image                  = local.image
  network                = network.roce
  head                   = node.spark3
  workers                = [node.spark4]
  weights                = model.qwen
  model_size_gib         = 111
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  port                   = 30000
  extra_args             = local.extra_args
  nccl_ib_hca            = "rocep1s0f0,roceP2p1s0f0"
  api_key                = var.api_key
}

# Each pair answers a real completion on its own before the router sends it anything.
probe "direct_a" {
  http {
    via     = node.spark1
    url     = "${module.pair_a.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.pair_a.auth_headers
    json = {
      model      = module.pair_a.served_model_name
      max_tokens = 16
      messages   = [{ role = "user", content = "Hello!" }]
    }
  }
  expect {
    status = 200
  }
  timeout = "30m"
}

probe "direct_b" {
  http {
    via     = node.spark1
    url     = "${module.pair_b.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.pair_b.auth_headers
    json = {
      model      = module.pair_b.served_model_name
      max_tokens = 16
      messages   = [{ role = "user", content = "Hello!" }]
    }
  }
  expect {
    status = 200
  }
  timeout = "30m"
}

module "router" {
  source  = "../../modules/router"
  node    = node.spark1
  image   = "haproxy:2.6-with-socat" # HAProxy 2.4 or later with socat: build one FROM debian:bookworm with `apt-get install haproxy socat`
  port    = 8000
  api_key = var.api_key
  replicas = {
    a = { address = module.pair_a.replica.address, members = concat(module.pair_a.replica.members, [probe.direct_a]) }
    b = { address = module.pair_b.replica.address, members = concat(module.pair_b.replica.members, [probe.direct_b]) }
  }
}

probe "hello" {
  http {
    via     = node.spark1
    url     = "${module.router.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.pair_a.auth_headers
    json = {
      model      = module.pair_a.served_model_name
      max_tokens = 256
      messages   = [{ role = "user", content = "Hello! What model are you? Reply briefly." }]
    }
  }
  expect {
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "(?i)qwen"
  }
  timeout = "5m"
}

output "endpoint" {
  value = module.router.endpoint
}
