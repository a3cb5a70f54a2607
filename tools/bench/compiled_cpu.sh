#!/usr/bin/env bash
# The compiled step on the CPU (issue 43): ddl-train --compile against ddl-train eager, on
# ddl-train's synthetic data (one batch held by the replica), one CPU replica, NCHW and
# channels-last, CC_RUNS alternating rounds; and the package inside ddl-train (the median of
# its `compiled_step` trace spans) against the same package alone (tools/gpu/compiled_graphs.py:
# run from Python on tensors of its own, no loader, no buckets, no optimizer): what ddl adds
# around the package. Prints each run's figures and the medians.
#
#   tools/bench/compiled_cpu.sh [OUT_DIR]
#
# env: CC_MODEL (resnet18), CC_SIZE (64), CC_BATCH (16), CC_STEPS (20; the first 5 untimed),
#      CC_RUNS (3), CC_CACHE (OUT_DIR/cache: the compile cache, kept between runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/compiled-cpu}
model=${CC_MODEL:-resnet18} size=${CC_SIZE:-64} batch=${CC_BATCH:-16}
steps=${CC_STEPS:-20} runs=${CC_RUNS:-3}
cache=${CC_CACHE:-$out/cache}
python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
results=$out/results.jsonl
: > "$results"

# ddl-train on synthetic data with FLAGS; appends {variant, layout, images_per_s, and for a
# compiled run package_ms: the median compiled_step span after the first 5 steps}.
train() {
  local variant=$1 layout=$2; shift 2
  local m t; m=$(mktemp "$out/metrics.XXXXXX") t=$(mktemp "$out/trace.XXXXXX")
  target/release/ddl-train --synthetic-data --model "$model" --classes 1000 --image-size "$size" \
    --batch "$batch" --devices cpu:1 --max-steps "$steps" --quiet --metrics "$m" --trace "$t" "$@"
  "$python" - "$m" "$t" "$variant" "$layout" >> "$results" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
steps = [s for s in steps if s.get("type") == "step"][5:]
trace = json.load(open(sys.argv[2]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
spans = [e["dur"] / 1e3 for e in events if e.get("name") == "compiled_step" and e.get("ph") == "X"]
line = {"variant": sys.argv[3], "layout": sys.argv[4],
        "images_per_s": statistics.median(s["images_per_s"] for s in steps)}
if spans[5:]:
    line["package_ms"] = statistics.median(spans[5:])
print(json.dumps(line))
PY
  rm -f "$m" "$t"
}

for layout in nchw nhwc; do
  flags=(); [ "$layout" = nhwc ] && flags=(--channels-last)
  # The first compiled run compiles (once per layout, into the cache).
  train warmup "$layout" "${flags[@]}" --compile --compile-cache "$cache" > /dev/null
  entry=$(ls -d "$cache/$model"-*-"$layout"-cpu-*/ | head -n 1)
  for r in $(seq "$runs"); do
    train eager "$layout" "${flags[@]}"
    train compiled "$layout" "${flags[@]}" --compile --compile-cache "$cache"
    "$python" tools/gpu/compiled_graphs.py "$entry" --steps $((steps - 5)) --warmup 5 |
      "$python" -c "import json, sys; d = json.loads(sys.stdin.readline()); print(json.dumps(
        {'variant': 'package', 'layout': '$layout', 'images_per_s': d['package_images_per_s'],
         'package_ms': d['package_ms']}))" >> "$results"
  done
done
grep -v '"warmup"' "$results" > "$results.tmp" && mv "$results.tmp" "$results"
"$python" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for layout in ("nchw", "nhwc"):
    def med(variant, key):
        return statistics.median(r[key] for r in rows
                                 if r["layout"] == layout and r["variant"] == variant)
    eager, compiled = med("eager", "images_per_s"), med("compiled", "images_per_s")
    inside, alone = med("compiled", "package_ms"), med("package", "package_ms")
    runs = [(r["variant"], round(r["images_per_s"], 1)) for r in rows if r["layout"] == layout]
    print(f"{layout}: ddl-train eager {eager:.1f}, --compile {compiled:.1f} images/s "
          f"(compiled / eager {compiled / eager:.3f}); the package {inside:.1f} ms a step inside "
          f"ddl-train, {alone:.1f} ms alone (alone / inside {alone / inside:.3f}); runs {runs}")
PY
