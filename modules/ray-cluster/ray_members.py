# Ray membership gate: run in the Ray head container as
#   python3 -c "$(cat ray_members.py)" EXPECTED_IPS_COMMA_SEPARATED EXPECTED_GPUS
import sys

import ray

expected = set(filter(None, sys.argv[1].split(",")))
want_gpus = float(sys.argv[2])
ray.init(address="auto", logging_level="ERROR")
alive = [n for n in ray.nodes() if n.get("Alive")]
seen = {n["NodeManagerAddress"] for n in alive}
gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in alive)
problems = []
for ip in sorted(seen - expected):
    problems.append(
        f"Ray registered a node at {ip}, which is not a planned fabric address: "
        "that node's ray start picked another interface (usually the default route); "
        "pass --node-ip-address=<its fabric address>"
    )
for ip in sorted(expected - seen):
    problems.append(f"no live Ray node at {ip}: its worker has not joined (or joined with another address)")
if gpus != want_gpus:
    problems.append(f"Ray sees {gpus:g} GPUs, the plan expects {want_gpus:g}: check --num-gpus and the GPU device requests")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"ray-members-ok {len(seen)} nodes, {gpus:g} GPUs")
