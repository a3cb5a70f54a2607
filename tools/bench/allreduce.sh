#!/usr/bin/env bash
# Allreduce on one node: every ddl algorithm against the peers a user would pick, side by side
# on the same cores: Open MPI's own in-place MPI_Allreduce in a plain C loop
# (tools/bench/mpi_allreduce.c, built here with mpicc, as OSU and nccl-tests measure it) and
# torch.distributed gloo, plus a plain memcpy of the buffer on every rank at once (the
# memory-bandwidth bound). All three print the same statistic: the mean of N back-to-back
# calls on the slowest rank (N = clamp(iters x 64 MiB / bytes, iters, 10000)).
#   tools/bench/allreduce.sh [OUT_DIR]      (called by `make bench` with bench-out/)
# Env: ALLREDUCE_NPS ("2 3 4"), ALLREDUCE_MIN_BYTES (4KiB), ALLREDUCE_MAX_BYTES (64MiB),
#      ALLREDUCE_ITERS (5), ALLREDUCE_ALGOS (every ddl algorithm), BENCH_RUNS (alternating runs
#      of C loop / ddl-bench / gloo; medians are reported; default 3), PYTHON,
#      ALLREDUCE_LOCK=FILE (run each measurement under `flock FILE`, on a shared machine).
# Raw JSON lines land in OUT_DIR/allreduce-*.jsonl; the tables of BENCHMARKS.md are printed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out}
nps=${ALLREDUCE_NPS:-2 3 4}
min=${ALLREDUCE_MIN_BYTES:-4KiB}
max=${ALLREDUCE_MAX_BYTES:-64MiB}
iters=${ALLREDUCE_ITERS:-5}
algos=${ALLREDUCE_ALGOS:-ring,rhd,multicolor,multiring,shm,mpi,auto}
runs=${BENCH_RUNS:-3}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
bench=target/release/ddl-bench
peer=target/peers/mpi_allreduce
lock=(); [ -n "${ALLREDUCE_LOCK:-}" ] && lock=(flock "$ALLREDUCE_LOCK")
mpirun=(mpirun --allow-run-as-root --oversubscribe)
mkdir -p "$out" "$(dirname "$peer")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$bench" ] || cargo build --release -p ddl-tools --bin ddl-bench
mpicc -O2 -Wall -o "$peer" tools/bench/mpi_allreduce.c
bytes_of() {
  "$python" -c "
s='$1'.lower().replace('ib','').rstrip('b'); m={'k':1<<10,'m':1<<20,'g':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))"
}
min_bytes=$(bytes_of "$min")
max_bytes=$(bytes_of "$max")

for f in ddl c gloo; do : > "$out/allreduce-$f.jsonl"; done
for np in $nps; do
  echo "allreduce: np $np: ddl-bench calibrate -> $out/model-np$np.json" >&2
  "${lock[@]}" "${mpirun[@]}" -np "$np" "$bench" calibrate -o "$out/model-np$np.json" \
    --max-bytes "$max" >/dev/null
done
for run in $(seq "$runs"); do
  for np in $nps; do
    echo "allreduce: run $run, np $np: C loop, ddl-bench ($algos), gloo" >&2
    "${lock[@]}" "${mpirun[@]}" -np "$np" "$peer" --min-bytes "$min_bytes" \
      --max-bytes "$max_bytes" --iters "$iters" | grep '^{' >> "$out/allreduce-c.jsonl"
    "${lock[@]}" "${mpirun[@]}" -np "$np" "$bench" allreduce --json --algos "$algos" \
      --min-bytes "$min" --max-bytes "$max" --iters "$iters" \
      --model-file "$out/model-np$np.json" | grep '^{' >> "$out/allreduce-ddl.jsonl"
    if "$python" -c "import torch.distributed" 2>/dev/null; then
      "${lock[@]}" "$python" tools/bench/gloo_allreduce.py --ranks "$np" --min-bytes "$min_bytes" \
        --max-bytes "$max_bytes" --iters "$iters" | grep '^{' >> "$out/allreduce-gloo.jsonl"
    else
      echo "allreduce: $python has no torch; gloo rows skipped" >&2
    fi
  done
done

"$python" tools/bench/allreduce_table.py "$out"/allreduce-{c,ddl,gloo}.jsonl
