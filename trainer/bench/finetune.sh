#!/usr/bin/env bash
# Fine-tuning from an exported model against training from scratch (BENCHMARKS.md, "Models in
# and out"). Pretrains resnet_small on set A (the demo's data and configuration: 10 ddl-synth
# classes, 4 epochs, mpirun -np 2) and exports it; then, on set B (6 classes, so other hues per
# class, other images, little data), trains EPOCHS epochs from scratch and from A's model with
# --init-from --reset-head, with the same flags, for each seed; prints val top-1 per epoch.
#
#   trainer/bench/finetune.sh [OUT]
#
# Environment: SEEDS ("1 2 3"), EPOCHS (3), B_PER_CLASS (50: train images per class of set B),
# LR_FLAGS (the learning rate of the set-B runs, "--base-lr 0.4": peak 0.05 at the global batch
# of 32), BIN (target/release).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/finetune}
bin=${BIN:-$PWD/target/release}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe --bind-to none -np 2)
data() { # name classes per-class val-per-class seed
  [ -f "$out/$1-shards/manifest.json" ] && return
  rm -rf "$out/$1" "$out/$1-shards"
  "$bin/ddl-synth" "$out/$1" --classes "$2" --per-class "$3" --val-per-class "$4" --seed "$5"
  "$bin/ddl-pack" "$out/$1" -o "$out/$1-shards" --shards 4 --max-short-side 96
}
pc=${B_PER_CLASS:-50}
data a 10 160 30 1
data "b$pc" 6 "$pc" 30 2
runs=$out/b$pc-runs${LR_FLAGS:+-$(echo "$LR_FLAGS" | tr -d ' -')}
mkdir -p "$runs"
common=(--model resnet_small --image-size 64 --devices cpu:1 --workers 1)
[ -f "$out/a.safetensors" ] || "${mpirun[@]}" "$bin/ddl-train" --data "$out/a-shards" "${common[@]}" \
  --batch 32 --epochs 4 --warmup-epochs 1 --base-lr 0.4 --export "$out/a.safetensors"
for seed in ${SEEDS:-1 2 3}; do
  for start in scratch tuned; do
    init=()
    [ "$start" = tuned ] && init=(--init-from "$out/a.safetensors" --reset-head)
    rm -f "$runs/$start-$seed.jsonl"
    "${mpirun[@]}" "$bin/ddl-train" --data "$out/b$pc-shards" "${common[@]}" --batch 16 \
      --epochs "${EPOCHS:-3}" --warmup-epochs 0 --schedule cosine ${LR_FLAGS:---base-lr 0.4} --seed "$seed" \
      --metrics "$runs/$start-$seed.jsonl" --quiet "${init[@]}"
  done
done
python3 - "$runs" <<'PY'
import glob, json, os, statistics, sys
curves = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-*.jsonl"))):
    start, seed = os.path.basename(path)[:-6].rsplit("-", 1)
    top1 = [e["val_top1"] for e in map(json.loads, open(path)) if e.get("type") == "epoch"]
    curves.setdefault(start, {})[seed] = top1
for start, by_seed in curves.items():
    for seed, top1 in sorted(by_seed.items()):
        print(f"{start:>8} seed {seed}: " + "  ".join(f"{100 * t:5.1f}%" for t in top1))
    epochs = min(len(t) for t in by_seed.values())
    med = [statistics.median(t[e] for t in by_seed.values()) for e in range(epochs)]
    print(f"{start:>8} median: " + "  ".join(f"{100 * t:5.1f}%" for t in med))
PY
