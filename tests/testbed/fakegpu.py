#!/usr/bin/env python3
"""A fake unified-memory GPU for a testbed node (`testbed gpu NODE on`), as a DGX Spark's GB10
shows itself to sparkform: `nvidia-smi` names an "NVIDIA GB10" with no memory of its own, and
the node's memory (/proc/meminfo, a file bind-mounted over it) is what the GPU uses.

The accounting, kept by `fakegpu.py daemon` in STATE_DIR:
- every running nested container whose command is `vllm serve … --gpu-memory-utilization U`
  holds U × the total while it runs; once it stops or is removed it keeps holding it for
  `release_delay` seconds (an engine releasing its memory), or forever with `hold = never`
  (an orphaned VLLM::EngineCore);
- the files under `cache_path` are in the page cache, each byte counted `cache_scale` times
  (the testbed's weights are MiB where a real model's are GiB), until `dd iflag=nocache` reads
  them (the `dd` shim records it in `dropped`) and again once they are written after that.
MemFree = total − held − cached. Every change is a line in `log`, with the time.

Usage: fakegpu.py daemon | nvidia-smi ARGS… | state
"""

import json
import os
import subprocess
import sys
import time

STATE_DIR = "/run/sparkform-fakegpu"
CONFIG = f"{STATE_DIR}/config.json"
STATE = f"{STATE_DIR}/state.json"
MEMINFO = f"{STATE_DIR}/meminfo"
DROPPED = f"{STATE_DIR}/dropped"
LOG = f"{STATE_DIR}/log"
KIB_PER_GIB = 1024 * 1024


def log(line):
    with open(LOG, "a") as f:
        f.write(f"{time.time():.3f} {line}\n")


def config():
    with open(CONFIG) as f:
        return json.load(f)


def running_engines():
    """{id: (name, utilization)} of the running containers that serve vLLM."""
    out = subprocess.run(
        ["docker", "ps", "--no-trunc", "--format", "{{.ID}}\t{{.Names}}\t{{.Command}}"],
        capture_output=True, text=True, timeout=20,
    ).stdout
    engines = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 3 or "vllm serve" not in parts[2]:
            continue
        words = parts[2].strip('"').split()
        util = 0.9
        if "--gpu-memory-utilization" in words:
            i = words.index("--gpu-memory-utilization")
            try:
                util = float(words[i + 1])
            except (IndexError, ValueError):
                pass
        engines[parts[0]] = (parts[1], util)
    return engines


def dropped():
    """{path: time of the last drop}."""
    out = {}
    try:
        with open(DROPPED) as f:
            for line in f:
                t, _, path = line.rstrip("\n").partition("\t")
                try:
                    when = float(t)
                except ValueError:
                    continue
                # A drop names what dd opened: a snapshot's symlink counts for its blob.
                for p in (path, os.path.realpath(path)):
                    out[p] = max(out.get(p, 0), when)
    except FileNotFoundError:
        pass
    return out


def cached_kib(cfg):
    drops = dropped()
    total = 0
    for root, _dirs, files in os.walk(cfg["cache_path"]):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            real = os.path.realpath(path)
            if max(drops.get(path, 0), drops.get(real, 0)) >= st.st_mtime:
                continue
            total += st.st_size * cfg["cache_scale"] // 1024
    return total


def write_meminfo(total_kib, free_kib, cached):
    # Fixed widths, written in place over the same bytes: the bind mount keeps the file's inode,
    # and a reader never sees a half-written number.
    text = (
        f"MemTotal:       {total_kib:12d} kB\n"
        f"MemFree:        {free_kib:12d} kB\n"
        f"MemAvailable:   {free_kib + cached:12d} kB\n"
        f"Buffers:        {0:12d} kB\n"
        f"Cached:         {cached:12d} kB\n"
    )
    fd = os.open(MEMINFO, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, text.encode(), 0)
    finally:
        os.close(fd)


def daemon():
    holders = {}  # id -> {"name", "gib", "pid", "until"}; until None while running
    pid_of = {}
    next_pid = 4242
    last = None
    while True:
        cfg = config()
        total_gib = cfg["total_gib"]
        now = time.time()
        engines = running_engines()
        for cid, (name, util) in engines.items():
            if cid not in holders or holders[cid]["until"] is not None:
                if cid not in pid_of:
                    pid_of[cid] = next_pid
                    next_pid += 1
                holders[cid] = {"name": name, "gib": util * total_gib, "pid": pid_of[cid], "until": None}
                log(f"holds {name} {util * total_gib:.1f} GiB")
        for cid, h in list(holders.items()):
            if cid in engines:
                continue
            if h["until"] is None:
                h["until"] = float("inf") if cfg["hold"] == "never" else now + cfg["release_delay"]
                log(f"stopped {h['name']}, releasing {'never' if cfg['hold'] == 'never' else 'in %ss' % cfg['release_delay']}")
            elif cfg["hold"] != "never" and h["until"] == float("inf"):
                h["until"] = now
            if now >= h["until"]:
                log(f"released {h['name']} {h['gib']:.1f} GiB")
                del holders[cid]
        held_kib = int(sum(h["gib"] for h in holders.values()) * KIB_PER_GIB)
        total_kib = int(total_gib * KIB_PER_GIB)
        cached = min(cached_kib(cfg), total_kib)
        free_kib = max(0, total_kib - held_kib - cached)
        write_meminfo(total_kib, free_kib, cached)
        state = {
            "apps": [
                {"pid": h["pid"], "name": "VLLM::EngineCore", "mib": int(h["gib"] * 1024), "container": h["name"]}
                for h in holders.values()
            ],
            "free_gib": free_kib / KIB_PER_GIB,
            "cached_gib": cached / KIB_PER_GIB,
        }
        tmp = STATE + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
        os.replace(tmp, STATE)
        now_line = f"free {free_kib / KIB_PER_GIB:.1f} GiB (held {held_kib / KIB_PER_GIB:.1f}, cached {cached / KIB_PER_GIB:.1f})"
        if now_line != last:
            log(now_line)
            last = now_line
        time.sleep(0.3)


def nvidia_smi(args):
    try:
        with open(STATE) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {"apps": []}
    joined = " ".join(args)
    if "--query-gpu" in joined:
        print("NVIDIA GB10, [N/A]")
    elif "--query-compute-apps" in joined:
        for a in state["apps"]:
            print(f"{a['pid']}, {a['name']}, {a['mib']} MiB")
    else:
        print("+-----------------------------------------------------------------------------------------+")
        print("| NVIDIA-SMI 580.95.05             Driver Version: 580.95.05      CUDA Version: 13.0     |")
        print("|   0  NVIDIA GB10 (sparkform testbed fake)                                               |")
        print("+-----------------------------------------------------------------------------------------+")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "daemon":
        daemon()
    elif what == "nvidia-smi":
        nvidia_smi(sys.argv[2:])
    elif what == "state":
        with open(STATE) as f:
            print(f.read())
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
