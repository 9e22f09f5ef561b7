"""torch.distributed, as far as the fabric test asks: a process group whose rank 0 listens on
the init_method's address and whose all-reduce sums the ranks' values for real over TCP."""

import os
import socket
import struct
import sys
import time

_group = None


class _Group:
    def __init__(self, rank, world, peers):
        self.rank = rank
        self.world = world
        self.peers = peers  # rank 0: a socket per other rank; others: [socket to rank 0]


def _recv(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("a peer closed the connection")
        data += chunk
    return data


def _nccl_info(line):
    if os.environ.get("NCCL_DEBUG", "").upper() == "INFO":
        print(f"{socket.gethostname()}:{os.getpid()}:{os.getpid()} [0] NCCL INFO {line}", flush=True)


def init_process_group(backend, init_method, rank, world_size, timeout=None):
    global _group
    if not init_method.startswith("tcp://"):
        raise ValueError("the stand-in takes tcp:// only")
    host, port = init_method[len("tcp://"):].rsplit(":", 1)
    port = int(port)
    limit = time.monotonic() + (timeout.total_seconds() if timeout else 300)
    _nccl_info(f"NET/Socket : Using [0]fabric:{host}<0>")
    if rank == 0:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, port))
        srv.listen(world_size)
        srv.settimeout(max(1.0, limit - time.monotonic()))
        peers = {}
        while len(peers) < world_size - 1:
            conn, addr = srv.accept()
            r = struct.unpack("!i", _recv(conn, 4))[0]
            peers[r] = conn
            _nccl_info(f"rank {r} joined from {addr[0]}")
        srv.close()
        _group = _Group(0, world_size, [peers[r] for r in sorted(peers)])
    else:
        while True:
            try:
                s = socket.create_connection((host, port), timeout=2)
                break
            except OSError:
                if time.monotonic() > limit:
                    raise RuntimeError(f"rank 0 at {host}:{port} did not answer")
                time.sleep(0.2)
        s.settimeout(max(1.0, limit - time.monotonic()))
        s.sendall(struct.pack("!i", rank))
        _group = _Group(rank, world_size, [s])
    _nccl_info(f"Channel 00/0 : {rank}[0] -> {(rank + 1) % world_size}[0] [send] via NET/Socket/0")


def all_reduce(tensor, op=None):
    g = _group
    if g is None:
        raise RuntimeError("no process group")
    if g.rank == 0:
        total = tensor.value
        for p in g.peers:
            total += struct.unpack("!d", _recv(p, 8))[0]
        for p in g.peers:
            p.sendall(struct.pack("!d", total))
    else:
        g.peers[0].sendall(struct.pack("!d", tensor.value))
        total = struct.unpack("!d", _recv(g.peers[0], 8))[0]
    tensor.value = total
    if tensor._parent is not None and tensor.count == tensor._parent.count:
        tensor._parent.value = total
    # The time the bus would take: busbw = size / t * 2 (n - 1) / n.
    busbw = float(os.environ.get("SPARKFORM_STANDIN_BUSBW_GBPS", "10"))
    size = tensor.count * tensor.element_size()
    time.sleep(size * 2 * (g.world - 1) / g.world / (busbw * 1e9))


def barrier():
    probe = sys.modules["torch"].Tensor(1, 0.0)
    all_reduce(probe)


def destroy_process_group():
    global _group
    if _group is not None:
        for p in _group.peers:
            p.close()
    _group = None

