# The real vLLM across the local testbed's two nodes (tests/testbed/testbed up && testbed ray &&
# testbed engine && testbed hub): two Docker-in-Docker nodes behind a jump host, a fabric at
# MTU 9000 on 192.168.200.0/24, and vLLM's CPU build serving a tiny real Qwen3 with tensor
# parallelism 2, one rank per node (modules/vllm-mp: rank 0 on node1 holds the master port and
# the API, node2 joins it headless; torch.distributed runs over the fabric). The weights come
# from the stand-in hub: node1 downloads them once, node2 copies them from node1 over the fabric,
# both verify them, and vLLM loads the local snapshot offline.
#
# vLLM's Ray executor is not used here: this CPU build refuses it ("current platform cpu does
# not support ray"), so the seed's Ray layout runs on the stand-in (examples/testbed-standin).
# What a CPU build needs that a GPU does not is set below, never in a module: the KV cache's
# size in GiB (VLLM_CPU_KVCACHE_SPACE), a short context, and vLLM's older compile cache
# (VLLM_USE_AOT_COMPILE=0): this build's AOT cache cannot be loaded back ("Compiling model again
# due to a load failure ... 'function' object has no attribute 'finalize_loading'"), so with it
# a warm start compiled again (46.5 s against 81.1 s cold), while Inductor's own cache, which the
# module mounts per image, cuts the compile to about 40 % of a cold one (BENCHMARKS.md).

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
  description = "The model's revision on the hub: a branch, a tag or a 40-hex commit (the stand-in hub's tiny Qwen3 has `main` and `v2`, with different weights)."
}

variable "repo" {
  type        = string
  default     = "testbed/tiny-qwen3"
  description = "The model on the hub: a tiny Qwen3 (2 layers, hidden size 256) with real weights, tokenizer and chat template."
}

variable "hub" {
  type        = string
  default     = "http://10.199.0.3:8080"
  description = "The hub the download node fetches from: `testbed hub` serves one on the management network."
}

variable "image" {
  type        = string
  default     = "sparkform-testbed/vllm-cpu:latest"
  description = "The ranks' image: the real vLLM, its CPU build (`testbed engine`). The apply checks that its vLLM knows the model's architecture before anything starts on it."
}

variable "max_model_len" {
  type    = number
  default = 512
}

variable "kv_cache_gib" {
  type        = number
  default     = 1
  description = "The KV cache of each rank, in GiB: a CPU build sizes it from VLLM_CPU_KVCACHE_SPACE, not from gpu_memory_utilization."
}

variable "extra_args" {
  type        = list(string)
  default     = []
  description = "More `vllm serve` flags for every rank."
}

variable "probe_timeout" {
  type    = string
  default = "2m"
}

variable "health_timeout" {
  type        = string
  default     = "8m"
  description = "How long a rank waits for rank 0's /health: a cold start compiles the model on two shared cores."
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
  gpu_devices   = false # no GPU on the testbed: one rank per node, counted as its logical GPU
}

node "node2" {
  address       = var.nodes[1]
  user          = "root"
  jump          = jump.testbed
  identity_file = "${var.testbed_dir}/id_ed25519"
  known_hosts   = "${var.testbed_dir}/known_hosts"
  gpus          = 1
  gpu_devices   = false # no GPU on the testbed: one rank per node, counted as its logical GPU
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
  health_timeout         = var.health_timeout
  rendezvous_timeout     = "2m"
  extra_args             = var.extra_args
  extra_env = {
    VLLM_CPU_KVCACHE_SPACE = tostring(var.kv_cache_gib)
    VLLM_USE_AOT_COMPILE   = "0"
  }
  api_key = var.api_key
}

# A real completion through both ranks: the random weights say nothing sensible, so the probe
# asks for at least 4 tokens, greedily (the same weights, the same text), and wants some text.
probe "hello" {
  http {
    via     = node.node1
    url     = "${module.qwen.endpoint}/v1/chat/completions"
    method  = "POST"
    headers = module.qwen.auth_headers
    json = {
      model       = module.qwen.served_model_name
      max_tokens  = 16
      min_tokens  = 4
      temperature = 0
      messages    = [{ role = "user", content = "Hello! What model are you? Reply briefly." }]
    }
  }
  expect {
    status    = 200
    json_path = "choices[0].message.content"
    matches   = "\\S"
  }
  timeout  = var.probe_timeout
  interval = "2s"
}

variable "regression" {
  type        = map(string)
  default     = {}
  description = "How far the benchmark's figures may move from the last good generation's, such as { throughput = \"-10%\" }: none by default, since the testbed's two cores are shared with whatever else runs."
}

# The model's speed: vLLM's own benchmark client (`vllm bench serve`) run from the deployment's
# image on the head node against the endpoint, after every change of what serves it. Its figures
# (output tokens per second, time to first token, inter-token latency) are recorded with the
# generation and shown by `sparkform status`; `verify -target probe.speed` runs it on demand.
probe "speed" {
  timeout    = "5m"
  depends_on = [probe.hello]
  bench {
    node          = node.node1
    image         = var.image
    url           = module.qwen.endpoint
    model         = module.qwen.served_model_name
    tokenizer     = model.qwen.path
    api_key       = var.api_key
    requests      = 8
    concurrency   = 4
    input_tokens  = 32
    output_tokens = 16
    max_model_len = var.max_model_len
  }
  regression {
    throughput = lookup(var.regression, "throughput", null)
    ttft_p99   = lookup(var.regression, "ttft_p99", null)
  }
}

output "endpoint" {
  value = module.qwen.endpoint
}
