#!/usr/bin/env bash
# A/B of two ddl-bench builds on the same cores: `ddl-bench allreduce` of each, alternating
# (A, B, B, A, A, B, ...: neither build always runs first), at the given sizes and algorithms.
# Prints per algorithm and size the median time of each build and the median of the per-round
# ratios B / A (a slow phase of the host hits both builds of a round alike).
#   tools/bench/ab_allreduce.sh A_DDL_BENCH B_DDL_BENCH [OUT_DIR]
# Env: AB_NP (2), AB_ROUNDS (10), AB_ALGOS (ring,rhd,multicolor,multiring,shm,mpi,auto),
#      AB_MIN_BYTES (4KiB), AB_MAX_BYTES (16MiB), AB_STEP (16: 4 KiB, 64 KiB, 1 MiB, 16 MiB),
#      AB_ITERS (20, ddl-bench's --iters).
set -euo pipefail
cd "$(dirname "$0")/../.."
a=$1
b=$2
out=${3:-bench-out/ab-allreduce}
np=${AB_NP:-2}
rounds=${AB_ROUNDS:-10}
algos=${AB_ALGOS:-ring,rhd,multicolor,multiring,shm,mpi,auto}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$out"
: > "$out/a.jsonl"
: > "$out/b.jsonl"
measure() {
  mpirun -np "$np" "$1" allreduce --json --algos "$algos" --min-bytes "${AB_MIN_BYTES:-4KiB}" \
    --max-bytes "${AB_MAX_BYTES:-16MiB}" --step-factor "${AB_STEP:-16}" \
    --iters "${AB_ITERS:-20}" | grep '^{' | sed "s/^{/{\"round\":$3,/" >> "$out/$2.jsonl"
}
for round in $(seq "$rounds"); do
  echo "ab_allreduce: round $round of $rounds" >&2
  if [ $((round % 2)) -eq 1 ]; then
    measure "$a" a "$round"; measure "$b" b "$round"
  else
    measure "$b" b "$round"; measure "$a" a "$round"
  fi
done
"$python" - "$out" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
rows = {}
for side in "ab":
    for line in open(f"{out}/{side}.jsonl"):
        r = json.loads(line)
        rows.setdefault((r["algo"], r["bytes"]), {}).setdefault(r["round"], {})[side] = r["time_us"]
print("| algorithm | size | A (us) | B (us) | B / A (median of rounds) | rounds |")
print("|---|---|---|---|---|---|")
for (algo, size), by_round in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    both = [v for v in by_round.values() if "a" in v and "b" in v]
    a = statistics.median(v["a"] for v in both)
    b = statistics.median(v["b"] for v in both)
    ratio = statistics.median(v["b"] / v["a"] for v in both)
    name = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
    print(f"| {algo} | {name} | {a:.3g} | {b:.3g} | {ratio:.3f} | {len(both)} |")
EOF
