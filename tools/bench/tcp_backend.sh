#!/usr/bin/env bash
# ddl.dist's TCP backend (torchrun, no MPI) against gloo (same processes, same tensors) and
# against ddl's MPI backend (mpirun), busbw per size: RUNS alternating rounds of one torchrun
# job and one mpirun job (tools/bench/python_allreduce.py), every JSON line to OUT, then the
# medians over the rounds per (backend, algorithm, ranks, size).
#
#   tools/bench/tcp_backend.sh [NP] [OUT]     env: RUNS (3), ALGOS (auto,ring), SIZES, ITERS (10)
set -euo pipefail
cd "$(dirname "$0")/../.."
np=${1:-2}
out=${2:-bench-out/tcp_backend_np$np.jsonl}
runs=${RUNS:-3}
algos=${ALGOS:-auto,ring}
sizes=${SIZES:-4096,65536,1048576,16777216,67108864}
iters=${ITERS:-10}
mkdir -p "$(dirname "$out")"
: > "$out"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
for run in $(seq "$runs"); do
  port=$((29700 + run))
  OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node "$np" --master_addr 127.0.0.1 \
    --master_port "$port" tools/bench/python_allreduce.py --algos "$algos,gloo" \
    --sizes "$sizes" --iters "$iters" 2>/dev/null | grep '^{' >> "$out"
  mpirun "${root[@]}" --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 \
    .venv/bin/python tools/bench/python_allreduce.py --algos "$algos" --sizes "$sizes" \
    --iters "$iters" 2>/dev/null | grep '^{' >> "$out"
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    backend = "gloo" if r["algo"] == "gloo" else f"ddl-{r['backend']}"
    rows[(r["ranks"], r["bytes"], backend, r["algo"])].append(r["busbw_gbps"])
print("| ranks | bytes | backend | algorithm | busbw GB/s (median) | runs |")
print("|---|---|---|---|---|---|")
for (p, b, backend, algo), v in sorted(rows.items()):
    print(f"| {p} | {b} | {backend} | {algo} | {statistics.median(v):.3f} | {len(v)} |")
PY
