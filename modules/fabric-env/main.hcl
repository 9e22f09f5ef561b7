locals {
  attach = { for a in values(var.network.attach) : a.node.name => a }
  head   = var.nodes[0]
  # A node without an attachment is reported once, by the check every_node_on_fabric: the
  # values below skip it rather than fail on a missing key.
  addr       = { for n, a in local.attach : n => a.address }
  head_ip    = var.head_address == null ? lookup(local.addr, local.head.name, null) : var.head_address
  missing    = [for n in var.nodes : n.name if !contains(keys(local.attach), n.name)]
  interfaces = distinct([for n in var.nodes : local.attach[n.name].interface if contains(keys(local.attach), n.name)])
  interface  = length(local.interfaces) > 0 ? local.interfaces[0] : null

  # Without RDMA devices NCCL can only use sockets, so there is nothing to detect.
  detect_socket_fallback = var.rdma && var.nccl_socket_fallback != "allow"
  socket_fallback = {
    "NET/Socket : Using|Using network Socket" = "NCCL runs over TCP sockets, not RoCE: the container needs /dev/infiniband, IPC_LOCK and an unlimited memlock limit (rdma = true), NCCL_IB_HCA must name RoCE devices that exist and are up (ibdev2netdev), and NCCL_IB_DISABLE must not be 1; set nccl_socket_fallback = \"allow\" to accept sockets"
  }

  # Where the compile and JIT caches live in a container: vLLM's torch.compile artefacts
  # (VLLM_CACHE_ROOT, default ~/.cache/vllm), Triton's kernels (TRITON_CACHE_DIR, default
  # ~/.triton/cache), TorchInductor's (TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_USER)
  # and FlashInfer's JIT modules (FLASHINFER_WORKSPACE_BASE, default HOME: ~/.cache/flashinfer).
  # A cold start on a Spark spends minutes filling them; the container kind mounts the node's
  # folder for the container's image ID here, so only the same image ever reads them.
  jit_path = "/root/.cache/sparkform-jit"

  # NCCL, Gloo, UCX and TensorPipe pick the fabric interface instead of the default route.
  env = merge(
    {
      NCCL_SOCKET_IFNAME = local.interface
      GLOO_SOCKET_IFNAME = local.interface
      UCX_NET_DEVICES    = local.interface
      TP_SOCKET_IFNAME   = local.interface
      HF_HOME            = "/root/.cache/huggingface"
    },
    var.nccl_ib_hca == null ? {} : { NCCL_IB_HCA = var.nccl_ib_hca },
    # Every compile and JIT cache in the folder that outlives the container (`cache` below).
    var.jit_cache == null ? {} : {
      VLLM_CACHE_ROOT           = "${local.jit_path}/vllm"
      TRITON_CACHE_DIR          = "${local.jit_path}/triton"
      TORCHINDUCTOR_CACHE_DIR   = "${local.jit_path}/inductor"
      FLASHINFER_WORKSPACE_BASE = "${local.jit_path}/flashinfer"
    },
    # No start reaches the internet: vLLM's usage report and the libraries' telemetry stay off
    # (nodes behind a jump host often cannot reach it, and a start must not wait on it).
    { VLLM_NO_USAGE_STATS = "1", DO_NOT_TRACK = "1", HF_HUB_DISABLE_TELEMETRY = "1" },
    # The weights are on every node, verified: nothing is to be fetched from the hub, by the
    # hub's library or by transformers (the tokenizer, the config).
    var.model_cache == null ? {} : { HF_HUB_OFFLINE = "1", TRANSFORMERS_OFFLINE = "1" },
    # NCCL names the transport it chose only at INFO level; the fallback signature needs it.
    local.detect_socket_fallback ? { NCCL_DEBUG = "INFO" } : {},
    var.launcher_env,
    var.extra_env,
  )

  # The RDMA ports on the fabric and the RoCE v2 GID index of each node's fabric address, as the
  # plan read them from the node's sysfs (attach.x.roce): NCCL is told what each node has now,
  # never a pinned value that a reboot or a firmware update moves. With one cable on a DGX Spark
  # the port's twin device is on the fabric too, and both must be named (else about 3 GB/s).
  roce       = var.rdma ? { for n, a in local.attach : n => a.roce if a.roce != null } : {}
  hca        = { for n, r in local.roce : n => "=${join(",", r.ports)}" }
  gid_index  = { for n, r in local.roce : n => tostring(r.gid_index) if r.gid_index != null }
  pinned_gid = lookup(var.extra_env, "NCCL_IB_GID_INDEX", null)
  # What a declared nccl_ib_hca names, by device (an exclusion list, `^…`, is not compared).
  declared_hca = var.nccl_ib_hca == null || startswith(coalesce(var.nccl_ib_hca, "-"), "^") ? null : [
    for d in split(",", trimprefix(var.nccl_ib_hca, "=")) : split(":", trimspace(d))[0]
  ]
  hca_devices = { for n, r in local.roce : n => distinct([for p in r.ports : split(":", p)[0]]) }
  hca_differs = local.declared_hca == null ? [] : [
    for n, devs in local.hca_devices : "${n} has ${join(", ", devs)}"
    if length([for d in devs : d if !contains(local.declared_hca, d)]) + length([for d in local.declared_hca : d if !contains(devs, d)]) > 0
  ]
  gid_differs = local.pinned_gid == null ? [] : [
    for n, i in local.gid_index : "${i} on ${n}" if i != local.pinned_gid
  ]

  # VLLM_HOST_IP must be each container's own fabric address: neither Ray nor torch.distributed
  # carries it from the head to the other nodes, and without it vLLM advertises the default route.
  # What the fabric's facts give comes first: a declared nccl_ib_hca or extra_env wins over it.
  node_env = {
    for n in var.nodes : n.name => merge(
      lookup(local.hca, n.name, null) == null ? {} : { NCCL_IB_HCA = lookup(local.hca, n.name, null) },
      lookup(local.gid_index, n.name, null) == null ? {} : { NCCL_IB_GID_INDEX = lookup(local.gid_index, n.name, null) },
      local.env,
      { VLLM_HOST_IP = n.name == local.head.name ? local.head_ip : lookup(local.addr, n.name, null) },
    )
  }

  # Without /dev/infiniband or IPC_LOCK (to pin its buffers), NCCL silently falls back to TCP.
  devices = var.rdma ? ["/dev/infiniband"] : null
  cap_add = var.rdma ? ["IPC_LOCK"] : null
  ulimits = var.rdma ? { memlock = "-1" } : null

  # What NCCL chose on each rank, which the apply records from the log of a vLLM container once
  # it is ready (record_from_log) and `status` shows: the RDMA devices (NET/IB) or sockets
  # (NET/Socket), each channel's path (NET/IB/0, with /GDRDMA when the GPU reads the NIC
  # directly), by the host that printed it. NCCL names them only at INFO level. Formats as NCCL
  # prints them: `HOST:PID:TID [DEV] NCCL INFO …` (a Ray driver prefixes a worker's lines).
  record_from_log = local.detect_socket_fallback ? {
    nccl_net  = "([\\w.-]+):\\d+:\\d+ \\[\\d+\\] NCCL INFO (NET/(?:IB|Socket) : Using [^;]*)"
    nccl_path = "([\\w.-]+):\\d+:\\d+ \\[\\d+\\] NCCL INFO Channel .* via (NET/\\w+/\\d+(?:/GDRDMA)?)"
  } : {}

  # Log lines that are worth a warning but not a failed start (warn_on_log), by where they
  # apply, as `signatures`.
  warnings = {
    gpu = local.detect_socket_fallback && var.nccl_socket_fallback == "warn" ? local.socket_fallback : {}
  }

  # Known failures, by the log line that shows them, with the fix. vLLM's CPU build refuses a
  # head dimension its attention kernels lack as "Invalid CPU attention head_dim: N" (0.13) and
  # "Unsupported CPU attention configuration: head_dim=N" (0.21 on). Each group applies where its
  # software runs: `gpu` and `vllm` in every vLLM container, `ray` in Ray's, `mp` in the ranks
  # of vLLM's multiprocessing backend. A pattern must match no line of `benign_log`.
  signatures = {
    gpu = merge(
      {
        "Watchdog caught collective operation timeout"                                  = "an NCCL collective hung until NCCL's timeout: two NCCL builds of the same version in one image (a pip wheel and the system library) wedged serving after 20-26 min; run one image with one NCCL on every node (the same image ID), and check the fabric link (speed, MTU) between the nodes"
        "cudaErrorUnsupportedPtxVersion|PTX was compiled with an unsupported toolchain" = "the image's CUDA toolchain is newer than this node's NVIDIA driver: use an image built for the driver the nodes run (sparkform nodes shows it), or update the driver on every node"
        "nvidia-container-cli: .*driver not loaded"                                     = "the NVIDIA kernel modules are not loaded on this node, usually after a kernel update without them: boot a kernel that has them (or reinstall the driver), with the same driver version on every node. `Failed to initialize NVML: Unknown Error` is another cause (the cgroup driver)"
      },
      local.detect_socket_fallback && var.nccl_socket_fallback == "fail" ? local.socket_fallback : {},
    )
    vllm = {
      "Available KV cache memory: -"                                                                = "the weights leave no memory for the KV cache on this rank: raise gpu_memory_utilization (at most 0.85-0.90 on GB10), lower max_model_len, or spread the model over more nodes"
      "CUDA out of memory|CUDA error: out of memory"                                                = "the GPU ran out of memory while vLLM loaded or profiled: right after a restart the previous vLLM (an orphan VLLM::EngineCore process) may still hold the node's memory, so wait until the node's available memory is back and apply again; otherwise lower gpu_memory_utilization or max_model_len"
      "Gloo connectFullMesh failed"                                                                 = "Gloo could not connect the nodes: GLOO_SOCKET_IFNAME and VLLM_HOST_IP must name the fabric interface and each node's own fabric address in every container"
      "Model architectures \\[.*\\] are not supported"                                              = "this image's vLLM does not know the model's architecture: use an image whose vLLM supports the model"
      "Free memory on device .* is less than desired"                                               = "the GPU has less free memory than gpu_memory_utilization asks for: lower it, or stop whatever else holds GPU memory (an old vLLM?)"
      "Unsupported CPU attention configuration: head_dim=\\d+|Invalid CPU attention head_dim: \\d+" = "vLLM's CPU build has no attention kernel for this model's head dimension (head_dim in its config.json; 64 runs, 16 does not): serve this model on GPU nodes, or pick a model whose head dimension the CPU build supports"
    }
    ray = {
      "Waiting for creating a placement group of specs"                                        = "vLLM's placement group waits for GPUs Ray does not offer: RAY_ADDRESS must point at the head (a bare ray.init() starts a private cluster without GPUs), every worker must have joined (see the ray_members probe), and tensor_parallel_size × pipeline_parallel_size must equal the GPUs of the nodes"
      "(?i)(killed due to the node running low on memory|ray\\.exceptions\\.OutOfMemoryError)" = "Ray's memory monitor killed a worker: keep RAY_memory_monitor_refresh_ms=0 in every container and lower gpu_memory_utilization (≤ 0.85 on GB10)"
      "Version mismatch: The cluster was started with"                                         = "the nodes run different Ray (or Python) versions: run the same image, with the same image ID, on every node"
      "ray: (command )?not found"                                                              = "this image has no Ray (stock vLLM images dropped it around v0.18, NVIDIA's vLLM container lacks it): deploy with modules/vllm-mp, vLLM's multiprocessing backend across nodes, or use an image with Ray"
    }
    # SGLang's own lines (0.5.x: sglang/srt/models/registry.py, model_executor/pool_configurator.py).
    sglang = {
      "Model architectures \\[.*\\] are not supported"                    = "this image's SGLang does not know the model's architecture (SGLang images without Qwen3.5 were one report): use an image whose SGLang supports the model"
      "Not enough memory\\. Please try to increase --mem-fraction-static" = "the weights leave SGLang no memory for its KV cache pool on this rank: raise mem_fraction_static (at most 0.85 on GB10), lower context_length, or spread the model over more nodes"
      "CUDA out of memory|CUDA error: out of memory"                      = "the GPU ran out of memory while SGLang loaded or captured graphs: right after a restart the previous engine may still hold the node's memory, so wait until it is back and apply again; otherwise lower mem_fraction_static"
    }
    mp = {
      "The client socket has timed out after \\d+ms while trying to connect to"           = "this rank could not reach rank 0's master port over the fabric: rank 0 is not running or not listening (see its container), or the fabric between the nodes is down; the master address must be the head's fabric address"
      "Timed out after \\d+ seconds waiting for clients"                                  = "not every rank joined rank 0 in time: a headless rank is not running, or it cannot reach the master address and port over the fabric; see each rank's log"
      "TCPStore server has shut down too early|Failed to check the signal .* on TCPStore" = "rank 0 went away while this rank waited for it: rank 0's log has the cause; the ranks are one process group, so all of them start again with the next apply"
    }
  }

  # A wedged engine, once it serves: the container stays up and /health may still answer, but
  # no request completes (watch_on_log; `sparkform watch` restarts the whole engine on them).
  # Lines of vLLM 0.33.0 (vllm/v1/engine/exceptions.py, vllm/v1/executor/multiproc_executor.py,
  # vllm/distributed/device_communicators/shm_broadcast.py) and of torch's ProcessGroupNCCL.
  # Not start-up signatures: the shared-memory line is harmless while the weights load.
  wedge = {
    "EngineDeadError"                                                  = "vLLM's engine core died (EngineDeadError): the API server runs on but every request fails; the ranks are one process group, so the whole engine restarts"
    "RPC call to \\w+ timed out"                                       = "a rank stopped answering the engine's calls (RPC call … timed out), usually stuck in an NCCL collective: the whole engine restarts; if it comes back, check the fabric (sparkform nodes) and that every node runs one NCCL"
    "No available shared memory broadcast block found in \\d+ seconds" = "the ranks stopped reading vLLM's shared-memory queue while it serves: a rank hangs (vllm#41725); the whole engine restarts"
    "Watchdog caught collective operation timeout"                     = "an NCCL collective hung until NCCL's timeout while serving: two NCCL builds in one image wedge serving after 20-26 min (vllm#42354); run one image with one NCCL on every node"
  }

  # SGLang's wedge: its scheduler's watchdog fires when a forward pass makes no progress for
  # --watchdog-timeout seconds (300 by default): "X watchdog timeout (self.watchdog_timeout=…"
  # since 0.5.10 (sglang/srt/utils/watchdog.py), "Watchdog timeout (self.watchdog_timeout=…"
  # before (0.5.6's scheduler_runtime_checker_mixin.py); NCCL's too.
  sglang_wedge = {
    "[Ww]atchdog timeout \\(self\\.watchdog_timeout=" = "SGLang's scheduler made no progress for its watchdog timeout while serving: a rank hangs, usually in an NCCL collective; the whole engine restarts"
    "Watchdog caught collective operation timeout"    = local.wedge["Watchdog caught collective operation timeout"]
  }

  # Lines that look alarming but are normal on DGX Spark (GB10, ConnectX-7): never add a pattern
  # that matches them.
  benign_log = [
    "Using default MoE config. Performance might be sub-optimal! Config file not found at /usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/fused_moe/configs/E=256,N=512,device_name=NVIDIA_GB10.json",
    "GDS is not supported in this platform",
    "NCCL INFO GPU Direct RDMA Disabled for HCA 0 'rocep1s0f1'",
    "WARNING 07-14 10:02:11 [custom_all_reduce.py:87] CustomAllreduce is disabled because this process group spans across nodes.",
    "No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
    # Ray 2.60's raylet at startup (its format string): not a kill.
    "Event memory monitor successfully initialized with memory events path: %s",
  ]
}

check "head_on_fabric" {
  condition     = local.head_ip == null ? true : cidrcontains(var.network.subnet, local.head_ip)
  error_message = "the head address ${local.head_ip} is not in the fabric subnet ${var.network.subnet} of network ${var.network.name}: Ray or torch.distributed, NCCL and Gloo would talk over the management network, where the other nodes cannot reach the head (the first failure of the manual deployment). Leave head_address unset to use the head node's fabric address"
}

check "every_node_on_fabric" {
  condition     = length(local.missing) == 0
  error_message = "every node needs an attachment to network ${var.network.name}; missing: ${join(", ", local.missing)}. Add an `attach \"NAME\" { node = node.NAME … }` block for each to network ${var.network.name}"
}

check "same_interface_everywhere" {
  condition     = length(local.interfaces) <= 1
  error_message = "the fabric interface differs between nodes (${join(", ", local.interfaces)}); vLLM copies NCCL_SOCKET_IFNAME from the head to every other process, so all nodes must use the same interface name"
}

check "declared_gid_index_matches_the_fabric" {
  condition     = length(local.gid_differs) == 0
  error_message = "extra_env pins NCCL_IB_GID_INDEX=${coalesce(local.pinned_gid, "")}, but this plan read the RoCE v2 GID of the fabric address as ${join(", ", local.gid_differs)}: NCCL would fail with `ibv_modify_qp failed`; remove NCCL_IB_GID_INDEX from extra_env so each node gets its own index"
  severity      = "warning"
}

check "declared_hca_matches_the_fabric" {
  condition     = length(local.hca_differs) == 0
  error_message = "nccl_ib_hca = \"${coalesce(var.nccl_ib_hca, "")}\", but the active RDMA ports on the fabric are: ${join("; ", local.hca_differs)}; NCCL uses only what NCCL_IB_HCA names (one of two twin devices gives about 3 GB/s, a missing device falls back to sockets): leave nccl_ib_hca unset to use what the plan reads"
  severity      = "warning"
}

check "no_pinned_gid_index" {
  condition     = !contains(keys(var.extra_env), "NCCL_IB_GID_INDEX")
  error_message = "extra_env pins NCCL_IB_GID_INDEX=${lookup(var.extra_env, "NCCL_IB_GID_INDEX", "")}: the RoCE GID index moves with firmware and driver updates (3 became 4 on DGX Spark), and NCCL then fails with `ibv_modify_qp failed`; leave it unset so NCCL finds the RoCE v2 GID itself"
  severity      = "warning"
}
