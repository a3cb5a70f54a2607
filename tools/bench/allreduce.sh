#!/usr/bin/env bash
# Allreduce on one node: every ddl algorithm against the peers a user would pick, side by side
# on the same cores: Open MPI's own in-place MPI_Allreduce in a plain C loop
# (tools/bench/mpi_allreduce.c, built here with mpicc, as OSU and nccl-tests measure it) and
# torch.distributed gloo, plus one in-place pass over the buffer on every rank at once (the
# memory-bandwidth bound). All three print the same statistic: the mean of N back-to-back
# calls on the slowest rank (N = clamp(iters x 64 MiB / bytes, iters, 10000)).
#   tools/bench/allreduce.sh [OUT_DIR]      (called by `make bench` with bench-out/)
# `auto` tunes itself online (ddl-bench runs its trial calls before timing it), as a user's
# first job does; ALLREDUCE_CALIBRATE=1 calibrates a cost model before every run and gives it
# to ddl-bench instead (then the model decides).
# Env: ALLREDUCE_NPS ("2 3 4"), ALLREDUCE_MIN_BYTES (4KiB), ALLREDUCE_MAX_BYTES (64MiB),
#      ALLREDUCE_ITERS (5), ALLREDUCE_ALGOS (every ddl algorithm), BENCH_RUNS (alternating runs
#      of C loop / ddl-bench / gloo; medians are reported; default 3), ALLREDUCE_GLOO (1; 0
#      leaves gloo out), ALLREDUCE_C (1; 0 leaves the C loop out), ALLREDUCE_REVERSE (0; 1
#      times the algorithms in reverse order in every other run, so that `auto` and the
#      others take turns going first), ALLREDUCE_STEP_FACTOR (ddl-bench's), ALLREDUCE_CALIBRATE
#      (0), PYTHON,
#      ALLREDUCE_LOCK=FILE (run each measurement under `flock FILE`, on a shared machine),
#      ALLREDUCE_PEER=FILE (the C loop built elsewhere, for a machine without mpicc).
# Raw JSON lines land in OUT_DIR/allreduce-*.jsonl; the tables of BENCHMARKS.md are printed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out}
nps=${ALLREDUCE_NPS:-2 3 4}
min=${ALLREDUCE_MIN_BYTES:-4KiB}
max=${ALLREDUCE_MAX_BYTES:-64MiB}
iters=${ALLREDUCE_ITERS:-5}
# auto last, right after shm (its usual pick): ddl-bench times the algorithms in this order,
# size by size.
algos=${ALLREDUCE_ALGOS:-ring,rhd,multicolor,multiring,mpi,shm,auto}
runs=${BENCH_RUNS:-3}
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
bench=target/release/ddl-bench
peer=${ALLREDUCE_PEER:-target/peers/mpi_allreduce}
lock=(); [ -n "${ALLREDUCE_LOCK:-}" ] && lock=(flock "$ALLREDUCE_LOCK")
cores=$(nproc)
# Open MPI binds each rank to a core unless the ranks outnumber the cores; --oversubscribe
# (which also unbinds and makes its waits yield) only then, for the peer and ddl alike.
mpirun_for() { if [ "$1" -gt "$cores" ]; then echo "mpirun --allow-run-as-root --oversubscribe"; else echo "mpirun --allow-run-as-root"; fi; }
mkdir -p "$out" "$(dirname "$peer")"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
[ -x "$bench" ] || cargo build --release -p ddl-tools --bin ddl-bench
[ -n "${ALLREDUCE_PEER:-}" ] || [ "${ALLREDUCE_C:-1}" = 0 ] || mpicc -O2 -Wall -o "$peer" tools/bench/mpi_allreduce.c
bytes_of() {
  "$python" -c "
s='$1'.lower().replace('ib','').rstrip('b'); m={'k':1<<10,'m':1<<20,'g':1<<30}
print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))"
}
min_bytes=$(bytes_of "$min")
max_bytes=$(bytes_of "$max")

for f in ddl c gloo; do : > "$out/allreduce-$f.jsonl"; done
step=(); [ -n "${ALLREDUCE_STEP_FACTOR:-}" ] && step=(--step-factor "$ALLREDUCE_STEP_FACTOR")
reversed=$(echo "$algos" | tr ',' '\n' | tac | paste -sd, -)
for run in $(seq "$runs"); do
  order=$algos
  [ "${ALLREDUCE_REVERSE:-0}" = 1 ] && [ $((run % 2)) = 0 ] && order=$reversed
  for np in $nps; do
    # Calibrated afresh every run (auto's choices come from it), so that a calibration
    # spoiled by a burst of load from other tenants spoils one run, not the median.
    echo "allreduce: run $run, np $np: C loop, ddl-bench ($order), gloo; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    model=()
    if [ "${ALLREDUCE_CALIBRATE:-0}" = 1 ]; then
      "${lock[@]}" $(mpirun_for "$np") -np "$np" "$bench" calibrate \
        -o "$out/model-np$np-run$run.json" --max-bytes "$max" >/dev/null
      model=(--model-file "$out/model-np$np-run$run.json")
    fi
    if [ "${ALLREDUCE_C:-1}" != 0 ]; then
      "${lock[@]}" $(mpirun_for "$np") -np "$np" "$peer" --min-bytes "$min_bytes" \
        --max-bytes "$max_bytes" --iters "$iters" | grep '^{' >> "$out/allreduce-c.jsonl"
    fi
    "${lock[@]}" $(mpirun_for "$np") -np "$np" "$bench" allreduce --json --algos "$order" \
      --min-bytes "$min" --max-bytes "$max" --iters "$iters" "${step[@]}" "${model[@]}" \
      | grep '^{' >> "$out/allreduce-ddl.jsonl"
    if [ "${ALLREDUCE_GLOO:-1}" = 0 ]; then
      :
    elif "$python" -c "import torch.distributed" 2>/dev/null; then
      "${lock[@]}" "$python" tools/bench/gloo_allreduce.py --ranks "$np" --min-bytes "$min_bytes" \
        --max-bytes "$max_bytes" --iters "$iters" | grep '^{' >> "$out/allreduce-gloo.jsonl"
    else
      echo "allreduce: $python has no torch; gloo rows skipped" >&2
    fi
  done
done

"$python" tools/bench/allreduce_table.py "$out"/allreduce-{c,ddl,gloo}.jsonl
