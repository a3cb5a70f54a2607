#!/usr/bin/env bash
# examples/pytorch/train.py under torchrun (ddl.dist's TCP backend) against mpirun (its MPI
# backend): the same shards, 2 ranks, the same flags; RUNS alternating rounds of one torchrun
# job and one mpirun job. Each job trains EPOCHS epochs; the figure is the last epoch's step
# time (global batch / the images per second the example prints for it: the epoch's mean step,
# warm), then the median over the rounds per launcher, and the ratio.
#
#   tools/bench/train_launchers.sh [OUT]    env: RUNS (3), EPOCHS (2), NP (2), BATCH (32), FLAGS
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/train_launchers.jsonl}
runs=${RUNS:-3}
epochs=${EPOCHS:-2}
np=${NP:-2}
batch=${BATCH:-32}
flags=${FLAGS:-"--arch resnet18 --image-size 32 --warmup-epochs 0.5 --lr 0.1 --workers 1"}
data=bench-out/train-launchers-data
if [ ! -f "$data/shards/manifest.json" ]; then
  rm -rf "$data" && mkdir -p "$data"
  target/release/ddl-synth "$data/imagenet" --classes 10 --per-class 160 --val-per-class 30
  target/release/ddl-pack "$data/imagenet" -o "$data/shards" --shards 4 --max-short-side 96
fi
mkdir -p "$(dirname "$out")"
: > "$out"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
for run in $(seq "$runs"); do
  for launcher in torchrun mpirun; do
    if [ "$launcher" = torchrun ]; then
      cmd=(.venv/bin/torchrun --nproc_per_node "$np" --master_addr 127.0.0.1
           --master_port $((29800 + run)))
    else
      cmd=(mpirun "${root[@]}" --bind-to none -np "$np" -x OMP_NUM_THREADS=1 .venv/bin/python)
    fi
    # shellcheck disable=SC2086 # FLAGS is a list of words
    OMP_NUM_THREADS=1 "${cmd[@]}" examples/pytorch/train.py --data "$data/shards" \
      --epochs "$epochs" --batch-size "$batch" $flags 2>/dev/null | grep '^{' | tail -1 |
      .venv/bin/python -c "import json,sys; r=json.load(sys.stdin); r['launcher']='$launcher'; r['np']=$np; r['batch']=$batch; print(json.dumps(r))" >> "$out"
  done
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
step = {}
for launcher in ("torchrun", "mpirun"):
    # global images per step / images per second = seconds per step
    ms = [1000 * r["batch"] * r["np"] / r["images_per_s"]
          for r in rows if r["launcher"] == launcher]
    step[launcher] = statistics.median(ms)
    print(f"{launcher}: step {step[launcher]:.1f} ms (median of {len(ms)}: "
          + ", ".join(f"{m:.1f}" for m in ms) + ")")
print(f"torchrun / mpirun: {step['torchrun'] / step['mpirun']:.3f}")
PY
