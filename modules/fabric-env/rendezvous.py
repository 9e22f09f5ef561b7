# Rendezvous gate of vllm-mp, run in rank 0's container (host network, so /proc/net is the
# node's) as
#   python3 -c "$(cat rendezvous.py)" MASTER_PORT MASTER_ADDRESS WORKER_ADDRESSES_COMMA_SEPARATED
# Reads the kernel's TCP table instead of calling ss or netstat, which vLLM images lack.
import socket
import struct
import sys

port = int(sys.argv[1])
master = sys.argv[2]
want = [a for a in sys.argv[3].split(",") if a]

LISTEN, ESTABLISHED = "0A", "01"


def v4(h):
    return socket.inet_ntoa(struct.pack("<I", int(h, 16)))


def v6(h):
    raw = b"".join(struct.pack("<I", int(h[i:i + 8], 16)) for i in range(0, 32, 8))
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntoa(raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


listening = False
peers = {}
for path, parse in (("/proc/net/tcp", v4), ("/proc/net/tcp6", v6)):
    try:
        with open(path) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        cols = row.split()
        local, remote, state = cols[1], cols[2], cols[3]
        if int(local.rsplit(":", 1)[1], 16) != port:
            continue
        if state == LISTEN:
            listening = True
        elif state == ESTABLISHED:
            ip = parse(remote.rsplit(":", 1)[0])
            peers[ip] = peers.get(ip, 0) + 1

problems = []
if not listening:
    problems.append(f"nothing listens on port {port} on the head: rank 0's process group is not up (see its log)")
# Rank 0's own processes (and the ready check) connect from the master address itself.
local = {master, "127.0.0.1", "::1"}
for ip in sorted(set(peers) - set(want) - local):
    problems.append(
        f"a rank joined the master port from {ip}, which is not a planned fabric address "
        f"(planned: {', '.join(want)}): that node reaches {master} from another address, usually "
        "a second address on its fabric interface that comes first, or a route over another "
        "network; remove that address (ip addr del) or fix the route, then apply again"
    )
for ip in want:
    if ip not in peers:
        problems.append(f"no rank has joined from {ip}: its container is not running, or it joined from another address")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"rendezvous-ok {len(want) + 1} nodes: {master} (rank 0), {', '.join(want)}")
