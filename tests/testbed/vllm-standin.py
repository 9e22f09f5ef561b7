#!/usr/bin/env python3
"""A stand-in for `vllm serve` on the testbed: the same command line, and the OpenAI endpoints
sparkform's probes use. It computes nothing and downloads nothing. Two modes, as vLLM's
distributed executor backends:

- Ray (`--distributed-executor-backend ray`): join the running cluster, reserve TP x PP
  {GPU: 1} bundles in a placement group, one actor per bundle; the chat reply names the node
  IPs of the bundles.
- Multiprocessing across nodes (`--nnodes N > 1`, the `mp` backend): rank 0 hosts the process
  group's store on --master-port (all addresses, as torch's TCPStore), the other ranks
  (`--headless --node-rank R`) connect to --master-addr:--master-port the way a TCPStore client
  does (the kernel picks the source address, which is VLLM_HOST_IP on a healthy fabric) and
  announce their rank and VLLM_HOST_IP. Rank 0 answers /health and chat completions only once
  every rank has joined; the chat reply names every rank's fabric address (as rank 0 saw the
  connection). Ray is never imported.

Given a local folder (a snapshot), it loads it as vLLM would: config.json and its architecture
(against the `vllm` package's registry, which the Ray image's `:noarch` tag lacks Qwen3 in),
then every shard's safetensors header and data (each Ray worker and each headless rank reads
its own node's copy), and exits 1 with vLLM's messages when one is missing, truncated or its
data does not match the sha256 in its `__metadata__` (tests/testbed/README.md lists them).

Failure modes the real vLLM shows are reproduced where sparkform must catch them, with the
lines vLLM and torch.distributed print:
- without RAY_ADDRESS, ray.init() starts a private cluster with no GPUs and the placement group
  waits, logging "Waiting for creating a placement group of specs ...";
- a model whose name contains "unsupported-arch" fails like an architecture vLLM lacks;
- a headless rank retries "The client socket has failed to connect to ..." and gives up with
  "DistNetworkError: The client socket has timed out after ...ms while trying to connect to";
- rank 0 gives up with "DistStoreError: Timed out after N seconds waiting for clients. k/N
  clients joined." when a rank never arrives (--distributed-timeout-seconds, default 600);
- a headless rank whose rank 0 went away logs torch's heartbeat warning "... (maybe TCPStore
  server has shut down too early) ..." (and, like torch, does not exit);
- rank 0 warns when a rank's connection comes from another address than the one it announces;
- with VLLM_STANDIN_WEDGE_AFTER=N, the engine wedges after N chat completions: later ones never
  answer while /health stays 200, and the log prints what a wedged vLLM prints once (the
  shared-memory broadcast warning, "RPC call to sample_tokens timed out.", EngineDeadError).
"""

import argparse
import glob
import hashlib
import json
import os
import signal
import struct
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# The vLLM release whose lines this prints (the file:line in brackets are that release's):
# bench/compat checks every line a module pattern matches against its source.
STANDIN_RELEASE = "0.21.0"
# The SGLang release whose lines it prints as `python3 -m sglang.launch_server` (the stand-in
# `sglang` package in the image runs it so): bench/compat checks them against that release.
SGLANG_STANDIN_RELEASE = "0.5.23"
# Which engine this run stands in for: "vllm", or "sglang" (sglang_main).
ENGINE = "vllm"

# The registry: the image's `vllm` package (tests/testbed/vllm-package), or the checkout's copy
# next to this script when it runs outside the image (tests/fake/standins.rs).
_HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(_HERE, "vllm-package")):
    sys.path.append(os.path.join(_HERE, "vllm-package"))


def registry():
    from vllm import ModelRegistry
    return ModelRegistry


class LoadError(Exception):
    """A failed load: `lines` are the traceback's last lines as vLLM prints them, `where` the
    process that prints them ("APIServer" for the configuration, "EngineCore_DP0" for weights)."""

    def __init__(self, where, lines):
        super().__init__(lines[-1])
        self.where = where
        self.lines = lines


def check_config(model, served_args):
    """What vLLM's ModelConfig does with a local folder: config.json must be there, and its
    architectures must be in the registry."""
    path = os.path.join(model, "config.json")
    if not os.path.isfile(path):
        raise LoadError("APIServer", [
            f"ValueError: Invalid repository ID or local directory specified: '{model}'.",
            "Please verify the following requirements:",
            "1. Provide a valid Hugging Face repository ID.",
            "2. Specify a local directory that contains a recognized configuration file.",
            "   - For Hugging Face models: ensure the presence of a 'config.json'.",
            "   - For Mistral models: ensure the presence of a 'params.json'."])
    try:
        with open(path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise LoadError("APIServer", [
            f"OSError: It looks like the config file at '{path}' is not a valid JSON file. ({e})"])
    archs = cfg.get("architectures") if isinstance(cfg, dict) else None
    try:
        registry().resolve_model_cls(archs or [])
    except ValueError as e:
        raise LoadError("APIServer", [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
            f"  Value error, {e} [type=value_error, input_value=ArgsKwargs((), {served_args}), "
            "input_type=ArgsKwargs]"])
    return cfg


def safetensors_header(path):
    """Parse a safetensors file as safetensors' read_metadata does (same checks, same messages),
    then check the data section against `__metadata__.standin_data_sha256` when the header has
    it: the stand-in hub writes it, so a flipped byte is caught (a real load would not notice and
    serve wrong output). Returns the tensor names."""
    def refuse(msg):
        raise LoadError("EngineCore_DP0", [
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/model_loader/'
            'weight_utils.py", line 620, in safetensors_weights_iterator',
            '    with safe_open(st_file, framework="pt") as f:',
            f"safetensors._safetensors_rust.SafetensorError: {msg}"])

    try:
        fh = open(path, "rb")
    except OSError:
        raise LoadError("EngineCore_DP0", [f"FileNotFoundError: No such file or directory: {path}"])
    with fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) < 8:
            refuse("Error while deserializing header: header too small")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            refuse("Error while deserializing header: header too large")
        if 8 + n > size:
            refuse("Error while deserializing header: invalid header length")
        raw = fh.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            refuse(f"Error while deserializing header: invalid UTF-8 in header: {e}")
        except ValueError as e:
            refuse(f"Error while deserializing header: invalid JSON in header: {e}")
        if not isinstance(header, dict):
            refuse("Error while deserializing header: invalid JSON in header: not an object")
        meta = header.pop("__metadata__", None) or {}
        width = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                 "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
        try:
            tensors = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        except (TypeError, KeyError, IndexError):
            refuse("Error while deserializing header: invalid JSON in header: missing data_offsets")
        start = 0
        for name, info in tensors:
            s0, e0 = info["data_offsets"]
            if s0 != start or e0 < s0:
                refuse(f"Error while deserializing header: invalid offset for tensor `{name}`")
            count = 1
            for d in info.get("shape", []):
                count *= d
            if count * width.get(info.get("dtype"), 0) != e0 - s0:
                refuse("Error while deserializing header: invalid shape, data type, or offset for tensor")
            start = e0
        if start + 8 + n != size:
            refuse("Error while deserializing header: incomplete metadata, file not fully covered")
        want = meta.get("standin_data_sha256")
        if want:
            h = hashlib.sha256()
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
            if h.hexdigest() != want:
                raise LoadError("EngineCore_DP0", [
                    f"ValueError: {path}: the data section's sha256 is {h.hexdigest()}, its header's "
                    f"__metadata__ says {want}: a corrupted copy (vllm stand-in check; a real load "
                    "would go on and serve wrong output)"])
    return [name for name, _ in tensors]


def weight_files(model):
    """The shard files a load reads, as vLLM's default loader picks them: the *.safetensors in
    the folder, kept to those the index names when there is one; and the tensors it expects."""
    index_path = os.path.join(model, "model.safetensors.index.json")
    present = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    expected = None
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as fh:
                weight_map = json.load(fh)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LoadError("EngineCore_DP0", [f"json.decoder.JSONDecodeError: {index_path}: {e}"])
        expected = set(weight_map)
        named = set(weight_map.values())
        present = [p for p in present if os.path.basename(p) in named]
    if not present:
        raise LoadError("EngineCore_DP0", [f"RuntimeError: Cannot find any model weights with `{model}`"])
    return present, expected


def check_weights(model, progress=None):
    """Read every shard as a load would; `progress(done, total)` after each one."""
    files, expected = weight_files(model)
    loaded = set()
    for i, path in enumerate(files):
        loaded.update(safetensors_header(path))
        if progress:
            progress(i + 1, len(files))
    if expected is not None and expected - loaded:
        raise LoadError("EngineCore_DP0", [
            "ValueError: Following weights were not initialized from checkpoint: {"
            + ", ".join(repr(n) for n in sorted(expected - loaded)) + "}"])
    return len(files)


def fail_load(err):
    """Print a failed load as vLLM does and exit 1: the engine core's traceback, then the API
    server's "Engine core initialization failed"."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    if err.where == "APIServer":
        print(f"(APIServer pid={os.getpid()}) Traceback (most recent call last):", flush=True)
        for line in err.lines:
            print(f"(APIServer pid={os.getpid()}) {line}", flush=True)
        sys.exit(1)
    prefix = f"({err.where} pid={os.getpid()}) ERROR {stamp} [core.py:708]"
    print(f"{prefix} EngineCore failed to start.", flush=True)
    print(f"{prefix} Traceback (most recent call last):", flush=True)
    for line in err.lines:
        print(f"{prefix} {line}", flush=True)
    print(f"(APIServer pid={os.getpid()}) RuntimeError: Engine core initialization failed. "
          "See root cause above. Failed core proc(s): {}", flush=True)
    sys.exit(1)


def log(msg, level="INFO"):
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} {msg}", flush=True)


def parse(argv):
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        sys.exit(2)
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--distributed-timeout-seconds", type=int, default=600)
    args, unknown = p.parse_known_args(argv[1:])
    if unknown:
        log(f"ignoring options the stand-in does not model: {' '.join(unknown)}")
    return args


def load_phases(args):
    """The lines vLLM prints while it starts, in its order, with short delays (the stand-in's
    VLLM_STANDIN_PHASE_SECS each, 0.4 by default) so that a watcher sees the phases change. The
    weight bar is tqdm's in vLLM's plain bar format, one line per update."""
    try:
        pause = float(os.environ.get("VLLM_STANDIN_PHASE_SECS", "0.4"))
    except ValueError:
        pause = 0.4
    if ENGINE == "sglang":
        sglang_load_phases(args, pause)
        return
    prefix = "(EngineCore_DP0 pid=%d) " % os.getpid()
    log(f"{prefix}[gpu_model_runner.py:4858] Starting to load model {args.model}...")
    started = time.time()

    def bar(i, shards):
        time.sleep(pause)
        print(f"{prefix}Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed "
              f"| {i}/{shards} [00:0{i}<00:0{shards - i}, 1.00s/it]", flush=True)

    if os.path.isdir(args.model):
        # a local snapshot is read for real: a missing, truncated or corrupted shard fails here
        try:
            check_weights(args.model)
        except LoadError as e:
            fail_load(e)
        shards = len(weight_files(args.model)[0])
    else:
        shards = 4
    for i in range(shards + 1):
        bar(i, shards)
    took = time.time() - started
    log(f"{prefix}[default_loader.py:398] Loading weights took {took:.2f} seconds")
    log(f"{prefix}[gpu_model_runner.py:4960] Model loading took 0.01 GiB memory and {took + 0.1:.6f} seconds")
    compile_phase(args, prefix)
    time.sleep(pause)
    log(f"{prefix}[gpu_worker.py:463] Available KV cache memory: 1.00 GiB")
    for i, n in enumerate((1, 2)):
        time.sleep(pause)
        print(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {50 * n:3d}%|{'█' * 5 * n}{' ' * (10 - 5 * n)}| {n}/2 [00:0{n}<00:00,  1.00it/s]", flush=True)
    log(f"{prefix}[gpu_model_runner.py:6244] Graph capturing finished in {2 * pause:.0f} secs, took 0.01 GiB")
    time.sleep(pause)
    # 0.21's line (0.20 and older: "Starting vLLM API server 0 on URL").
    log(f"[api_server.py:617] Starting vLLM server on http://{args.host}:{args.port}")


def compile_phase(args, prefix):
    """vLLM's torch.compile, as 0.21.0 logs it: its cache directory (under VLLM_CACHE_ROOT,
    keyed by the model), then either the artefacts an earlier start left there, loaded at once,
    or a compilation that takes VLLM_STANDIN_COMPILE_SECS (0 by default) and leaves them."""
    try:
        secs = float(os.environ.get("VLLM_STANDIN_COMPILE_SECS", "0"))
    except ValueError:
        secs = 0.0
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
    key = hashlib.sha256(f"{args.model}:{args.tensor_parallel_size}".encode()).hexdigest()[:10]
    folder = os.path.join(root, "torch_compile_cache", key, f"rank_{args.node_rank}_0", "backbone")
    artefact = os.path.join(folder, "vllm_compile_cache.py")
    log(f"{prefix}[backends.py:1089] Using cache directory: {folder} for vLLM's torch.compile")
    started = time.time()
    if os.path.isfile(artefact):
        log(f"{prefix}[backends.py:292] Directly load the compiled graph(s) for compile range (1, 2048) "
            f"from the cache, took {time.time() - started:.3f} s")
    else:
        time.sleep(secs)
        try:
            os.makedirs(folder, exist_ok=True)
            with open(artefact, "w") as f:
                f.write(f"# compiled for {args.model}\n")
        except OSError as e:
            log(f"{prefix}cannot write the compile cache: {e}", "WARNING")
        log(f"{prefix}[backends.py:393] Compiling a graph for compile range (1, 2048) takes {secs:.2f} s")
    log(f"{prefix}[monitor.py:34] torch.compile takes {time.time() - started:.2f} s in total")


def sglang_log(msg, tp=None):
    """SGLang's log format: `[TIME TPn] message` for a tensor-parallel worker, `[TIME] message`
    for the server."""
    where = f" TP{tp}" if tp is not None else ""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{where}] {msg}", flush=True)


def sglang_load_phases(args, pause, tp=0):
    """What SGLang 0.5.23's tensor-parallel worker prints while it starts (model_runner.py,
    weight_utils.py's bar, kv_cache_configurator.py, cuda_graph_setup.py), with short pauses."""
    sglang_log("Load weight begin. avail mem=118.20 GB", tp)
    started = time.time()
    shards = len(weight_files(args.model)[0]) if os.path.isdir(args.model) else 2
    for i in range(shards + 1):
        time.sleep(pause)
        print(f"Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed "
              f"| {i}/{shards} [00:0{i}<00:0{shards - i}, 1.00s/it]", flush=True)
    sglang_log(f"Load weight end. elapsed={time.time() - started:.2f} s, type=Qwen3ForCausalLM, "
               "avail mem=100.00 GB, mem usage=18.20 GB.", tp)
    time.sleep(pause)
    sglang_log("Memory pool end. avail mem=20.00 GB", tp)
    sglang_log("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
               "avail mem=20.00 GB", tp)
    time.sleep(pause)
    sglang_log(f"Capture target decode CUDA graph end. bs=[1, 2], elapsed={pause:.2f} s, "
               "mem usage=0.50 GB, avail mem=19.50 GB.", tp)


def sglang_settings(path):
    """The settings of SGLang's `--config FILE` (YAML; the module writes JSON, which is YAML)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"ValueError: Config file {path} cannot be read: {e}", file=sys.stderr, flush=True)
        sys.exit(1)


def parse_sglang(argv):
    """`python3 -m sglang.launch_server` with SGLang's names for what the stand-in models; the
    result has the fields the vLLM stand-in's ranks use."""
    p = argparse.ArgumentParser(prog="sglang serve")
    p.add_argument("--model-path", "--model", dest="model", required=True)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tensor_parallel_size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", dest="pipeline_parallel_size", type=int, default=1)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--config", default=None)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        sglang_log(f"ignoring options the stand-in does not model: {' '.join(unknown)}")
    if args.config:
        for k, v in sglang_settings(args.config).items():
            if k.replace("-", "_") == "api_key" and args.api_key is None:
                args.api_key = v
    if args.nnodes > 1 and not args.dist_init_addr:
        print("ValueError: --dist-init-addr is required when --nnodes > 1", file=sys.stderr, flush=True)
        sys.exit(1)
    addr, _, port = (args.dist_init_addr or "127.0.0.1:20000").rpartition(":")
    args.master_addr, args.master_port = addr, int(port)
    args.headless = args.node_rank > 0
    args.distributed_executor_backend = "mp"
    args.distributed_timeout_seconds = 600
    return args


def sglang_main(argv):
    """`python3 -m sglang.launch_server ARGS`: the same ranks as vLLM's mp backend (rank 0 hosts
    the store on the dist-init address, serves the API once every rank joined), with SGLang's
    lines."""
    global ENGINE
    ENGINE = "sglang"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = parse_sglang(argv)
    State.served = args.served_model_name or args.model
    State.api_key = args.api_key or None
    State.placed = "ranks"
    sglang_log(f"sglang stand-in: serve {args.model} as {State.served} on {args.host}:{args.port}, "
               f"nnodes={args.nnodes}, node_rank={args.node_rank}, dist_init_addr={args.dist_init_addr}, "
               f"NCCL_SOCKET_IFNAME={os.environ.get('NCCL_SOCKET_IFNAME')}")
    if os.path.isdir(args.model):
        try:
            check_config(args.model, {"model": args.model, "tensor_parallel_size": args.tensor_parallel_size})
        except LoadError as e:
            fail_load(e)
    if args.headless:
        serve_headless(args)
        return
    if args.nnodes > 1:
        keep = serve_rank0(args)
    else:
        State.healthy, keep = True, None
    load_phases(args)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    State.loaded = True
    sglang_log("The server is fired up and ready to roll!")
    while True:
        time.sleep(3600)
    del keep


class State:
    healthy = False
    # The engine is loaded ("Application startup complete."): /health answers 200 only then.
    loaded = False
    ips = []
    served = ""
    # The API key /v1 asks for (None: open).
    api_key = None
    # What the chat reply says runs the model ("Ray workers" or "ranks").
    placed = "Ray workers"
    # Chat completions answered; after VLLM_STANDIN_WEDGE_AFTER of them the engine wedges.
    completions = 0
    wedged = False
    lock = threading.Lock()


def wedge():
    """What vLLM prints when its engine wedges while serving, each line once (vllm 0.33.0:
    shm_broadcast.py's LONG_WAIT_TIME_LOG_MSG, multiproc_executor.py's TimeoutError,
    exceptions.py's EngineDeadError); then the request never completes."""
    with State.lock:
        first, State.wedged = not State.wedged, True
    if first:
        log("[shm_broadcast.py:510] No available shared memory broadcast block found in 60 seconds. "
            "This typically happens when some processes are hanging or doing some time-consuming work "
            "(e.g. compilation, weight/kv cache quantization).", "WARNING")
        log("[core.py:1010] EngineCore encountered a fatal error.", "ERROR")
        print("TimeoutError: RPC call to sample_tokens timed out.", flush=True)
        print("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
              "See stack trace (above) for the root cause.", flush=True)
    while True:
        time.sleep(3600)


def warn(msg):
    print(f"[W{time.strftime('%m%d %H:%M:%S')} socket.cpp:{os.getpid()}] {msg}", flush=True)


def serve_rank0(args):
    """Rank 0 of the mp backend: the store on the master port, healthy once every rank joined."""
    world = args.nnodes
    me = os.environ.get("VLLM_HOST_IP") or args.master_addr
    joined = {0: me}
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", args.master_port))
    srv.listen(64)
    log(f"rank 0 of {world}: the process group's store listens on port {args.master_port}, master address {args.master_addr}")
    conns = []

    def client(conn, peer):
        # A client that says nothing (a TCP ready check) is not a rank.
        conn.settimeout(30)
        try:
            line = conn.makefile("r").readline().split()
        except OSError:
            line = []
        if len(line) != 3 or line[0] != "rank":
            conn.close()
            return
        rank, announced = int(line[1]), line[2]
        if announced != peer:
            warn(f"[c10d] rank {rank} announced {announced} but connected from {peer}: its "
                 "connection to the master leaves from another address")
        conn.settimeout(None)
        with State.lock:
            if rank in joined or State.healthy:
                # torch.distributed cannot take a rank into a group that has formed.
                log(f"rank {rank} connected from {peer}, but the process group has already "
                    "formed: every rank must start again, together", "ERROR")
                conn.close()
                return
            conns.append(conn)
            joined[rank] = peer
            n = len(joined)
            if n == world:
                State.ips = [joined[r] for r in sorted(joined)]
                State.healthy = True
        log(f"rank {rank} joined from {peer} ({n}/{world})")
        if n == world:
            log(f"all {world} ranks joined: {', '.join(State.ips)}")
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        with State.lock:
            State.healthy = False
        log(f"rank {rank} at {peer} went away: the engine cannot go on without it", "ERROR")

    def accept():
        while True:
            conn, (peer, _) = srv.accept()
            threading.Thread(target=client, args=(conn, peer), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    start = time.time()
    while time.time() - start < args.distributed_timeout_seconds:
        with State.lock:
            if State.healthy:
                return conns
        time.sleep(0.5)
    with State.lock:
        n = len(joined)
    log(f"torch.distributed.DistStoreError: Timed out after {args.distributed_timeout_seconds + 1} "
        f"seconds waiting for clients. {n}/{world} clients joined.", "ERROR")
    sys.exit(1)


def serve_headless(args):
    """A headless rank: load its own node's copy of a local snapshot (every rank reads its
    shards), join rank 0's store, then wait; warn as torch does when it goes away."""
    if os.path.isdir(args.model):
        try:
            check_weights(args.model)
        except LoadError as e:
            fail_load(e)
    me = os.environ.get("VLLM_HOST_IP", "")
    deadline = time.time() + args.distributed_timeout_seconds
    while True:
        try:
            conn = socket.create_connection((args.master_addr, args.master_port), timeout=5)
            conn.settimeout(None)
            break
        except OSError as e:
            if time.time() >= deadline:
                log(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{args.distributed_timeout_seconds * 1000}ms while trying to connect to "
                    f"({args.master_addr}, {args.master_port}).", "ERROR")
                sys.exit(1)
            warn(f"[c10d] The client socket has failed to connect to [{args.master_addr}]:"
                 f"{args.master_port} (errno: {e.errno or 0} - {e.strerror or e}).")
            time.sleep(1)
    conn.sendall(f"rank {args.node_rank} {me}\n".encode())
    source = conn.getsockname()[0]
    log(f"rank {args.node_rank} of {args.nnodes} (headless) joined {args.master_addr}:{args.master_port} from {source}")
    # Every rank's workers compile their own part of the model, with their node's cache.
    if ENGINE == "sglang":
        sglang_load_phases(args, 0.1, tp=args.node_rank)
    else:
        worker = "(Worker_TP%d pid=%d) " % (args.node_rank, os.getpid())
        compile_phase(args, worker)
        # Each worker profiles its own memory next, as rank 0's do.
        log(f"{worker}[gpu_worker.py:463] Available KV cache memory: 1.00 GiB")
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    while True:
        warn(f"[PG ID 0 PG GUID 0 Rank {args.node_rank}] Failed to check the \"should dump\" flag on "
             "TCPStore, (maybe TCPStore server has shut down too early), with error: Connection reset by peer")
        time.sleep(30)


def start_ray(args):
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    world = args.tensor_parallel_size * args.pipeline_parallel_size
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="ERROR")
    else:
        # What a bare ray.init() does in vLLM: a private cluster, with no GPUs.
        ray.init(num_gpus=0, logging_level="ERROR")
    log(f"connected to Ray; cluster resources: {ray.cluster_resources()}")
    specs = [{"GPU": 1.0}] * world
    pg = placement_group(specs, strategy="PACK")
    waited = 0
    while True:
        try:
            ray.get(pg.ready(), timeout=10)
            break
        except Exception:
            waited += 10
            log(f"Waiting for creating a placement group of specs for {waited} seconds. specs={specs}. "
                "Check `ray status` and `ray list nodes` to see if you have enough resources, and make "
                "sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment "
                "variable specified in each node if you are running on a multi-node.")

    # As vLLM's Ray workers: a GPU each, no CPU reserved.
    @ray.remote(num_gpus=1, num_cpus=0)
    class Worker:
        def ip(self):
            return ray.util.get_node_ip_address()

        def load(self, model):
            """Each worker reads the shards on its own node, as vLLM's Ray workers do."""
            if not os.path.isdir(model):
                return None
            try:
                check_weights(model)
            except LoadError as e:
                return e.lines
            return None

    workers = [
        Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()
        for i in range(world)
    ]
    ips = ray.get([w.ip.remote() for w in workers])
    for ip, failed in zip(ips, ray.get([w.load.remote(args.model) for w in workers])):
        if failed:
            fail_load(LoadError("EngineCore_DP0", [f"(RayWorkerWrapper ip={ip}) {line}" for line in failed]))
    log(f"workers placed on {ips} (tensor parallel {args.tensor_parallel_size}, pipeline parallel {args.pipeline_parallel_size})")
    with State.lock:
        State.ips = ips
        State.healthy = True

    # vLLM's health check fails when its Ray workers are gone (a replaced Ray head).
    def watch():
        while True:
            time.sleep(5)
            try:
                ray.get([w.ip.remote() for w in workers], timeout=20)
            except Exception as e:
                with State.lock:
                    if State.healthy:
                        log(f"ERROR the Ray workers stopped answering: {e}")
                    State.healthy = False
    threading.Thread(target=watch, daemon=True).start()
    return workers


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *a):
        pass

    def reply(self, code, doc):
        body = json.dumps(doc).encode() if doc is not None else b""
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def refused(self):
        """vLLM's API key (VLLM_API_KEY, or --api-key) guards every /v1 route, as its
        AuthenticationMiddleware does: without `Authorization: Bearer KEY` the answer is 401
        {"error": "Unauthorized"}; /health stays open."""
        key = State.api_key
        if not key or not self.path.startswith("/v1"):
            return False
        if self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self.reply(401, {"error": "Unauthorized"})
        return True

    def do_GET(self):
        if self.refused():
            return
        if self.path == "/health":
            with State.lock:
                ok = State.healthy and State.loaded
            self.reply(200 if ok else 503, None)
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [
                {"id": State.served, "object": "model", "owned_by": "vllm-standin", "max_model_len": None}]})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})

    def do_POST(self):
        if self.refused():
            return
        if self.path != "/v1/chat/completions":
            self.reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        n = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            self.reply(400, {"error": {"message": "the body is not JSON", "code": 400}})
            return
        if req.get("model") != State.served:
            self.reply(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                       "type": "NotFoundError", "code": 404}})
            return
        with State.lock:
            healthy, ips = State.healthy and State.loaded, list(State.ips)
        if not healthy:
            self.reply(503, {"error": {"message": "the engine is not ready", "code": 503}})
            return
        wedge_after = int(os.environ.get("VLLM_STANDIN_WEDGE_AFTER") or 0)
        with State.lock:
            State.completions += 1
            wedged = wedge_after > 0 and State.completions > wedge_after
        if wedged:
            wedge()
        engine = "an SGLang" if ENGINE == "sglang" else "a vLLM"
        text = (f"Hello! I am {State.served}, served by {engine} stand-in whose {State.placed} run on "
                f"{', '.join(sorted(set(ips)))}.")
        self.reply(200, {
            "id": f"chatcmpl-{int(time.time() * 1000)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": State.served,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": len(text.split()), "total_tokens": 12 + len(text.split())},
        })


def main():
    # SIGTERM ends the server, as in vLLM (uvicorn): as PID 1 of its container (the mp ranks
    # have their own PID namespace) the default action would be ignored, and every `docker
    # stop` would wait for its kill timeout.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    args = parse(sys.argv[1:])
    State.served = args.served_model_name or args.model
    State.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
    log(f"vllm stand-in: serve {args.model} as {State.served} on {args.host}:{args.port}, "
        f"VLLM_HOST_IP={os.environ.get('VLLM_HOST_IP')}, RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}, "
        f"backend={args.distributed_executor_backend}, nnodes={args.nnodes}, node_rank={args.node_rank}, "
        f"NCCL_SOCKET_IFNAME={os.environ.get('NCCL_SOCKET_IFNAME')}")
    served_args = {"model": args.model, "tensor_parallel_size": args.tensor_parallel_size}
    if os.path.isdir(args.model):
        # a local snapshot (HF_HUB_OFFLINE): its config decides the architecture
        try:
            check_config(args.model, served_args)
        except LoadError as e:
            fail_load(e)
    elif "unsupported-arch" in args.model:
        # a hub name: the stand-in downloads nothing, the name stands for the config
        try:
            registry().resolve_model_cls(["UnsupportedForCausalLM"])
        except ValueError as e:
            fail_load(LoadError("APIServer", [
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
                f"  Value error, {e} [type=value_error, input_value=ArgsKwargs((), {served_args}), "
                "input_type=ArgsKwargs]"]))
    if args.nnodes > 1 and args.distributed_executor_backend != "ray":
        State.placed = "ranks"
        if args.headless or args.node_rank > 0:
            serve_headless(args)
            return
        keep = serve_rank0(args)
        load_phases(args)
        # As vLLM, the API server starts once the engine (every rank) is up.
        server = ThreadingHTTPServer((args.host, args.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        State.loaded = True
        log("Application startup complete.")
        while True:
            time.sleep(3600)
        del keep
    if args.distributed_executor_backend == "mp":
        # one node, one process group: no Ray, no store; the engine loads, then the API starts
        State.placed = "ranks"
        State.ips = [os.environ.get("VLLM_HOST_IP") or "127.0.0.1"]
        State.healthy = True
        load_phases(args)
        server = ThreadingHTTPServer((args.host, args.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        State.loaded = True
        log("Application startup complete.")
        while True:
            time.sleep(3600)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers = start_ray(args)
    load_phases(args)
    State.loaded = True
    log("Application startup complete.")
    while True:
        time.sleep(3600)
    del workers


if __name__ == "__main__":
    main()
