#!/usr/bin/env bash
# ddl-train --head-parallel against data-parallel on the emulated 2 x 4 cluster
# (tools/bench/netns-cluster.sh, 1 Gbit/s per node link), ResNet-50 at 21,841 classes, 64 px,
# HP_BATCH images per replica, one CPU replica per rank, on ddl-train's synthetic data (one
# batch held by each replica: the model, the table and the collectives alone).
#
#   tools/bench/head_parallel.sh [OUT_DIR]     (root; sets the cluster up and tears it down)
#
# 1. Step time: HP_RUNS runs of each mode, alternating, HP_STEPS steps each, default flags
#    (--allreduce auto, --overlap auto = backward across nodes); the median step of each run
#    after the first HP_SKIP, then the median over the runs and their ratio.
# 2. Bytes: one run of each mode with the ring algorithms (--allreduce ring --gather ring, every
#    byte a message), the bytes rank 0 sent per step as ddl-comm counted them, against
#    `ddl-plan --ranks 8 --batch HP_BATCH`'s prediction.
# env: HP_BATCH (8), HP_STEPS (8), HP_SKIP (2), HP_RUNS (3), HP_RATE (1gbit), NETNS_LOCK.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/head-parallel}
mkdir -p "$out"
batch=${HP_BATCH:-8} steps=${HP_STEPS:-8} skip=${HP_SKIP:-2} runs=${HP_RUNS:-3}
cluster=tools/bench/netns-cluster.sh
train=$PWD/target/release/ddl-train
common=(--synthetic-data --classes 21841 --model resnet50 --image-size 64 --batch "$batch"
        --devices cpu:1 --quiet)
trap '"$cluster" teardown' EXIT
"$cluster" setup 2 "${HP_RATE:-1gbit}"

run() { # NAME FLAGS...
  local name=$1; shift
  echo "head_parallel: $name"
  "$cluster" mpirun 8 "$train" "${common[@]}" --metrics "$out/$name.jsonl" "$@"
}

for r in $(seq "$runs"); do
  run "dp-$r" --max-steps "$steps"
  run "hp-$r" --max-steps "$steps" --head-parallel
done
run dp-ring --allreduce ring --max-steps 3
run hp-ring --allreduce ring --gather ring --head-parallel --max-steps 3
target/release/ddl-plan --model resnet50 --classes 21841 --ranks 8 --batch "$batch" \
  | tee "$out/plan.txt"

python3 - "$out" "$runs" "$skip" "$batch" <<'PY'
import json, statistics, sys
out, runs, skip, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
images = 8 * batch

def steps(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"step"' in l]

def step_s(name):
    return statistics.median(images / s["images_per_s"] for s in steps(name)[skip:])

med = {}
for mode in ("dp", "hp"):
    per_run = [step_s(f"{mode}-{r}") for r in range(1, runs + 1)]
    med[mode] = statistics.median(per_run)
    print(f"{mode}: step {med[mode]:.3f} s (runs: {', '.join(f'{t:.3f}' for t in per_run)})")
print(f"data-parallel / head-parallel step time: {med['dp'] / med['hp']:.2f}x")
plan = [l for l in open(f"{out}/plan.txt") if "sent per rank per step" in l][0].split()
predicted = {"dp": float(plan[-4]) * 1e6, "hp": float(plan[-3]) * 1e6}
for mode in ("dp", "hp"):
    sent = [s["bytes_sent"] for s in steps(f"{mode}-ring")]
    m = statistics.median(sent)
    print(f"{mode} ring: rank 0 sent {m / 1e6:.3f} MB per step (steps: {sent}), ddl-plan "
          f"{predicted[mode] / 1e6:.3f} MB: measured / predicted {m / predicted[mode]:.4f}")
PY
