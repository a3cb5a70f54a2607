#!/usr/bin/env bash
# The Python package `ddl` (issue 13) against the Rust it binds and against the PyTorch peers, on
# the same files and cores, runs alternating; medians printed, raw JSON lines in OUT_DIR.
#   tools/bench/python.sh [OUT_DIR]     (scripts/bench.sh, section "python", passes bench-out/)
# Parts (PY_PARTS, default "loader train train-parts allreduce memory"):
#   loader     ddl.Loader (tools/bench/python_loader.py) vs the Rust pipeline alone
#              (loader_bench, as the "loader" section runs it), torchvision ImageFolder +
#              DataLoader and FFCV's Loader: RandomResizedCrop 224 float32 NCHW, batch 64,
#              2 workers -> OUT/python-loader.jsonl
#   train      resnet18 at 64 px, batch 32 per rank, mpirun -np 2, one intra-op thread per rank
#              (tools/bench/python_train.py): ddl.Loader + ddl.dist vs ImageFolder + DataLoader
#              + DDP over gloo, alternating -> OUT/python-train.jsonl
#   train-parts  the same two loops, and each with a fixed in-memory batch instead of its loader
#              and without gradient averaging -> OUT/python-train-parts.jsonl
#   allreduce  ddl.dist.allreduce_ (tools/bench/python_allreduce.py) vs ddl-bench allreduce,
#              np 2, 4 KiB and 16 MiB, auto and multicolor -> OUT/python-allreduce.jsonl
#   memory     PSS of 1, 2, 4 local ranks each holding a ddl.Loader over the same shards
#              (tools/bench/python_memory.py) -> OUT/python-memory.jsonl
# Env (runs of each part, alternating inside a run; defaults keep each part under ~10 minutes
# here): PY_LOADER_RUNS (4), PY_LOADER_SECONDS (10), PY_TRAIN_RUNS (8), PY_TRAIN_PARTS_RUNS (4),
# PY_TRAIN_STEPS (20), PY_TRAIN_WARMUP (5), PY_TRAIN_CONFIGS / PY_TRAIN_PARTS_CONFIGS (loader:comm
# pairs, see python_train.py), PY_ALLREDUCE_RUNS (7), PY_ALLREDUCE_ITERS (50), PY_MEMORY_RUNS (2),
# PYTHON (.venv/bin/python), BENCH_BIN.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out}
parts=${PY_PARTS:-loader train train-parts allreduce memory}
bin=${BENCH_BIN:-target/release}
py=${PYTHON:-.venv/bin/python}
seconds=${PY_LOADER_SECONDS:-10}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
mkdir -p "$out"
"$py" -c "import ddl, torchvision" 2>/dev/null \
  || { echo "python: $py cannot import ddl and torchvision (make setup installs them)" >&2; exit 1; }
have_ffcv() { [ -x .venv-ffcv/bin/python ] && .venv-ffcv/bin/python -c "import ffcv" 2>/dev/null; }
tv_py=.venv-bench/bin/python
[ -x "$tv_py" ] || tv_py=$py

tree=$out/imagenet
[ -f "$tree/LOC_val_solution.csv" ] || "$bin/ddl-synth" "$tree" --classes 100 --per-class 50 --val-per-class 1 --seed 42
[ -f "$out/shards/manifest.json" ] || "$bin/ddl-pack" "$tree" -o "$out/shards" --shards 8 --max-short-side 256 2>/dev/null
[ -f "$out/shards-80/manifest.json" ] || "$bin/ddl-pack" "$tree" -o "$out/shards-80" --shards 8 --max-short-side 80 2>/dev/null

if [[ " $parts " == *" loader "* ]]; then
  runs=${PY_LOADER_RUNS:-4}
  echo "== python loader: ddl.Loader vs Rust loader_bench vs torchvision vs FFCV (RandomResizedCrop 224, float32 NCHW, batch 64, 2 workers, $runs runs)"
  if have_ffcv && [ ! -f "$out/ffcv.beton" ]; then
    .venv-ffcv/bin/python tools/bench/ffcv_write.py "$tree" "$out/ffcv.beton" --max-res 340 --workers 2 >/dev/null 2>&1
  fi
  [ -x "$bin/examples/loader_bench" ] || cargo build --release -p ddl-loader --example loader_bench
  f=$out/python-loader.jsonl
  : > "$f"
  rust() {
    "$bin/examples/loader_bench" "$out/shards" "$seconds" 2 64 --mode region --size 224 \
      | sed -n 's/^pipeline Region: \([0-9.]*\) images\/s (\([0-9.]*\) ms CPU per image.*/{"peer": "ddl-rust", "images_per_s": \1, "cpu_ms_per_image": \2}/p' \
      | "$py" -c 'import json,sys; [print(json.dumps({**r, "images_per_cpu_s": 1e3 / r["cpu_ms_per_image"]})) for r in map(json.loads, sys.stdin)]' \
      | "$py" tools/bench/python_tag.py run="$1" >> "$f"
  }
  python_loader() {
    "$py" tools/bench/python_loader.py "$out/shards" --seconds "$seconds" --workers 2 --batch 64 --size 224 \
      | "$py" tools/bench/python_tag.py run="$1" >> "$f"
  }
  for r in $(seq "$runs"); do
    # ABBA inside a run: the Rust / Python pairs see the same load on average.
    rust "$r"; python_loader "$r"
    # The peers' second pass (persistent DataLoader workers already started; FFCV compiled),
    # with the CPU time of their whole process tree over that pass.
    "$tv_py" tools/bench/python_cputime.py "$tv_py" tools/bench/torchvision_loader.py "$tree" \
      --workers 2 --batch 64 --passes 2 | "$py" tools/bench/python_tag.py --last run="$r" >> "$f"
    if have_ffcv; then
      .venv-ffcv/bin/python tools/bench/python_cputime.py .venv-ffcv/bin/python tools/bench/ffcv_load.py \
        "$out/ffcv.beton" --workers 2 --batch 64 --passes 2 2>/dev/null \
        | "$py" tools/bench/python_tag.py --filter warmup=false run="$r" >> "$f" \
        || echo "python: an FFCV run failed" >&2
    fi
    python_loader "$r"; rust "$r"
  done
  "$py" - "$f" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["peer"], []).append(r)
med = {p: statistics.median(r["images_per_s"] for r in v) for p, v in by.items()}
for p, v in by.items():
    runs = ", ".join(f"{r['images_per_s']:.0f}" for r in v)
    cpu = [r["images_per_cpu_s"] for r in v if "images_per_cpu_s" in r]
    cpu_s = f"  {statistics.median(cpu):7.1f} images per CPU-second" if cpu else ""
    print(f"{p:>12}: median {med[p]:7.1f} images/s{cpu_s}   runs: {runs}")
py_ = med.get("ddl-python")
if py_:
    # Pairs: the k-th Rust and k-th Python run (ABBA order, so adjacent in time).
    pairs = [a["images_per_s"] / b["images_per_s"] for a, b in zip(by.get("ddl-python", []), by.get("ddl-rust", []))]
    if pairs:
        print(f"ddl-python / ddl-rust: {py_ / med['ddl-rust']:.3f} (ratio of medians), "
              f"median of paired ratios {statistics.median(pairs):.3f} (target >= 0.95)")
    cpu = {p: statistics.median(r["images_per_cpu_s"] for r in v) for p, v in by.items()
           if all("images_per_cpu_s" in r for r in v)}
    print(f"ddl-python / ddl-rust per CPU-second: {cpu['ddl-python'] / cpu['ddl-rust']:.3f}")
    for peer, target in (("torchvision", 4.0), ("ffcv", 1.5)):
        if peer in med:
            c = f", {cpu['ddl-python'] / cpu[peer]:.2f}x per CPU-second" if peer in cpu else ""
            print(f"ddl-python / {peer}: {py_ / med[peer]:.2f}x wall{c} (target >= {target}x)")
PY
fi

# train_loop RUNS FILE CONFIGS...: every run runs each loader:comm config once, in order.
train_loop() {
  local runs=$1 f=$2; shift 2
  local steps=${PY_TRAIN_STEPS:-20} warmup=${PY_TRAIN_WARMUP:-5}
  echo "   resnet18 64 px, batch 32/rank, np 2, $steps steps after $warmup warm-up, $runs runs: $*"
  : > "$f"
  for r in $(seq "$runs"); do
    for c in "$@"; do
      local loader=${c%%:*} comm=${c#*:}
      local data=$out/shards-80; [ "$loader" = torchvision ] && data=$tree
      "${mpirun[@]}" -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=$((29500 + RANDOM % 2000)) \
        "$py" tools/bench/python_train.py --loader "$loader" --comm "$comm" --data "$data" \
        --steps "$steps" --warmup "$warmup" --batch 32 --size 64 --workers 2 2>/dev/null \
        | "$py" tools/bench/python_tag.py --ranks run="$r" >> "$f" \
        || echo "python: train run $r $c failed" >&2
    done
  done
  "$py" - "$f" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["peer"], []).append(r)
med = {}
for p, v in by.items():
    med[p] = statistics.median(r["images_per_s"] for r in v)
    m = lambda k: statistics.median(r[k] for r in v)
    print(f"{p:>18}: median {med[p]:6.1f} images/s  (per step: data {m('data_ms_per_step'):6.1f} ms, "
          f"fwd+bwd {m('fwd_bwd_ms_per_step'):6.1f} ms, opt.step {m('step_ms_per_step'):6.1f} ms)  runs: "
          + ", ".join(f"{r['images_per_s']:.1f}" for r in v))
if "ddl+ddl" in med and "torchvision+gloo" in med:
    pairs = [a["images_per_s"] / b["images_per_s"] for a, b in zip(by["ddl+ddl"], by["torchvision+gloo"])]
    print(f"ddl.Loader + ddl.dist / DataLoader + DDP(gloo): {med['ddl+ddl'] / med['torchvision+gloo']:.2f}x "
          f"(median of the runs' ratios {statistics.median(pairs):.2f}x; target >= 1.2x)")
PY
}

if [[ " $parts " == *" train "* ]]; then
  echo "== python train: ddl.Loader + ddl.dist (DistributedOptimizer) vs ImageFolder + DataLoader + DDP(gloo)"
  train_loop "${PY_TRAIN_RUNS:-8}" "$out/python-train.jsonl" ${PY_TRAIN_CONFIGS:-ddl:ddl torchvision:gloo}
fi

if [[ " $parts " == *" train-parts "* ]]; then
  echo "== python train-parts: the same loops with a fixed in-memory batch (no loader) and without gradient averaging"
  train_loop "${PY_TRAIN_PARTS_RUNS:-4}" "$out/python-train-parts.jsonl" \
    ${PY_TRAIN_PARTS_CONFIGS:-ddl:ddl torchvision:gloo fixed:ddl fixed:gloo ddl:none torchvision:none fixed:none}
fi

if [[ " $parts " == *" allreduce "* ]]; then
  aruns=${PY_ALLREDUCE_RUNS:-7}
  iters=${PY_ALLREDUCE_ITERS:-50}
  echo "== python allreduce: ddl.dist.allreduce_ vs ddl-bench, np 2, 4 KiB and 16 MiB, auto and multicolor, $aruns runs"
  [ -x "$bin/ddl-bench" ] || cargo build --release -p ddl-tools --bin ddl-bench
  f=$out/python-allreduce.jsonl
  : > "$f"
  for r in $(seq "$aruns"); do
    "${mpirun[@]}" -np 2 "$bin/ddl-bench" allreduce --json --algos auto,multicolor --min-bytes 4KiB \
      --max-bytes 16MiB --step-factor 4096 --iters "$iters" \
      | "$py" tools/bench/python_tag.py peer=ddl-bench run="$r" >> "$f"
    for path in public direct; do
      "${mpirun[@]}" -np 2 "$py" tools/bench/python_allreduce.py --algos auto,multicolor \
        --sizes 4096,16777216 --iters "$iters" --path "$path" \
        | "$py" tools/bench/python_tag.py run="$r" >> "$f"
    done
  done
  "$py" - "$f" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
cell = {}
for r in rows:
    cell.setdefault((r["algo"].split(":")[0], r["bytes"], r["peer"]), []).append(r)
for (algo, nbytes) in sorted({k[:2] for k in cell}):
    get = lambda p, k: statistics.median(x[k] for x in cell.get((algo, nbytes, p), [{k: float("nan")}]))
    bench_t, bench_bw = get("ddl-bench", "time_us"), get("ddl-bench", "busbw_gbps")
    for p in ("ddl-bench", "ddl-python-public", "ddl-python-direct"):
        if (algo, nbytes, p) not in cell:
            continue
        t, bw = get(p, "time_us"), get(p, "busbw_gbps")
        runs = ", ".join(f"{x['time_us']:.1f}" for x in cell[(algo, nbytes, p)])
        extra = "" if p == "ddl-bench" else f"  busbw x{bw / bench_bw:.2f}, +{t - bench_t:.1f} us per call"
        print(f"{algo:>10} {nbytes:>9} B {p:>18}: median {t:10.1f} us  busbw {bw:6.3f} GB/s{extra}   runs (us): {runs}")
PY
fi

if [[ " $parts " == *" memory "* ]]; then
  mruns=${PY_MEMORY_RUNS:-2}
  echo "== python memory: PSS of N local ranks each holding a ddl.Loader (populate) over $out/shards, $mruns runs"
  f=$out/python-memory.jsonl
  : > "$f"
  for r in $(seq "$mruns"); do
    for n in 1 2 4; do
      "${mpirun[@]}" -np "$n" "$py" tools/bench/python_memory.py "$out/shards" 2>/dev/null \
        | "$py" tools/bench/python_tag.py run="$r" >> "$f"
    done
  done
  "$py" - "$f" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("MiB, medians of the runs; 'before': after import + dist.init, before the loader opens")
print(f"{'ranks':>5} {'PSS sum':>8} {'before':>8} {'RSS sum':>8} {'anon/rank':>9} {'before':>7} "
      f"{'shard PSS sum':>13} {'shard RSS sum':>13} {'shard PSS/bytes':>15}")
for n in sorted({r["ranks"] for r in rows}):
    v = [r for r in rows if r["ranks"] == n]
    m = lambda k: statistics.median(r[k] for r in v)
    print(f"{n:>5} {m('sum_pss_mib'):>8.1f} {m('sum_pss_before_loader_mib'):>8.1f} "
          f"{m('sum_rss_mib'):>8.1f} {m('sum_pss_anon_mib') / n:>9.1f} "
          f"{m('sum_pss_anon_before_loader_mib') / n:>7.1f} {m('sum_shard_map_pss_mib'):>13.1f} "
          f"{m('sum_shard_map_rss_mib'):>13.1f} {m('shard_pss_over_bytes'):>15.3f}"
          f"   (shard files {v[0]['shard_mib']} MiB)")
PY
fi
