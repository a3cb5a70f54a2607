#!/usr/bin/env bash
# Accuracy against --exchange where node-local order hurts: shards packed class by class
# (`ddl-pack --order class --shards 4`), so each of 4 emulated nodes (`--residency rank`) holds
# 2 of the 8 classes and, without exchange, every replica's batches hold only those. RUNS
# rounds alternate Q = 0, 0.1, 0.25, 1; the figure is the top-1 after EPOCHS epochs of the
# exported model (rank 0's replica: its weights and BatchNorm statistics) over the whole val
# set (`ddl-predict`: not the job's own evaluation, whose nodes would each judge their own
# classes' val shard with statistics of those classes), the median over the rounds (each
# round its own --seed).
#
#   tools/bench/exchange_accuracy.sh [OUT]    env: RUNS (3), EPOCHS (4), QS ("0 0.1 0.25 1")
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/exchange_accuracy.jsonl}
runs=${RUNS:-3}
epochs=${EPOCHS:-4}
qs=${QS:-"0 0.1 0.25 1"}
data=bench-out/exchange-accuracy-data
if [ ! -f "$data/shards/manifest.json" ]; then
  rm -rf "$data" && mkdir -p "$data"
  target/release/ddl-synth "$data/imagenet" --classes 8 --per-class 120 --val-per-class 20 --seed 5
  target/release/ddl-pack "$data/imagenet" -o "$data/shards" --shards 4 --order class \
    --max-short-side 48
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$(dirname "$out")"
: > "$out"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
for run in $(seq "$runs"); do
  for q in $qs; do
    metrics="$stage/metrics-$run-$q.jsonl"
    model="$stage/model-$run-$q.safetensors"
    mpirun "${root[@]}" --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS=1 \
      target/release/ddl-train --data "$data/shards" --model resnet_small --workers 1 \
      --residency rank --exchange "$q" --image-size 32 --batch 16 --devices cpu:1 \
      --epochs "$epochs" --warmup-epochs 1 --base-lr 0.4 --seed "$run" --stage "$stage" \
      --metrics "$metrics" --no-eval --export "$model" --quiet
    target/release/ddl-predict --model "$model" --json --device cpu --top 1 \
      "$data/imagenet/val" > "$stage/predicted.jsonl"
    .venv/bin/python - "$stage/predicted.jsonl" "$data/imagenet/LOC_val_solution.csv" \
      "$metrics" "$q" "$run" "$epochs" >> "$out" <<'PY'
import csv, json, os, sys
predicted, solution, metrics, q, run, epochs = sys.argv[1:]
truth = {r["ImageId"]: r["PredictionString"].split()[0] for r in csv.DictReader(open(solution))}
rows = [json.loads(l) for l in open(predicted)]
right = sum(truth[os.path.basename(r["image"]).rsplit(".", 1)[0]] == r["top"][0]["class"]
            for r in rows)
last = [json.loads(l) for l in open(metrics) if '"type":"epoch"' in l][-1]
print(json.dumps({"q": float(q), "run": int(run), "epochs": int(epochs), "val_images": len(rows),
                  "top1": right / len(rows), "train_loss": last["train_loss"]}))
PY
  done
done
.venv/bin/python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for q in sorted({r["q"] for r in rows}):
    top1 = [r["top1"] for r in rows if r["q"] == q]
    loss = [r["train_loss"] for r in rows if r["q"] == q]
    print(f"Q {q:<5} val top-1 {100 * statistics.median(top1):5.1f}% "
          f"(median of {len(top1)}: {', '.join(f'{100 * t:.1f}' for t in top1)}), "
          f"last train loss {statistics.median(loss):.3f}")
PY
