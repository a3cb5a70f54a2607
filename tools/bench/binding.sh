#!/usr/bin/env bash
# What Open MPI's default binding (a job of 2 ranks or fewer: one core per rank) costs one rank,
# the case `ddl-train` and `ddl.Loader` warn about (comm/src/binding.rs): `ddl.Loader` alone
# (tools/bench/python_loader.py: 2 workers, 64 px, batch 32) and `ddl-train` (resnet_small,
# 64 px, batch 32, cpu:1, 2 workers, one epoch), each under `mpirun --bind-to core` and
# `--bind-to none`, alternating; medians printed, raw lines in OUT_DIR/binding.txt.
#   tools/bench/binding.sh [OUT_DIR]
# Env: BIND_RUNS (5 alternating runs), BIND_LOADER_SECONDS (10), PYTHON (.venv/bin/python),
#      BENCH_BIN (target/release).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out}
runs=${BIND_RUNS:-5}
seconds=${BIND_LOADER_SECONDS:-10}
py=${PYTHON:-.venv/bin/python}
bin=${BENCH_BIN:-target/release}
data=$out/binding-data
raw=$out/binding.txt
mkdir -p "$out"
[ -f "$data/imagenet/LOC_val_solution.csv" ] ||
  "$bin/ddl-synth" "$data/imagenet" --classes 10 --per-class 160 --val-per-class 30 --seed 42
[ -f "$data/shards/manifest.json" ] ||
  "$bin/ddl-pack" "$data/imagenet" -o "$data/shards" --shards 4 --max-short-side 96 2>/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
: > "$raw"
for run in $(seq "$runs"); do
  for bind in core none; do
    rate=$(mpirun --bind-to "$bind" -np 1 "$py" tools/bench/python_loader.py "$data/shards" \
      --seconds "$seconds" --workers 2 --batch 32 --size 64 |
      "$py" -c 'import json, sys; print(round(json.loads(sys.stdin.read())["images_per_s"]))')
    echo "loader $bind $rate" | tee -a "$raw"
    rm -rf "$data/checkpoints"
    rate=$(mpirun --bind-to "$bind" -np 1 "$bin/ddl-train" --data "$data/shards" \
      --model resnet_small --image-size 64 --batch 32 --devices cpu:1 --workers 2 --epochs 1 \
      --warmup-epochs 0 --checkpoint-dir "$data/checkpoints" 2>&1 |
      sed -n 's/.* \([0-9.]*\) images\/s .*/\1/p')
    echo "ddl-train $bind $rate" | tee -a "$raw"
  done
done
"$py" - "$raw" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    what, bind, rate = line.split()
    rates.setdefault(what, {}).setdefault(bind, []).append(float(rate))
print("| what (one rank) | bound to 1 core | unbound | ratio |\n|---|---|---|---|")
for what, by in rates.items():
    core, none = statistics.median(by["core"]), statistics.median(by["none"])
    print(f"| {what} | {core:.1f} images/s | {none:.1f} images/s | {core / none:.2f}x |")
PY
