# The seed deployment: two DGX Sparks behind a jump host, linked by a ConnectX-7 RoCE cable,
# serving Qwen3.5-122B-A10B-FP8 with tensor parallelism 2 over Ray.

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
  image = "hellohal2064/vllm-qwen3.5-gb10:latest"
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

network "roce" {
  subnet = "192.168.200.0/24"
  mtu    = 9000

  attach "spark1" {
    node      = node.spark1
    interface = "enp1s0f0np0"
    address   = "192.168.200.1"
  }
  attach "spark2" {
    node      = node.spark2
    interface = "enp1s0f0np0"
    address   = "192.168.200.2"
  }
}

# The weights, a resource per node: spark1 downloads them once from the hub and verifies them,
# spark2 copies them from spark1 over the RoCE link (hashing while it streams), and vLLM serves the
# local snapshot offline. The cache is the hub's usual folder of the user nvidia, with room for the
# weights on each node. Before the containers that serve the model start, a one-shot run of the
# image checks that its vLLM knows the model's architecture.
model "qwen" {
  repo        = "Qwen/Qwen3.5-122B-A10B-FP8"
  revision    = var.rev
  nodes       = [node.spark1, node.spark2]
  cache       = "/home/nvidia/.cache/huggingface/hub"
  network     = network.roce
  token       = var.hf_token
  image       = local.image
  serve_image = local.image
}

module "qwen" {
  source                 = "../../modules/vllm-ray"
  image                  = local.image
  network                = network.roce
  head                   = node.spark1
  workers                = [node.spark2]
  weights                = model.qwen
  model_size_gib         = 111
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  port                   = 30000
  # vLLM refuses --enable-auto-tool-choice without a --tool-call-parser (0.13.0 to 0.33.0,
  # bench/compat); qwen3_coder is the parser of Qwen3.5's tool-call format.
  extra_args = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"]
  api_key    = var.api_key
}

# Only a real chat completion proves that the model generates tokens.
probe "hello" {
  http {
    via     = node.spark1
    url     = "${module.qwen.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.qwen.auth_headers
    json = {
      model      = module.qwen.served_model_name
      max_tokens = 256
      messages   = [{ role = "user", content = "Hello! What model are you? Reply briefly." }]
    }
  }
  expect {
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "(?i)qwen"
  }
  timeout = "30m"
}

output "endpoint" {
  value = module.qwen.endpoint
}
