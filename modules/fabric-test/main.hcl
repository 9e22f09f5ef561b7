# The fabric's bandwidth, measured the way vLLM will use it before vLLM starts: one rank per node
# in one-shot containers of the deployment's image, with the environment, devices and limits the
# launchers give vLLM (../fabric-env), all-reducing over NCCL. Below the floor the apply fails,
# naming the figure and the transport NCCL chose, and rolls back. Give a launcher
# `depends_on = [module.NAME]` so it waits for the test; the test runs again only when it
# changes or what it depends on (the fabric's attachments) changes, never on a no-op plan, and
# `sparkform verify -target module.NAME.fabric_test.busbw` runs it on demand.
module "fabric" {
  source      = "../fabric-env"
  network     = var.network
  nodes       = concat([var.head], var.workers)
  extra_env   = var.extra_env
  shm_size    = var.shm_size
  gpu_devices = var.gpu_devices
  rdma        = var.rdma
  nccl_ib_hca = var.nccl_ib_hca
  # The test reports the transport NCCL chose (NCCL_DEBUG=INFO) rather than failing on it.
  nccl_socket_fallback = "warn"
}

fabric_test "busbw" {
  image          = var.image
  nodes          = module.fabric.nodes
  network        = var.network
  env            = module.fabric.node_env
  gpus           = module.fabric.gpus
  devices        = module.fabric.devices
  cap_add        = module.fabric.cap_add
  ulimits        = module.fabric.ulimits
  shm_size       = module.fabric.shm_size
  min_busbw_gbps = var.min_busbw_gbps
  size           = var.size
  iterations     = var.iterations
  port           = var.port
  timeout        = var.timeout
}
