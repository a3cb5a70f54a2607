#!/usr/bin/env bash
# ResNet-50 training images/s on one GPU (issue 6): ddl-train fed by its loader from generated
# shards vs a plain PyTorch eager loop (trainer/bench/torch_eager.py) with the same batch,
# precision and memory format, alternating RUNS times; medians. Needs a CUDA GPU and a torch
# with CUDA for python3; ddl-train finds that torch's libtorch through LD_LIBRARY_PATH.
#
#   trainer/bench/gpu_resnet50.sh SHARDS [OUT]
#
# Environment: BATCH (256), PRECISION (bf16), CHANNELS_LAST (1), STEPS (120, the first WARMUP
# (20) untimed), RUNS (3), WORKERS (decode threads, default: all cores), DDL_TRAIN
# (target/release/ddl-train), PYTHON (python3); for a CPU smoke run of the script itself:
# DEVICE=cpu MODEL=resnet18 IMAGE_SIZE=64 PRECISION=fp32.
set -euo pipefail
cd "$(dirname "$0")/../.."
shards=${1:?shard directory (ddl-synth + ddl-pack output)}
out=${2:-bench-out/gpu-resnet50}
mkdir -p "$out"
model=${MODEL:-resnet50} size=${IMAGE_SIZE:-224} device=${DEVICE:-cuda}
ddl_devices=cuda:0
[ "$device" = cpu ] && ddl_devices=cpu:1
batch=${BATCH:-256} precision=${PRECISION:-bf16} steps=${STEPS:-120} warmup=${WARMUP:-20}
python=${PYTHON:-python3}
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cl_torch=() cl_ddl=()
if [ "${CHANNELS_LAST:-1}" = 1 ]; then cl_torch=(--channels-last); cl_ddl=(--channels-last); fi
for run in $(seq "${RUNS:-3}"); do
  "$python" trainer/bench/torch_eager.py --model "$model" --image-size "$size" --device "$device" --batch "$batch" \
    --precision "$precision" "${cl_torch[@]}" --steps $((steps - warmup)) --warmup "$warmup" \
    | tee "$out/torch-$run.json"
  "${DDL_TRAIN:-target/release/ddl-train}" --data "$shards" --model "$model" --image-size "$size" --devices "$ddl_devices" \
    --batch "$batch" --precision "$precision" "${cl_ddl[@]}" --workers "${WORKERS:-$(nproc)}" \
    --max-steps "$steps" --epochs 1000 --no-eval --quiet --metrics "$out/ddl-$run.jsonl"
done
"$python" - "$out" "$warmup" <<'PY'
import glob, json, os, statistics, sys
out, warmup = sys.argv[1], int(sys.argv[2])
torch_runs = [json.load(open(p))["images_per_s"] for p in sorted(glob.glob(os.path.join(out, "torch-*.json")))]
ddl_runs = []
for p in sorted(glob.glob(os.path.join(out, "ddl-*.jsonl"))):
    steps = [json.loads(l) for l in open(p)]
    steps = [s for s in steps if s.get("type") == "step"][warmup:]
    ddl_runs.append(statistics.median(s["images_per_s"] for s in steps))
t, d = statistics.median(torch_runs), statistics.median(ddl_runs)
print(f"pytorch eager: {t:.0f} img/s (runs {[round(x) for x in torch_runs]})")
print(f"ddl-train:     {d:.0f} img/s (runs {[round(x) for x in ddl_runs]})")
print(f"ddl / eager:   {d / t:.3f}x (target >= 0.95x)")
PY
