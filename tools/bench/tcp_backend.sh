#!/usr/bin/env bash
# ddl.dist's TCP backend (torchrun, no MPI) against gloo (same processes, same tensors) and
# against ddl's MPI backend (mpirun), busbw per size: RUNS alternating rounds of one torchrun
# job and one mpirun job (tools/bench/python_allreduce.py), every JSON line to OUT, then the
# medians over the rounds per (backend, algorithm, ranks, size), and ratios taken per round
# (the medians over the rounds of time / time in the same round): each algorithm under
# torchrun against itself under mpirun (`tcp/mpi`), and gloo against ddl's TCP ring.
# With BASE=DIR (a copy of python/ddl built from another commit), every round also runs the
# torchrun job with that build first on PYTHONPATH (lines tagged "build": "base"; the two
# torchrun jobs take turns going first) and the table adds `head/base` per algorithm.
#
# With NODES=N (root), the job runs on the emulated cluster of tools/bench/netns-cluster.sh
# (N namespaces, RATE per node link, default 1gbit; set up and torn down here): one torchrun
# agent per namespace (`--nnodes N`, NP/N processes each, the store on node 1) and mpirun
# through the cluster's launcher.
#
#   tools/bench/tcp_backend.sh [NP] [OUT]     env: RUNS (3), ALGOS (auto,ring,shm), SIZES,
#                                             ITERS (10), BASE, NODES (1), RATE (1gbit)
set -euo pipefail
cd "$(dirname "$0")/../.."
np=${1:-2}
nodes=${NODES:-1}
out=${2:-bench-out/tcp_backend_np$np${NODES:+_nodes$nodes}.jsonl}
cluster=tools/bench/netns-cluster.sh
if [ "$nodes" -gt 1 ]; then
  if [ -d /tmp/ddl-netns-cluster ]; then
    echo "tcp_backend: an emulated cluster is up (/tmp/ddl-netns-cluster): another run owns it" >&2
    exit 1
  fi
  trap '"$cluster" teardown' EXIT
  "$cluster" setup "$nodes" "${RATE:-1gbit}"
fi
runs=${RUNS:-3}
algos=${ALGOS:-auto,ring,shm}
sizes=${SIZES:-4096,65536,1048576,16777216,67108864}
iters=${ITERS:-10}
mkdir -p "$(dirname "$out")"
: > "$out"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
tagged() { sed "s/^{/{\"build\": \"$1\", \"round\": $run, /"; }
bench_args=(tools/bench/python_allreduce.py --sizes "$sizes" --iters "$iters")
torchrun_job() {  # BUILD PORT_OFFSET [PYTHONPATH]
  port=$((29700 + 2 * run + $2))
  if [ "$nodes" = 1 ]; then
    PYTHONPATH=${3:-} OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node "$np" \
      --master_addr 127.0.0.1 --master_port "$port" "${bench_args[@]}" --algos "$algos,gloo" \
      2>/dev/null | grep '^{' | tagged "$1" >> "$out"
    return
  fi
  local logs pids=() i
  logs=$(mktemp -d)
  for i in $(seq "$nodes"); do
    ip netns exec "ddlcns$i" env PYTHONPATH="${3:-}" OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 \
      .venv/bin/torchrun --nnodes "$nodes" --node_rank $((i - 1)) \
      --nproc_per_node $((np / nodes)) --master_addr 10.77.0.1 --master_port "$port" \
      "${bench_args[@]}" --algos "$algos,gloo" > "$logs/$i" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}" || { echo "tcp_backend: a torchrun agent failed:" >&2; tail -5 "$logs"/* >&2; }
  grep '^{' "$logs/1" | tagged "$1" >> "$out" || true
  rm -r "$logs"
}
mpi_job() {
  if [ "$nodes" = 1 ]; then
    mpirun "${root[@]}" --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 \
      .venv/bin/python "${bench_args[@]}" --algos "$algos"
  else
    "$cluster" mpirun "$np" -x OMP_NUM_THREADS=1 .venv/bin/python "${bench_args[@]}" --algos "$algos"
  fi
}
for run in $(seq "$runs"); do
  echo "tcp_backend: round $run of $runs, np $np; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  if [ -n "${BASE:-}" ] && [ $((run % 2)) = 0 ]; then torchrun_job base 1 "$BASE"; fi
  torchrun_job head 0
  if [ -n "${BASE:-}" ] && [ $((run % 2)) = 1 ]; then torchrun_job base 1 "$BASE"; fi
  mpi_job 2>/dev/null | grep '^{' | tagged head >> "$out"
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
from collections import defaultdict
bw, time = defaultdict(list), {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    backend = "gloo" if r["algo"] == "gloo" else f"ddl-{r['backend']}"
    if r["build"] != "head":
        backend += "-" + r["build"]
    col = (r["ranks"], r["bytes"], backend, r["algo"])
    bw[col].append(r["busbw_gbps"])
    time[col + (r["round"],)] = r["time_us"]
print("| ranks | bytes | backend | algorithm | busbw GB/s (median) | runs |")
print("|---|---|---|---|---|---|")
for (p, b, backend, algo), v in sorted(bw.items()):
    print(f"| {p} | {b} | {backend} | {algo} | {statistics.median(v):.3f} | {len(v)} |")

def paired(p, b, x, y):
    """Median over the rounds of x's time over y's (both (backend, algorithm))."""
    rs = [time[(p, b) + x + (k,)] / time[(p, b) + y + (k,)] for k in {k[-1] for k in time}
          if (p, b) + x + (k,) in time and (p, b) + y + (k,) in time]
    return f"{statistics.median(rs):.2f}" if rs else "-"

algos = sorted({c[3] for c in bw if c[3] != "gloo"})
base = any(c[2].endswith("-base") for c in bw)
head = ["ranks", "bytes"] + [f"{a} tcp/mpi" for a in algos] + ["ring tcp/gloo"] + \
    ([f"{a} head/base" for a in algos + ["gloo"]] if base else [])
print("\nTime ratios, medians over the rounds of the ratio within a round:")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for p, b in sorted({c[:2] for c in bw}):
    row = [str(p), str(b)] + [paired(p, b, ("ddl-tcp", a), ("ddl-mpi", a)) for a in algos]
    row.append(paired(p, b, ("ddl-tcp", "ring"), ("gloo", "gloo")))
    if base:
        row += [paired(p, b, ("ddl-tcp", a), ("ddl-tcp-base", a)) for a in algos]
        row.append(paired(p, b, ("gloo", "gloo"), ("gloo-base", "gloo")))
    print("| " + " | ".join(row) + " |")
PY
