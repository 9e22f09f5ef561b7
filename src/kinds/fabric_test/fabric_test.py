#!/usr/bin/env python3
"""sparkform's fabric test: an all-reduce between the nodes, one rank per node.

Each rank runs in a one-shot container of the deployment's image on its node. The ranks meet
at rank 0's fabric address (torch.distributed's TCP rendezvous) and all-reduce a buffer over
NCCL, as vLLM's collectives do, at a few sizes up to --size. Rank 0 prints nccl-tests' table
(the bus bandwidth as nccl-tests defines it for an all-reduce: algbw * 2 (n - 1) / n), which
sparkform parses like nccl-tests' own output. torch's all-reduce is in place: the out-of-place
columns say N/A.

Exit codes: 0 done, 3 wrong values, 4 the ranks did not meet or the collective failed,
6 no torch in the image, 7 no CUDA device, 2 bad arguments.
"""

import argparse
import datetime
import os
import socket
import sys
import time

WARMUP = 5


def fail(code, message):
    print(f"fabric_test: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--iterations", type=int, required=True)
    p.add_argument("--timeout", type=int, required=True)
    a = p.parse_args()
    deadline = time.monotonic() + a.timeout
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        fail(6, f"this image has no torch ({e})")
    if not torch.cuda.is_available():
        fail(7, "no CUDA device is visible in the container")
    torch.cuda.set_device(0)
    try:
        dist.init_process_group(
            "nccl",
            init_method=f"tcp://{a.master_addr}:{a.master_port}",
            rank=a.rank,
            world_size=a.world_size,
            timeout=datetime.timedelta(seconds=max(1, a.timeout)),
        )
    except Exception as e:  # noqa: BLE001 - whatever torch raises, the ranks did not meet
        fail(4, f"rank {a.rank} could not join rank 0 at {a.master_addr}:{a.master_port}: {e}")
    n = a.world_size
    count = max(1, a.size // 4)
    try:
        buf = torch.ones(count, dtype=torch.float32, device="cuda")
        # Correctness first: rank r contributes r + 1; every element must be the sum.
        buf.fill_(float(a.rank + 1))
        dist.all_reduce(buf)
        torch.cuda.synchronize()
        want = float(n * (n + 1) // 2)
        wrong = int((buf != want).sum().item())
        sizes = sorted({max(4, (count >> s) * 4) for s in (6, 4, 2, 0)})
        rows = []
        for size in sizes:
            part = buf[: size // 4]
            for _ in range(WARMUP):
                dist.all_reduce(part)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.iterations):
                dist.all_reduce(part)
            torch.cuda.synchronize()
            took = (time.perf_counter() - t0) / a.iterations
            algbw = size / took / 1e9
            busbw = algbw * 2 * (n - 1) / n
            rows.append((size, size // 4, took * 1e6, algbw, busbw))
            if time.monotonic() > deadline:
                fail(4, "the timeout ended during the test")
        dist.barrier()
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001 - a collective that failed
        fail(4, f"rank {a.rank}: the all-reduce failed: {e}")
    if a.rank == 0:
        host = socket.gethostname()
        print(f"# sparkform fabric_test (torch {getattr(torch, '__version__', '?')})")
        print(f"# nThread 1 nGpus 1 minBytes {sizes[0]} maxBytes {sizes[-1]} step: 4(factor) "
              f"warmup iters: {WARMUP} iters: {a.iterations} agg iters: 1 validation: 1 graph: 0")
        print("#")
        print(f"#  Rank  0 Group  0 Pid {os.getpid():6d} on {host:>10} device  0 "
              f"{torch.cuda.get_device_name(0)}")
        print("#")
        print("#                                                              out-of-place                       in-place")
        print("#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong")
        print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)")
        for size, cnt, us, algbw, busbw in rows:
            print(f"{size:12d}  {cnt:12d}     float     sum      -1      N/A     N/A     N/A     N/A"
                  f"  {us:8.1f}  {algbw:6.2f}  {busbw:6.2f}  {wrong:6d}")
        print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {sum(r[4] for r in rows) / len(rows):.4f}")
        sys.stdout.flush()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is printed; teardown is best effort
        pass
    if wrong:
        fail(3, f"{wrong} of {count} elements are wrong after the all-reduce")


if __name__ == "__main__":
    main()
