#!/usr/bin/env bash
# What --exchange costs an epoch on the emulated cluster (tools/bench/netns-cluster.sh): 2 nodes
# x 4 ranks (one CPU replica each), 1 Gbit/s node links. RUNS rounds alternate Q = 0 and Q; the
# figure is the median epoch time of the epochs after the first (the exchange into epoch e runs
# during epoch e-1), and its ratio; beside it the records and bytes the nodes received and the
# longest wait at an epoch start, against ddl-plan's prediction for the same shards.
#
#   tools/bench/exchange_cost.sh [OUT]   env: RUNS (3), EPOCHS (4), Q (0.25), RATE (1gbit)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/exchange_cost.jsonl}
runs=${RUNS:-3}
epochs=${EPOCHS:-4}
q=${Q:-0.25}
rate=${RATE:-1gbit}
data=bench-out/exchange-cost-data
if [ ! -f "$data/shards/manifest.json" ]; then
  rm -rf "$data" && mkdir -p "$data"
  target/release/ddl-synth "$data/imagenet" --classes 16 --per-class 200 --val-per-class 1 --seed 7
  target/release/ddl-pack "$data/imagenet" -o "$data/shards" --shards 8 --max-short-side 256
fi
tools/bench/netns-cluster.sh setup 2 "$rate"
work=$(mktemp -d)
trap 'tools/bench/netns-cluster.sh teardown quiet; rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
: > "$out"
for run in $(seq "$runs"); do
  for fraction in 0 "$q"; do
    metrics="$work/metrics-$run-$fraction.jsonl"
    tools/bench/netns-cluster.sh mpirun 8 -x OMP_NUM_THREADS=1 \
      "$PWD/target/release/ddl-train" --data "$PWD/$data/shards" --model resnet_small \
      --workers 1 --image-size 32 --batch 16 --devices cpu:1 --epochs "$epochs" --no-eval \
      --exchange "$fraction" --metrics "$metrics" --quiet
    .venv/bin/python - "$metrics" "$fraction" "$run" >> "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"type":"epoch"' in l]
for r in rows:
    x = r.get("exchange") or {}
    print(json.dumps({"q": float(sys.argv[2]), "run": int(sys.argv[3]), "epoch": r["epoch"],
                      "epoch_s": r["epoch_s"], "records": x.get("records", 0),
                      "bytes": x.get("bytes", 0), "transfer_s": x.get("transfer_s", 0.0),
                      "wait_s": x.get("wait_s", 0.0)}))
PY
  done
done
plan=$(target/release/ddl-plan --exchange "$q" --nodes 2 --data "$data/shards" \
  --epochs "$epochs" --link-gbps 1)
echo "$plan" | grep -A100 '^# exchange'
.venv/bin/python - "$out" "$q" "$plan" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
q = float(sys.argv[2])
planned = {int(m.group(1)): int(m.group(2))
           for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s", sys.argv[3], re.M)}
med = {}
for fraction in (0.0, q):
    times = [r["epoch_s"] for r in rows if r["q"] == fraction and r["epoch"] > 0]
    med[fraction] = statistics.median(times)
    print(f"Q {fraction}: epoch {med[fraction]:.2f} s (median of {len(times)} epochs after the first)")
print(f"epoch time Q {q} / Q 0: {med[q] / med[0.0]:.3f}")
for e in sorted({r["epoch"] for r in rows if r["epoch"] > 0}):
    got = [r for r in rows if r["q"] == q and r["epoch"] == e]
    recs = {r["records"] for r in got}
    print(f"into epoch {e}: {sorted(recs)} records measured, {planned.get(e)} planned; "
          f"{statistics.median(r['bytes'] for r in got) / 1e6:.2f} MB, transfer "
          f"{statistics.median(r['transfer_s'] for r in got):.3f} s, wait "
          f"{max(r['wait_s'] for r in got):.3f} s")
PY
