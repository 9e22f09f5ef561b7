# The seed deployment: two DGX Sparks behind a jump host, linked by a ConnectX-7 RoCE cable,
# serving Qwen3.5-122B-A10B-FP8 with tensor parallelism 2 over Ray.

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

module "qwen" {
  source                 = "../../modules/vllm-ray"
  image                  = "hellohal2064/vllm-qwen3.5-gb10:latest"
  network                = network.roce
  head                   = node.spark1
  workers                = [node.spark2]
  model                  = "Qwen/Qwen3.5-122B-A10B-FP8"
  model_size_gib         = 111
  tensor_parallel_size   = 2
  gpu_memory_utilization = 0.80
  port                   = 30000
  extra_args             = ["--enable-auto-tool-choice", "--reasoning-parser", "qwen3"]
}

# Only a real chat completion proves that the model generates tokens.
probe "hello" {
  http {
    via    = node.spark1
    url    = "${module.qwen.endpoint}/v1/chat/completions"
    method = "POST"
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
