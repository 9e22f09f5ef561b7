#!/usr/bin/env python3
"""A stand-in for `vllm serve` on the testbed: the same command line, the same Ray behaviour
(join the running cluster, reserve TP x PP {GPU: 1} bundles in a placement group, one actor per
bundle), and the OpenAI endpoints sparkform's probes use. It loads no model and downloads
nothing: the chat reply names the served model and the node IPs of its bundles.

Failure modes the real vLLM shows are reproduced where sparkform must catch them:
- without RAY_ADDRESS, ray.init() starts a private cluster with no GPUs and the placement group
  waits, logging "Waiting for creating a placement group of specs ...";
- a model whose name contains "unsupported-arch" fails like an architecture vLLM lacks.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def log(msg):
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} {msg}", flush=True)


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
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--reasoning-parser", default=None)
    args, unknown = p.parse_known_args(argv[1:])
    if unknown:
        log(f"ignoring options the stand-in does not model: {' '.join(unknown)}")
    return args


class State:
    healthy = False
    ips = []
    served = ""
    lock = threading.Lock()


def start_ray(args):
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    if "unsupported-arch" in args.model:
        log(f"ValueError: Model architectures ['UnsupportedForCausalLM'] are not supported for now.")
        sys.exit(1)
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
                "Check `ray status` to see if you have enough resources.")

    # As vLLM's Ray workers: a GPU each, no CPU reserved.
    @ray.remote(num_gpus=1, num_cpus=0)
    class Worker:
        def ip(self):
            return ray.util.get_node_ip_address()

    workers = [
        Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i)).remote()
        for i in range(world)
    ]
    ips = ray.get([w.ip.remote() for w in workers])
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

    def do_GET(self):
        if self.path == "/health":
            with State.lock:
                ok = State.healthy
            self.reply(200 if ok else 503, None)
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [
                {"id": State.served, "object": "model", "owned_by": "vllm-standin", "max_model_len": None}]})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})

    def do_POST(self):
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
            healthy, ips = State.healthy, list(State.ips)
        if not healthy:
            self.reply(503, {"error": {"message": "the engine is not ready", "code": 503}})
            return
        text = (f"Hello! I am {State.served}, served by a vLLM stand-in whose Ray workers run on "
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
    args = parse(sys.argv[1:])
    State.served = args.served_model_name or args.model
    log(f"vllm stand-in: serve {args.model} as {State.served} on {args.host}:{args.port}, "
        f"VLLM_HOST_IP={os.environ.get('VLLM_HOST_IP')}, RAY_ADDRESS={os.environ.get('RAY_ADDRESS')}, "
        f"NCCL_SOCKET_IFNAME={os.environ.get('NCCL_SOCKET_IFNAME')}")
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workers = start_ray(args)
    log("Application startup complete.")
    while True:
        time.sleep(3600)
    del workers


if __name__ == "__main__":
    main()
