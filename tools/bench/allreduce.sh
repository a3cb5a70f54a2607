#!/usr/bin/env bash
# Allreduce busbw of every ddl algorithm vs MPI_Allreduce (ddl-bench's `mpi`) vs
# torch.distributed gloo, np 2 and 4, 4 KiB .. 64 MiB, on this machine.
#   tools/bench/allreduce.sh [OUT_DIR]      (called by `make bench` with bench-out/)
# Env: ALLREDUCE_NPS ("2 4"), ALLREDUCE_MAX_BYTES (64MiB), ALLREDUCE_ITERS (20),
#      BENCH_RUNS (runs per configuration, median of run medians; default 1), PYTHON,
#      ALLREDUCE_LOCK=FILE (run each measurement under `flock FILE`, on a shared machine).
# Raw JSON lines land in OUT_DIR/allreduce-*.jsonl; a busbw table (GB/s) is printed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out}
nps=${ALLREDUCE_NPS:-2 4}
max=${ALLREDUCE_MAX_BYTES:-64MiB}
iters=${ALLREDUCE_ITERS:-20}
runs=${BENCH_RUNS:-1}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
bench=target/release/ddl-bench
lock=(); [ -n "${ALLREDUCE_LOCK:-}" ] && lock=(flock "$ALLREDUCE_LOCK")
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$bench" ] || cargo build --release -p ddl-tools --bin ddl-bench
max_bytes=$("$python" -c "
s='$max'.lower().replace('ib','').rstrip('b'); m={'k':1<<10,'m':1<<20,'g':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))")

: > "$out/allreduce-ddl.jsonl"
: > "$out/allreduce-gloo.jsonl"
for np in $nps; do
  echo "allreduce: np $np: ddl-bench calibrate -> $out/model-np$np.json" >&2
  "${lock[@]}" mpirun --allow-run-as-root --oversubscribe -np "$np" "$bench" calibrate \
    -o "$out/model-np$np.json" --max-bytes "$max" >/dev/null
done
for run in $(seq "$runs"); do
  for np in $nps; do
    echo "allreduce: run $run, np $np: ddl-bench (ring rhd multicolor multiring mpi auto)" >&2
    "${lock[@]}" mpirun --allow-run-as-root --oversubscribe -np "$np" "$bench" allreduce --json \
      --algos ring,rhd,multicolor,multiring,mpi,auto --min-bytes 4KiB --max-bytes "$max" \
      --iters "$iters" --model-file "$out/model-np$np.json" | grep '^{' >> "$out/allreduce-ddl.jsonl"
    if "$python" -c "import torch.distributed" 2>/dev/null; then
      echo "allreduce: run $run, np $np: gloo" >&2
      "${lock[@]}" "$python" tools/bench/gloo_allreduce.py --ranks "$np" --min-bytes 4096 \
        --max-bytes "$max_bytes" --iters "$iters" | grep '^{' >> "$out/allreduce-gloo.jsonl"
    else
      echo "allreduce: $python has no torch; gloo rows skipped" >&2
    fi
  done
done

"$python" - "$out/allreduce-ddl.jsonl" "$out/allreduce-gloo.jsonl" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = defaultdict(list)
times = defaultdict(list)
pred = {}
correct = {}
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        algo = r["algo"].split(":")[0]
        key = (r["ranks"], r["bytes"], algo)
        rows[key].append(r["busbw_gbps"])
        times[key].append(r["time_us"])
        if "predicted_us" in r:
            pred[key] = r["predicted_us"]
        correct[key] = correct.get(key, True) and r["correct"]
algos = [a for a in ["ring", "rhd", "multicolor", "multiring", "mpi", "auto", "gloo"] if any(k[2] == a for k in rows)]
for np_ in sorted({k[0] for k in rows}):
    print(f"\n# busbw GB/s (median of runs), np={np_}; (xN) = ratio to mpi; * = not bitwise correct")
    print(f"{'bytes':>10} " + " ".join(f"{a:>16}" for a in algos))
    for b in sorted({k[1] for k in rows if k[0] == np_}):
        mpi = statistics.median(rows[(np_, b, "mpi")]) if rows.get((np_, b, "mpi")) else None
        cells = []
        for a in algos:
            v = rows.get((np_, b, a))
            if not v:
                cells.append(f"{'-':>16}")
                continue
            m = statistics.median(v)
            mark = "" if correct[(np_, b, a)] else "*"
            ratio = f"(x{m / mpi:.2f})" if mpi and a != "mpi" else ""
            cells.append(f"{m:>8.3f}{ratio:>7}{mark:1}")
        print(f"{b:>10} " + " ".join(cells))
worst = {}
for key, p in pred.items():
    if key[1] > 1 << 20:
        ratio = statistics.median(times[key]) / p
        w = worst.get((key[0], key[2]))
        if w is None or abs(ratio - 1) > abs(w[0] - 1):
            worst[(key[0], key[2])] = (ratio, key[1])
print("\n# cost model: worst measured/predicted time above 1 MiB (median of runs)")
for (np_, a), (ratio, b) in sorted(worst.items()):
    print(f"np={np_} {a:>11}: {ratio:.2f} at {b} bytes")
PY
