#!/usr/bin/env bash
# `make demo`: the main job end to end on a small built-in dataset, on CPU:
# ddl-synth a 10-class ImageNet-style tree -> ddl-pack it -> mpirun -np 2 ddl-train.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release
out=${DEMO_OUT:-demo-out}
np=${DEMO_NP:-2}
epochs=${DEMO_EPOCHS:-4}
mpirun_flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && mpirun_flags+=(--allow-run-as-root)

rm -rf "$out"
echo "== ddl-synth: 10 classes x 160 train + 30 val JPEGs"
"$bin/ddl-synth" "$out/imagenet" --classes 10 --per-class 160 --val-per-class 30 --seed 1
echo "== ddl-pack"
"$bin/ddl-pack" "$out/imagenet" -o "$out/shards" --shards 4 --max-short-side 96
echo "== ddl-prof (data throughput of this node)"
"$bin/ddl-prof" "$out/shards" --threads 1,2 --batch 32 --image-size 64 --seconds 2 || true
echo "== mpirun -np $np ddl-train (resnet_small on CPU)"
mpirun "${mpirun_flags[@]}" -np "$np" "$bin/ddl-train" --data "$out/shards" --model resnet_small \
  --image-size 64 --batch 32 --devices cpu:1 --epochs "$epochs" --warmup-epochs 1 --base-lr 0.4 \
  --workers 1 --metrics "$out/metrics.jsonl" --checkpoint-dir "$out/checkpoints"
echo "== done: per-step and per-epoch metrics in $out/metrics.jsonl"
