#!/usr/bin/env bash
# ddl-train --head-parallel against data-parallel on this machine's CPU, resnet18 at 64 px, 16
# images per replica, one epoch of a 10-class ddl-synth set (1,000 train, 100 val images), as
# tests/tests/head_parallel.rs runs it, for seeds 0-2 and peak lr 0.0005 and 0.002, on
# mpirun -np 2 x cpu:2 (15 steps) and -np 3 x cpu:1 (20 steps): each step's loss and the final
# weights against the data-parallel run, beside the data-parallel run with --channels-last
# (other convolution kernels, the same maths: how far a change of rounding alone goes).
# Then a model trained with --head-parallel on 2 ranks, exported, scored by torchvision on the
# val split against ddl-train's own evaluation.
#
#   tools/bench/head_parallel_cpu.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/head-parallel-cpu}
mkdir -p "$out"
bin=$PWD/target/release
py=${PYTHON:-$PWD/.venv/bin/python}
if [ ! -d "$out/shards" ]; then
  "$bin/ddl-synth" "$out/imagenet" --classes 10 --per-class 100 --val-per-class 10 --seed 5
  "$bin/ddl-pack" "$out/imagenet" -o "$out/shards" --shards 2 --max-short-side 80
fi
train() { # NP DEVICES NAME FLAGS...
  local np=$1 devices=$2 name=$3; shift 3
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" -x OMP_NUM_THREADS=1 \
    "$bin/ddl-train" --data "$out/shards" --workers 1 --model resnet18 --image-size 64 \
    --batch 16 --devices "$devices" --epochs 1 --warmup-epochs 0 --quiet \
    --dump-weights "$out/$name.f32" --metrics "$out/$name.jsonl" "$@"
}
for lr in 0.0005 0.002; do
  for seed in 0 1 2; do
    for layout in "2 cpu:2" "3 cpu:1"; do
      set -- $layout
      run="np$1-lr$lr-seed$seed"
      train "$1" "$2" "dp-$run" --lr "$lr" --seed "$seed"
      train "$1" "$2" "hp-$run" --lr "$lr" --seed "$seed" --head-parallel
      train "$1" "$2" "cl-$run" --lr "$lr" --seed "$seed" --channels-last
      echo "$run head-parallel:  $("$py" tools/bench/compare_runs.py "$out/hp-$run.f32" "$out/dp-$run.f32" "$out/hp-$run.jsonl" "$out/dp-$run.jsonl")"
      echo "$run channels-last: $("$py" tools/bench/compare_runs.py "$out/cl-$run.f32" "$out/dp-$run.f32" "$out/cl-$run.jsonl" "$out/dp-$run.jsonl")"
    done
  done
done
# An exported head-parallel model in torchvision (eval transform: ddl.Loader's val split).
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 \
  "$bin/ddl-train" --data "$out/shards" --workers 1 --model resnet18 --image-size 64 \
  --batch 16 --devices cpu:1 --epochs 3 --warmup-epochs 1 --head-parallel --quiet \
  --export "$out/hp.safetensors"
"$py" - "$out" <<'PY'
import sys
import torch, torchvision
from safetensors import safe_open
from safetensors.torch import load_file
import ddl
out = sys.argv[1]
with safe_open(f"{out}/hp.safetensors", "pt") as f:
    meta = f.metadata()
model = torchvision.models.resnet18(num_classes=10)
model.load_state_dict(load_file(f"{out}/hp.safetensors"), strict=True)
model.eval()
hits = n = 0
with torch.no_grad():
    for x, y in ddl.Loader(f"{out}/shards", split="val", batch_size=20, image_size=64,
                           workers=1, resize=int(meta["eval_resize"])):
        hits += int((model(x).argmax(1) == y).sum())
        n += len(y)
print(f"exported head-parallel model: torchvision top-1 {hits / n:.4f} on {n} val images, "
      f"ddl-train's evaluation {float(meta['val_top1']):.4f} (strict load: ok)")
PY
