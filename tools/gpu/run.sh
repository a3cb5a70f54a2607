#!/usr/bin/env bash
# Part B of issue 34 in one command: ddl on a GPU machine that has python3 with torch (CUDA) and
# nothing else (no MPI, no Rust, no package registry). tools/gpu/bundle.sh DIR puts this script
# at DIR/run.sh beside everything it runs (bin/, py/, wheel/, Open MPI and env.sh).
#
#   OUT=results DIR/run.sh                 # on the GPU machine: every stage, <= 8 min on an H100
#   DEVICE=cpu OUT=results DIR/run.sh      # anywhere: the same stages, tiny, on the CPU (< 2 min)
#   STAGES="speed prof" OUT=results DIR/run.sh
#
# Stages, each under its own timeout; one that fails or times out is recorded and the next runs:
#   env          GPU, driver, Python, torch, CUDA, cuDNN; no bundled program lacks a library;
#                ddl-train trains a few steps on the device (and loaded libtorch_cuda)
#   correctness  resnet18 on small generated shards, two epochs each: fp32, bf16, fp16,
#                channels-last, --overlap off|pipeline|backward (weights compared with off's),
#                two replicas on the device with --check-replicas, a checkpoint mid-run then
#                --resume (weights bitwise equal under --deterministic, else which tensors
#                differ and by how much), val top-1/top-5, and the --export file loaded strictly
#                into torchvision giving ddl-predict's logits within 1e-3
#   speed        ResNet-50, batch 256, bf16, channels-last: ddl-train fed by its own loader
#                from 1000-class shards made here (more images than the timed steps use: no
#                epoch restart), WORKERS decode threads: images/s and the data-wait share of
#                step time; then, data on the device, ddl-train --synthetic-data vs
#                trainer/bench/torch_eager.py eager and under torch.compile, in alternating
#                rounds while the next round fits SPEED_BUDGET seconds into the stage: medians
#                and run counts
#   prof         ddl-prof on those shards at 224 px on all cores: how many such GPUs (at the
#                speed stage's ddl-train rate) the node can feed
#   python       examples/pytorch/train.py on the device under the bundled mpirun (one rank);
#                a loop fed by ddl.Loader(device=...) (uint8 and float32) vs torchvision's
#                ImageFolder + DataLoader (a worker per core) on the same images at 224 px
#                (tools/bench/python_train.py): images/s of the loader alone, and images/s and
#                data-wait under ResNet-50 steps (bf16, channels-last)
# OUT gets results.jsonl (one JSON line per check or measurement: stage, check, ok, figures; a
# failure carries the exit status and the tail of its log), summary.md (the table) and log.txt
# (every command and its output). Scratch (shards, checkpoints) goes to WORK: a new folder in
# /tmp unless given, removed at the end unless KEEP_WORK=1.
# Environment: DEVICE (cuda | cpu), OUT (./gpu-out), PYTHON (python3: its torch is the libtorch
# the binaries load), STAGES, WORK, KEEP_WORK, WORKERS (decode threads: the cores less two, left
# to the threads that launch kernels), SPEED_BUDGET and PYTHON_BUDGET (no new round of those
# stages starts later than this many seconds into the stage, less the last round's length; on
# the GPU 120 and 50, the stage timeouts 60 and 45 s above them; the GPU's stage timeouts add
# up to 475 s, plus a few seconds to install the wheel and write the summary).
set -uo pipefail
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the bundle
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$D/bin PY=$D/py
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
STAGES=${STAGES:-env correctness speed prof python}
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc reads OMP_NUM_THREADS
WORKERS=${WORKERS:-$((cores > 3 ? cores - 2 : 1))}

# Sizes: C_ correctness, S_ speed, P_ prof, Y_ python stage; T_ stage timeouts (seconds).
case $DEVICE in
  cuda)
    DEV1=cuda:0 DEV2=cuda:0,0 TORCH_DEV=cuda
    C_SIZE=64 C_BATCH=32 C_CLASSES=10 C_PER_CLASS=64 C_VAL=8 C_WORKERS=8 C_RESUME_AT=30
    S_MODEL=resnet50 S_SIZE=224 S_BATCH=256 S_PRECISION=bf16 S_STEPS=60 S_WARMUP=20 S_COMPILE=1
    S_DEADLINE=${SPEED_BUDGET:-120} BIG_CLASSES=1000 BIG_PER_CLASS=20 BIG_SHARDS=16
    P_SIZE=224 P_SECONDS=5
    Y_SIZE=224 Y_BATCH=256 Y_FEED=30 Y_STEPS=30 Y_WARMUP=5 Y_MODEL=resnet50
    Y_DTYPES="uint8 float32" Y_DEADLINE=${PYTHON_BUDGET:-50}
    TRAIN_PY=(--device cuda --arch resnet18 --image-size 64 --batch-size 32 --epochs 2
              --warmup-epochs 0.5 --lr 0.2 --workers 8 --amp)
    T_env=30 T_correctness=135 T_speed=$((S_DEADLINE + 60)) T_prof=35 T_python=$((Y_DEADLINE + 45)) ;;
  cpu)
    DEV1=cpu:1 DEV2=cpu:2 TORCH_DEV=cpu
    C_SIZE=32 C_BATCH=8 C_CLASSES=4 C_PER_CLASS=24 C_VAL=4 C_WORKERS=1 C_RESUME_AT=18
    S_MODEL=resnet18 S_SIZE=32 S_BATCH=16 S_PRECISION=fp32 S_STEPS=8 S_WARMUP=3 S_COMPILE=0
    S_DEADLINE=${SPEED_BUDGET:-0} BIG_CLASSES=10 BIG_PER_CLASS=20 BIG_SHARDS=2
    P_SIZE=64 P_SECONDS=1
    Y_SIZE=64 Y_BATCH=16 Y_FEED=4 Y_STEPS=3 Y_WARMUP=1 Y_MODEL=resnet18
    Y_DTYPES=uint8 Y_DEADLINE=${PYTHON_BUDGET:-0}
    TRAIN_PY=(--device cpu --arch resnet18 --image-size 32 --batch-size 8 --epochs 1
              --warmup-epochs 0.5 --lr 0.2 --workers 1)
    T_env=60 T_correctness=150 T_speed=120 T_prof=60 T_python=120 ;;
  *) echo "run.sh: DEVICE=$DEVICE: give cuda or cpu" >&2; exit 2 ;;
esac
LIMIT=120  # seconds one command may take (LIMIT=N step ... for another; the stage's timeout
           # bounds them together)

report() { "$PYTHON" "$PY/report.py" "$@"; }
# add CHECK [KEY=VALUE]... [report.py add options]: records one line of the current stage.
add() { local check=$1; shift; report add "$RESULTS" "$STAGE" "$check" "$@" >> "$LOG"; }
logof() { echo "$WORK/logs/$STAGE-$1.log"; }

# step NAME CMD...: runs CMD (at most LIMIT seconds), its output in `logof NAME` and log.txt; on
# failure records NAME with the exit status and the log's tail, and returns the status.
step() {
  local name=$1; shift
  local log; log=$(logof "$name")
  echo "=== $STAGE/$name: $*" >> "$LOG"
  timeout --foreground -k 5 "$LIMIT" "$@" > "$log" 2>&1
  local rc=$?
  cat "$log" >> "$LOG"
  [ "$rc" -eq 0 ] && return 0
  report fail "$RESULTS" "$STAGE" "$name" "$log" "$rc" >> "$LOG"
  return "$rc"
}

# The small tree and shards of the correctness and python stages (made once per run).
data_small() {
  [ -f "$SMALL/shards/manifest.json" ] && return 0
  step synth-small "$BIN/ddl-synth" "$SMALL/images" --classes "$C_CLASSES" \
    --per-class "$C_PER_CLASS" --val-per-class "$C_VAL" --min-side 64 --max-side 160 &&
    step pack-small "$BIN/ddl-pack" "$SMALL/images" -o "$SMALL/shards" --shards 4 \
      --max-short-side $((2 * C_SIZE))
}

# The large tree and shards of the speed, prof and python stages: 1000 classes on the GPU,
# enough images that no timed step of theirs crosses an epoch.
data_big() {
  [ -f "$BIG/shards/manifest.json" ] && return 0
  step synth-big "$BIN/ddl-synth" "$BIG/images" --classes "$BIG_CLASSES" \
    --per-class "$BIG_PER_CLASS" --val-per-class 1 &&
    step pack-big "$BIN/ddl-pack" "$BIG/images" -o "$BIG/shards" --shards "$BIG_SHARDS"
}

stage_env() {
  local ok=(); [ "$DEVICE" = cuda ] && ok=(--ok-if cuda_available==true)
  step torch "${PLAIN[@]}" "$PYTHON" "$PY/torch_checks.py" env --device "$DEVICE" &&
    add torch --from "$(logof torch)" "${ok[@]}"
  step libraries bash -c 'm=$(ldd "$0"/ddl-* | grep "not found"); [ -z "$m" ] || { echo "$m"; exit 1; }' \
    "$BIN" &&
    add libraries missing=0
  local m=$WORK/env-train.jsonl
  step ddl-train env LD_DEBUG=libs LD_DEBUG_OUTPUT="$WORK/ld" "$BIN/ddl-train" --synthetic-data \
    --model resnet_small --classes 10 --image-size 32 --batch 8 --devices "$DEV1" \
    --max-steps 3 --metrics "$m" || return
  local cuda_loaded=false
  grep -qs 'calling init: .*/libtorch_cuda\.so' "$WORK"/ld.* && cuda_loaded=true
  ok=(); [ "$DEVICE" = cuda ] && ok=(--ok-if libtorch_cuda_loaded==true)
  add ddl-train devices="$DEV1" libtorch_cuda_loaded=$cuda_loaded --metrics "$m" \
    --ok-if steps==3 --ok-if finite==true "${ok[@]}"
}

# train CHECK [FLAG]...: ddl-train on the small shards for two epochs with FLAGs; records its
# losses, learns (the loss fell) and val top-1/top-5; with CMP=FILE set, also its dumped
# weights (pass --dump-weights $W/CHECK.f32) against FILE's.
train() {
  local check=$1; shift
  local m=$W/$check.jsonl cmp=()
  [ -n "${CMP:-}" ] && cmp=(--weights "$CMP" "$W/$check.f32")
  step "$check" "$BIN/ddl-train" "${SMALL_RUN[@]}" --metrics "$m" "$@" &&
    add "$check" "${cmp[@]}" --metrics "$m" --ok-if finite==true --ok-if learns==true
}

stage_correctness() {
  data_small || return
  W=$WORK/correctness; mkdir -p "$W"
  SMALL_RUN=(--data "$SMALL/shards" --model resnet18 --image-size "$C_SIZE" --batch "$C_BATCH"
    --epochs 2 --warmup-epochs 0.5 --seed 1 --workers "$C_WORKERS" --keep-checkpoints 100)
  local exact=(--devices "$DEV1" --precision fp32 --deterministic)
  # fp32 is also the reference of the overlap, channels-last and resume checks, and the export.
  train fp32 "${exact[@]}" --overlap off --checkpoint-dir "$W/ck-full" \
    --checkpoint-every "$C_RESUME_AT" --dump-weights "$W/fp32.f32" --export "$W/model.safetensors"
  train bf16 --devices "$DEV1" --precision bf16
  train fp16 --devices "$DEV1" --precision fp16
  for overlap in pipeline backward; do
    CMP=$W/fp32.f32 train "overlap-$overlap" "${exact[@]}" --overlap "$overlap" \
      --dump-weights "$W/overlap-$overlap.f32"
  done
  CMP=$W/fp32.f32 train channels-last "${exact[@]}" --overlap off --channels-last \
    --dump-weights "$W/channels-last.f32"
  train replicas --devices "$DEV2" --check-replicas
  resume_check "${exact[@]}" --overlap off
  step predict "$BIN/ddl-predict" --model "$W/model.safetensors" --device "$TORCH_DEV" \
    --save-tensors "$W/predicted.safetensors" --json "$SMALL/images/val" &&
    step export "${PLAIN[@]}" "$PYTHON" "$PY/torch_checks.py" export "$W/model.safetensors" \
      "$W/predicted.safetensors" --device "$TORCH_DEV" &&
    add export --from "$(logof export)" --ok-if 'max_abs_diff<0.001'
}

# resume_check FLAG...: the fp32 run's checkpoint at C_RESUME_AT, alone in a new directory,
# resumed to the end with its FLAGs: the weights against the uninterrupted run's.
resume_check() {
  local ckpt; ckpt=$(printf 'ckpt-%012d.ddlck' "$C_RESUME_AT")
  [ -f "$W/fp32.f32" ] && mkdir -p "$W/ck-resume" && cp "$W/ck-full/$ckpt" "$W/ck-resume/" || {
    add resume ok=false error="no fp32 run or no checkpoint $ckpt to resume from"
    return 1
  }
  step resume "$BIN/ddl-train" "${SMALL_RUN[@]}" "$@" --checkpoint-dir "$W/ck-resume" \
    --checkpoint-every "$C_RESUME_AT" --resume --dump-weights "$W/resume.f32" || return
  local from=false
  grep -q "resume: .*global step $C_RESUME_AT)" "$(logof resume)" && from=true
  add resume resumed_at="$C_RESUME_AT" resumed_from_checkpoint=$from \
    --weights "$W/fp32.f32" "$W/resume.f32" --ok-if resumed_from_checkpoint==true \
    --ok-if bitwise==true
}

# One round of the synthetic-data comparison: ddl-train, eager, compiled.
speed_round() {
  local r=$1 m=$W/synthetic-$1.jsonl
  step "ddl-train-$r" "$BIN/ddl-train" --synthetic-data --model "$S_MODEL" --classes 1000 \
    --image-size "$S_SIZE" --batch "$S_BATCH" --devices "$DEV1" --precision "$S_PRECISION" \
    --channels-last --max-steps "$S_STEPS" --metrics "$m" --quiet &&
    add synthetic peer=ddl-train round="$r" --metrics "$m" --warmup "$S_WARMUP" --ok-if finite==true
  local modes=(eager); [ "$S_COMPILE" = 1 ] && modes+=(compile)
  for mode in "${modes[@]}"; do
    local flags=() limit=$LIMIT
    [ "$mode" = compile ] && flags=(--compile) limit=160  # the first round compiles
    LIMIT=$limit step "$mode-$r" "${PLAIN[@]}" "$PYTHON" "$PY/torch_eager.py" \
      --model "$S_MODEL" --classes 1000 --image-size "$S_SIZE" --batch "$S_BATCH" --device "$TORCH_DEV" \
      --precision "$S_PRECISION" --channels-last --steps $((S_STEPS - S_WARMUP)) \
      --warmup "$S_WARMUP" "${flags[@]}" &&
      add synthetic round="$r" --from "$(logof "$mode-$r")"
  done
}

# rounds DEADLINE FUNCTION: runs FUNCTION 1, 2, ... while the next round, if as long as the
# last, ends by DEADLINE seconds into the stage (one round at least, five at most).
rounds() {
  local deadline=$1 fn=$2 r=0 last
  while :; do
    r=$((r + 1)); last=$SECONDS
    "$fn" "$r"
    last=$((SECONDS - last))
    [ "$r" -lt 5 ] && [ $((SECONDS + last)) -le "$deadline" ] || break
  done
}

# ddl-train fed by its own loader: images/s and the data-wait share of the timed steps.
fed_run() {
  local m=$W/fed.jsonl
  step fed "$BIN/ddl-train" --data "$BIG/shards" --model "$S_MODEL" --image-size "$S_SIZE" \
    --batch "$S_BATCH" --devices "$DEV1" --precision "$S_PRECISION" --channels-last \
    --workers "$WORKERS" --max-steps "$S_STEPS" --no-eval --quiet --metrics "$m" &&
    add fed workers="$WORKERS" --metrics "$m" --warmup "$S_WARMUP" \
      --images-per-step "$S_BATCH" --ok-if finite==true --ok-if epochs_seen==1 \
      --target 'data_wait_frac<0.01'
}

# The loader-fed run first (its shards serve the later stages too), then the rounds, the first
# of which compiles: a stage cut short by its timeout loses a round, not the rest.
stage_speed() {
  W=$WORK/speed; mkdir -p "$W"
  [ "$S_COMPILE" = 1 ] || add compile skipped="torch.compile is not measured on the CPU"
  data_big && fed_run
  rounds "$S_DEADLINE" speed_round
}

# After the speed stage, however it ended: the medians of its rounds.
finish_speed() {
  report medians "$RESULTS" speed synthetic --by peer --value images_per_s --base ddl-train \
    --target 'ddl_train_per_pytorch_eager>=1.0' --target 'ddl_train_per_pytorch_compile>=0.9' \
    >> "$LOG"
}

stage_prof() {
  data_big || return
  local rate
  rate=$(report get "$RESULTS" speed synthetic-images_per_s ddl_train_images_per_s)
  step ddl-prof "$BIN/ddl-prof" "$BIG/shards" --threads "$cores" --image-size "$P_SIZE" \
    --batch "$S_BATCH" --seconds "$P_SECONDS" --gpu-rate "${rate:-1200}" \
    --json "$WORK/prof.json" --quiet &&
    add ddl-prof gpu_rate_from="${rate:+speed stage ddl-train median}" \
      --from "$WORK/prof.json" --pick verdict --ok-if 'node_images_per_s>0'
}

# One round of the input comparison (tools/bench/python_train.py, --comm none): ddl.Loader
# (Y_DTYPES) against torchvision's DataLoader, each alone (--feed-batches) then under training.
feed_round() {
  local r=$1 common=(--comm none --device "$TORCH_DEV" --arch "$Y_MODEL" --classes "$BIG_CLASSES"
    --batch "$Y_BATCH" --size "$Y_SIZE" --feed-batches "$Y_FEED" --steps "$Y_STEPS"
    --warmup "$Y_WARMUP")
  [ "$DEVICE" = cuda ] && common+=(--amp)
  for dtype in $Y_DTYPES; do
    step "feed-ddl-$dtype-$r" "$PYTHON" "$PY/python_train.py" --loader ddl --data "$BIG/shards" \
      --dtype "$dtype" --workers "$WORKERS" "${common[@]}" &&
      add feed variant="ddl-$dtype" round="$r" --from "$(logof "feed-ddl-$dtype-$r")" \
        --ok-if feed_finite==true --ok-if 'loss<100'
  done
  step "feed-torchvision-$r" "${PLAIN[@]}" "$PYTHON" "$PY/python_train.py" --loader torchvision \
    --data "$BIG/images" --workers "$cores" "${common[@]}" &&
    add feed variant=torchvision round="$r" --from "$(logof "feed-torchvision-$r")" \
      --ok-if feed_finite==true --ok-if 'loss<100'
}

stage_python() {
  data_small && step train.py "$BIN/mpirun" -np 1 --bind-to none "$PYTHON" "$PY/train.py" \
    --data "$SMALL/shards" "${TRAIN_PY[@]}" &&
    add train.py --from "$(logof train.py)" --ok-if 'train_loss<100' --ok-if 'val_images>0'
  data_big && rounds "$Y_DEADLINE" feed_round
}

# After the python stage, however it ended: the medians of its rounds.
finish_python() {
  report medians "$RESULTS" python feed --by variant --value feed_images_per_s \
    --base ddl-uint8 --target 'ddl_uint8_per_torchvision>=3' >> "$LOG"
  report medians "$RESULTS" python feed --by variant --value images_per_s \
    --base ddl-uint8 >> "$LOG"
  report medians "$RESULTS" python feed --by variant --value data_wait_frac \
    --base ddl-uint8 >> "$LOG"
}

# A stage in a process of its own (under its timeout): records its seconds and ok.
run_stage() {
  local s=$1 limit start=$SECONDS rc
  limit=T_$s
  echo "##### stage $s (timeout ${!limit} s)" >> "$LOG"
  timeout -k 10 "${!limit}" "$0" --stage "$s"
  rc=$?
  local pairs=(seconds=$((SECONDS - start)) timeout="${!limit}")
  # A stage's checks record their own failures; the stage's line says whether it ran to its end.
  [ "$rc" -eq 0 ] || pairs+=(ok=false exit="$rc")
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && pairs+=(error="timed out")
  STAGE=$s add stage "${pairs[@]}"
  if declare -F "finish_$s" > /dev/null; then STAGE=$s "finish_$s"; fi
}

cleanup() {
  [ "${KEEP_WORK:-0}" = 1 ] || [ -z "${made_work:-}" ] || rm -rf "$made_work"
}

main() {
  OUT=${OUT:-$PWD/gpu-out}
  RESULTS=$OUT/results.jsonl LOG=$OUT/log.txt
  if [ -e "$RESULTS" ]; then
    echo "run.sh: $RESULTS exists (an earlier run's?); give a new OUT" >&2
    exit 2
  fi
  mkdir -p "$OUT" && : > "$RESULTS" && : > "$LOG" || exit 2
  if [ -z "${WORK:-}" ]; then WORK=$(mktemp -d /tmp/ddl-gpu.XXXXXX) && made_work=$WORK; fi
  trap cleanup EXIT
  mkdir -p "$WORK/logs"
  SMALL=$WORK/small BIG=$WORK/big
  ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
  local torch_lib
  torch_lib=$("$PYTHON" -c 'import importlib.util as u, os
print(os.path.join(os.path.dirname(u.find_spec("torch").origin), "lib"))') ||
    { echo "run.sh: $PYTHON has no torch" >&2; exit 2; }
  # shellcheck source=/dev/null
  . "$D/env.sh"
  # The machine's own libtorch first, then the bundle's Open MPI and libraries.
  export LD_LIBRARY_PATH=$torch_lib:$LD_LIBRARY_PATH
  export OUT RESULTS LOG WORK SMALL BIG ORIG_LD_LIBRARY_PATH PYTHON DEVICE WORKERS
  STAGE=run add start device="$DEVICE" python="$PYTHON" stages="$STAGES" workers="$WORKERS" \
    --from "$D/bundle.json"
  STAGE=run step wheel "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --target "$WORK/site" "$D"/wheel/ddl-*.whl
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
  for s in $STAGES; do
    declare -F "stage_$s" > /dev/null || { echo "run.sh: no stage $s" >&2; continue; }
    run_stage "$s"
  done
  report summary "$RESULTS" "$OUT/summary.md"
  cat "$OUT/summary.md"
}

if [ "${1:-}" = --stage ]; then
  # Python without the bundle's libraries in front: the peers need only the machine's torch.
  if [ -n "$ORIG_LD_LIBRARY_PATH" ]; then PLAIN=(env "LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH")
  else PLAIN=(env -u LD_LIBRARY_PATH); fi
  STAGE=$2
  "stage_$2"
  exit 0
fi
main
