#!/usr/bin/env bash
# ddl on a GPU machine that has python3 with torch (CUDA) and nothing else (no MPI, no Rust, no
# package registry): issue 34's part B and issue 43's compiled step, in one command.
# tools/gpu/bundle.sh DIR puts this script at DIR/run.sh beside everything it runs (bin/, py/,
# wheel/, Open MPI and env.sh).
#
#   OUT=results DIR/run.sh                 # on the GPU machine: the default stages
#   DEVICE=cpu OUT=results DIR/run.sh      # anywhere: every stage, tiny, on the CPU
#   STAGES="speed prof" OUT=results DIR/run.sh
#
# On the GPU the default stages are env, compile_all, compiled_speed (the figures the compiled
# step is judged by, first after its compile), compile, compile_check and compiled_python (the
# stages of issue 34 that passed there run when named); on the CPU, all.
# On the GPU they take more than one device call's 10 minutes: run them in two calls, each
# under a DEADLINE a little short of the call's limit (stages that no longer fit are skipped,
# and the run still ends with its summary and the cache's tarballs), the second naming the
# stages the first skipped. A fixed WORK kept on the machine serves the second call if it
# comes while the machine is warm (shards and compiled steps found there); SEED_CACHE serves
# it on a new machine (the steps the first call compiled, compile_all's about 5 minutes):
#   WORK=/tmp/w KEEP_WORK=1 DEADLINE=570 OUT=o1 DIR/run.sh
#   WORK=/tmp/w KEEP_WORK=1 DEADLINE=N SEED_CACHE=o1 STAGES="the skipped ones" OUT=o2 DIR/run.sh
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
#   compile      ddl-train --compile: ResNet-50 (batch 256, bf16, channels-last) compiled into a
#                new cache (the seconds it took); on the GPU, its package alone from Python,
#                plain and replayed from a CUDA graph (tools/gpu/compiled_graphs.py); then 10
#                steps compiled against 10 eager from the same weights and batches, in that
#                configuration (the update's difference, as compile_check measures it)
#   compile_check  resnet18 on the small shards, compiled against eager for fp32 and bf16 (30
#                steps at a small learning rate from the same initial weights, 12 on the CPU:
#                the update of the compiled run against eager's, |w_compiled - w_eager| /
#                |w_eager - w_init|), on the GPU the fp32 run again with --cuda-graphs (its
#                update against the plain compiled run's, and that it captured its graph; on
#                the CPU recorded as skipped), and a compiled run checkpointed (at
#                step K_CHECK_AT) and resumed (bitwise the uninterrupted one)
#   compile_all  every step the compile, compile_check and compiled_speed stages run, compiled
#                at once, and ResNet-50's again with other Inductor options (--inductor-option)
#                and NCHW, each ResNet-50 package timed alone and its top kernels profiled:
#                named first, the stages after it find their steps compiled (on the CPU: the
#                small step and one variant)
#   compiled_speed  ResNet-50 as in speed: ddl-train --compile fed by its own loader from the
#                1000-class shards (images/s, data-wait); then, data on the device, alternating
#                rounds of ddl-train --compile, ddl-train eager, ddl-train --compile
#                --cuda-graphs (GPU only), torch_eager.py eager, under
#                torch.compile (default mode) and under torch.compile reduce-overhead with the
#                optimizer step compiled too (the strongest PyTorch loop that compiles in the
#                budget): medians and run counts
#   compiled_python  tools/bench/python_train.py under torch.compile (ResNet-50, bf16,
#                channels-last): fed by ddl.Loader (uint8) vs torchvision's DataLoader (a worker
#                per core): images/s and data-wait (on the CPU: skipped, torch.compile's CPU
#                compile is minutes)
#   python       examples/pytorch/train.py on the device under the bundled mpirun (one rank);
#                a loop fed by ddl.Loader(device=...) (uint8 and float32) vs torchvision's
#                ImageFolder + DataLoader (a worker per core) on the same images at 224 px
#                (tools/bench/python_train.py): images/s of the loader alone, and images/s and
#                data-wait under ResNet-50 steps (bf16, channels-last)
# OUT gets results.jsonl (one JSON line per check or measurement: stage, check, ok, figures; a
# failure carries the exit status and the tail of its log), summary.md (the table), log.txt
# (every command and its output) and, when the run made its own cache (no COMPILE_CACHE),
# cache-ENTRY.tar.gz for each compiled step of Inductor's default options in it: given to a
# later run on a machine of the same GPU and torch (SEED_CACHE=DIR, a folder of such files),
# they seed its cache, which then compiles nothing they hold (a device call brings back 8
# files: these 3 and at most 5 entries). Scratch (shards, checkpoints) goes to WORK: a new
# folder in /tmp unless given, removed at the end unless KEEP_WORK=1.
# Environment: DEVICE (cuda | cpu), OUT (./gpu-out), PYTHON (python3: its torch is the libtorch
# the binaries load), STAGES, DEADLINE (seconds after the start by which the run ends), WORK,
# KEEP_WORK, SEED_CACHE, COMPILE_CACHE (the compiled steps' cache: WORK/compile-cache unless
# given; make test gives its own), WORKERS (decode threads: the cores less two, left to the
# threads that launch kernels), SPEED_BUDGET and PYTHON_BUDGET (no new round of those stages
# starts later than this many seconds into the stage, less the last round's length; on the GPU
# 120 and 50, the stage timeouts 60 and 45 s above them). The GPU's default stages' timeouts
# add up to 1,320 s, more than one device call may take: split them over two calls (DEADLINE,
# above).
set -uo pipefail
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the bundle
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=$D/bin PY=$D/py
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
case $DEVICE in
  cuda) STAGES=${STAGES:-env compile_all compiled_speed compile compile_check compiled_python} ;;
  *) STAGES=${STAGES:-env compile_all compiled_speed compile compile_check compiled_python
     correctness speed prof python} ;;
esac
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
    K_MODEL=resnet50 K_CLASSES=1000 K_SIZE=224 K_BATCH=256 K_PRECISION=bf16 K_LAYOUT=(--channels-last)
    K_CHECK_MODEL=resnet18 K_CHECK_PRECISIONS=${COMPILED_CHECK_PRECISIONS:-fp32 bf16} K_CHECK_AT=15
    K_PEERS=${COMPILED_PEERS:-eager default reduce-overhead}
    # Not force_layout_optimization=True: Inductor's heuristic (graph.py, decide_layout_opt)
    # already picks layout optimization for ResNet-50's step (no grouped convolutions).
    K_VARIANTS=${COMPILE_VARIANTS:-layout_optimization=False nchw}
    K_DEADLINE=${COMPILED_BUDGET:-150} KY_DEADLINE=${COMPILED_PYTHON_BUDGET:-60}
    T_env=30 T_correctness=135 T_speed=$((S_DEADLINE + 60)) T_prof=35 T_python=$((Y_DEADLINE + 45))
    T_compile=300 T_compile_all=420 T_compile_check=200
    T_compiled_speed=$((K_DEADLINE + 100)) T_compiled_python=$((KY_DEADLINE + 60)) ;;
  cpu)
    DEV1=cpu:1 DEV2=cpu:2 TORCH_DEV=cpu
    C_SIZE=32 C_BATCH=8 C_CLASSES=4 C_PER_CLASS=12 C_VAL=4 C_WORKERS=1 C_RESUME_AT=9
    S_MODEL=resnet18 S_SIZE=32 S_BATCH=16 S_PRECISION=fp32 S_STEPS=8 S_WARMUP=3 S_COMPILE=0
    # The big shards' 4 classes: the compiled fed run's step is then the key below too.
    S_DEADLINE=${SPEED_BUDGET:-0} BIG_CLASSES=4 BIG_PER_CLASS=50 BIG_SHARDS=2
    P_SIZE=64 P_SECONDS=1
    Y_SIZE=64 Y_BATCH=16 Y_FEED=4 Y_STEPS=3 Y_WARMUP=1 Y_MODEL=resnet18
    Y_DTYPES=uint8 Y_DEADLINE=${PYTHON_BUDGET:-0}
    TRAIN_PY=(--device cpu --arch resnet18 --image-size 32 --batch-size 8 --epochs 1
              --warmup-epochs 0.5 --lr 0.2 --workers 1)
    # One key on the CPU (resnet_small, the small shards' 4 classes, 32 px, batch 8, f32, NCHW):
    # compiled once, then found; no PyTorch peer (resnet_small is ddl's own model).
    K_MODEL=resnet_small K_CLASSES=$C_CLASSES K_SIZE=$C_SIZE K_BATCH=$C_BATCH K_PRECISION=fp32
    K_LAYOUT=()
    K_CHECK_MODEL=resnet_small K_CHECK_PRECISIONS=fp32 K_CHECK_AT=9 K_PEERS=""
    K_VARIANTS=${COMPILE_VARIANTS:-layout_optimization=False}
    K_DEADLINE=${COMPILED_BUDGET:-0} KY_DEADLINE=0
    T_env=60 T_correctness=150 T_speed=120 T_prof=60 T_python=120
    T_compile=200 T_compile_all=300 T_compile_check=200 T_compiled_speed=150
    T_compiled_python=60 ;;
  *) echo "run.sh: DEVICE=$DEVICE: give cuda or cpu" >&2; exit 2 ;;
esac
DEADLINE_RESERVE=30  # seconds DEADLINE keeps for a stage's kill, the summary and the cache
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
# last, ends by DEADLINE seconds into the stage, less what the run's DEADLINE cut from the
# stage's timeout (one round at least, five at most).
rounds() {
  local deadline=$(($1 - ${STAGE_CUT:-0})) fn=$2 r=0 last
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

# A ResNet-50 step compiled into a new cache (timed); on the GPU, its package alone.
stage_compile() {
  W=$WORK/compile; mkdir -p "$W"
  local m=$W/first.jsonl start=$SECONDS
  LIMIT=280 step compile-"$K_MODEL" "$BIN/ddl-train" --synthetic-data --model "$K_MODEL" \
    --classes "$K_CLASSES" --image-size "$K_SIZE" --batch "$K_BATCH" --devices "$DEV1" \
    --precision "$K_PRECISION" "${K_LAYOUT[@]}" --compile --compile-cache "$CACHE" \
    --max-steps 5 --metrics "$m" || return
  local entry; entry=$(entry_of "${K_LAYOUT[@]}") || return
  add compile model="$K_MODEL" run_s=$((SECONDS - start)) compile_s="$("$PYTHON" -c \
    'import json, sys; print(json.load(open(sys.argv[1]))["compile_seconds"])' \
    "$entry/step.json")" --metrics "$m" --ok-if finite==true
  # The package alone, plain and replayed from a CUDA graph: whether graphs pay.
  [ "$DEVICE" = cuda ] && step graphs "${PLAIN[@]}" "$PYTHON" "$PY/compiled_graphs.py" "$entry" &&
    add graphs --from "$(logof graphs)" --ok-if loss_agrees==true
  # The compiled step against eager in this configuration, from the same weights and batches
  # (the 1000-class shards on the GPU; on the CPU the small ones, whose step compile_check
  # compiles too).
  local data=$SMALL/shards
  if [ "$DEVICE" = cuda ]; then data_big && data=$BIG/shards; else data_small; fi || return
  local run=(--data "$data" --model "$K_MODEL" --image-size "$K_SIZE" --batch "$K_BATCH"
    --devices "$DEV1" --precision "$K_PRECISION" "${K_LAYOUT[@]}" --workers "$WORKERS"
    --lr 0.01 --warmup-epochs 0 --no-eval --quiet)
  step init "$BIN/ddl-train" "${run[@]}" --max-steps 0 --dump-weights "$W/init.f32" &&
    step eager "$BIN/ddl-train" "${run[@]}" --max-steps 10 --dump-weights "$W/eager.f32" &&
    step compiled "$BIN/ddl-train" "${run[@]}" --max-steps 10 --compile --compile-cache "$CACHE" \
      --dump-weights "$W/compiled.f32" &&
    add update model="$K_MODEL" --weights "$W/eager.f32" "$W/compiled.f32" \
      --update-from "$W/init.f32" --ok-if "update_rel_diff<0.25"
}

# Every step the later stages run, compiled by ddl-train at once (one compile leaves most of a
# machine's cores idle: Inductor's code generation is one Python thread): ResNet-50's with
# Inductor's defaults and as each variant of COMPILE_VARIANTS says (space-separated: nchw, or
# KEY=VALUE[,KEY=VALUE], ddl-train's --inductor-option; default "layout_optimization=False
# nchw", on the CPU the first only), and compile_check's of each precision; then each ResNet-50
# package timed alone and its top kernels profiled
# (tools/gpu/compiled_graphs.py --profile): where the compiled step's time goes, and which
# options pay.
stage_compile_all() {
  local v i=0 p pids=() flags=()
  for v in default $K_VARIANTS; do
    i=$((i + 1)); mapfile -t flags < <(variant_flags "$v")
    compile_one "$K_MODEL-$i" --model "$K_MODEL" --classes "$K_CLASSES" --image-size "$K_SIZE" \
      --batch "$K_BATCH" --precision "$K_PRECISION" "${flags[@]}"
  done
  for p in $K_CHECK_PRECISIONS; do
    compile_one "$K_CHECK_MODEL-$p" --model "$K_CHECK_MODEL" --classes "$C_CLASSES" \
      --image-size "$C_SIZE" --batch "$C_BATCH" --precision "$p"
  done
  for p in "${pids[@]}"; do wait "$p"; done
  i=0
  for v in default $K_VARIANTS; do
    i=$((i + 1)); mapfile -t flags < <(variant_flags "$v")
    local dir
    dir=$(entry_of "${flags[@]}") || continue
    step "time-$i" "${PLAIN[@]}" "$PYTHON" "$PY/compiled_graphs.py" "$dir" --profile 12 &&
      add variant options="$v" --from "$(logof "time-$i")"
  done
}

# variant_flags VARIANT: ddl-train's layout and Inductor flags of a COMPILE_VARIANTS item, one
# per line: default (K_LAYOUT), nchw (K_LAYOUT left out: Inductor lays the convolutions out
# itself) or KEY=VALUE[,KEY=VALUE] (K_LAYOUT and those options).
variant_flags() {
  local o list=()
  case $1 in
    nchw) return ;;
    default) ;;
    *) IFS=, read -ra list <<< "$1" ;;
  esac
  [ ${#K_LAYOUT[@]} -eq 0 ] || printf '%s\n' "${K_LAYOUT[@]}"
  for o in "${list[@]}"; do printf -- '--inductor-option\n%s\n' "$o"; done
}

# compile_one NAME FLAG...: ddl-train compiling one step (and loading it, but running none:
# the compiles share the device) in the background, its pid added to the caller's `pids`.
compile_one() {
  local name=$1; shift
  (LIMIT=$((T_compile_all - 40)) step "compile-$name" "$BIN/ddl-train" --synthetic-data \
    --devices "$DEV1" --compile --compile-cache "$CACHE" --max-steps 0 "$@") &
  pids+=($!)
}

# entry_of [--channels-last] [--inductor-option KEY=VALUE]...: the cache's finished entry of
# the K_ step compiled with that layout and exactly these Inductor options.
entry_of() {
  "$PYTHON" - "$CACHE/$K_MODEL-c$K_CLASSES-b$K_BATCH-${K_SIZE}px" "$@" <<'PY'
import glob, json, sys
prefix, flags = sys.argv[1], sys.argv[2:]
channels_last = "--channels-last" in flags
options = [v for f, v in zip(flags, flags[1:]) if f == "--inductor-option"]
for f in sorted(glob.glob(prefix + "-*/entry.json")):
    key = json.load(open(f))["key"]
    if key["channels_last"] == channels_last and key.get("inductor_options", []) == options:
        print(f[: -len("/entry.json")])
        sys.exit(0)
sys.exit(1)
PY
}

# The compiled step against eager on the small shards, and a compiled run resumed.
stage_compile_check() {
  W=$WORK/compile_check; mkdir -p "$W"
  data_small || return
  CHECK_RUN=(--data "$SMALL/shards" --model "$K_CHECK_MODEL" --image-size "$C_SIZE"
    --batch "$C_BATCH" --epochs 2 --lr 0.02 --warmup-epochs 0 --seed 1 --workers "$C_WORKERS"
    --no-eval --devices "$DEV1" --deterministic)
  step init "$BIN/ddl-train" "${CHECK_RUN[@]}" --max-steps 0 --dump-weights "$W/init.f32" ||
    return
  for p in $K_CHECK_PRECISIONS; do
    local run=("${CHECK_RUN[@]}" --precision "$p" --max-steps 30)
    step "eager-$p" "$BIN/ddl-train" "${run[@]}" --dump-weights "$W/eager-$p.f32" &&
      step "compiled-$p" "$BIN/ddl-train" "${run[@]}" --compile --compile-cache "$CACHE" \
        --checkpoint-dir "$W/ck-$p" --checkpoint-every "$K_CHECK_AT" --keep-checkpoints 10 \
        --metrics "$W/compiled-$p.jsonl" --dump-weights "$W/compiled-$p.f32" &&
      add "compiled-$p" --weights "$W/eager-$p.f32" "$W/compiled-$p.f32" \
        --update-from "$W/init.f32" --metrics "$W/compiled-$p.jsonl" --ok-if finite==true \
        --ok-if "update_rel_diff<$([ "$p" = fp32 ] && echo 0.05 || echo 0.25)"
  done
  local p=${K_CHECK_PRECISIONS%% *} ckpt
  # The same compiled run replayed from a CUDA graph after its first steps: the same kernels,
  # and ddl-train says that it captured the graph (a run that never did would pass the
  # weights' check alone).
  if [ "$DEVICE" = cuda ]; then
    step "graphs-$p" "$BIN/ddl-train" "${CHECK_RUN[@]}" --precision "$p" --max-steps 30 \
      --compile --compile-cache "$CACHE" --cuda-graphs --dump-weights "$W/graphs-$p.f32" &&
      add "graphs-$p" captured="$(grep -qs 'compiled step from a CUDA graph, captured' \
        "$(logof "graphs-$p")" && echo true || echo false)" \
        --weights "$W/compiled-$p.f32" "$W/graphs-$p.f32" --update-from "$W/init.f32" \
        --ok-if "update_rel_diff<0.001" --ok-if captured==true
  else
    add "graphs-$p" skipped="CUDA graphs replay the compiled step on a GPU only"
  fi
  ckpt=$(printf 'ckpt-%012d.ddlck' "$K_CHECK_AT")
  mkdir -p "$W/ck-resume" && cp "$W/ck-$p/$ckpt" "$W/ck-resume/" 2>/dev/null || {
    add resume ok=false error="no compiled $p run or no checkpoint $ckpt to resume from"
    return 1
  }
  step resume "$BIN/ddl-train" "${CHECK_RUN[@]}" --precision "$p" --max-steps 30 --compile \
    --compile-cache "$CACHE" \
    --checkpoint-dir "$W/ck-resume" --checkpoint-every "$K_CHECK_AT" --resume \
    --dump-weights "$W/resume.f32" &&
    add resume precision="$p" --weights "$W/compiled-$p.f32" "$W/resume.f32" \
      --ok-if bitwise==true
}

# One round of the compiled comparison, data on the device: ddl-train --compile, ddl-train
# eager, then PyTorch's loop in each of K_PEERS's modes (eager, or a torch.compile mode).
compiled_round() {
  local r=$1 common=(--synthetic-data --model "$K_MODEL" --classes "$K_CLASSES" --image-size "$K_SIZE"
    --batch "$K_BATCH" --devices "$DEV1" --precision "$K_PRECISION" "${K_LAYOUT[@]}"
    --max-steps "$S_STEPS" --quiet)
  local peer peers=(ddl-train-compile ddl-train)
  [ "$DEVICE" = cuda ] && peers+=(ddl-train-compile-graphs)
  for peer in "${peers[@]}"; do
    local flags=() m=$W/$peer-$r.jsonl
    case $peer in
      ddl-train-compile) flags=(--compile --compile-cache "$CACHE") ;;
      ddl-train-compile-graphs) flags=(--compile --compile-cache "$CACHE" --cuda-graphs) ;;
    esac
    step "$peer-$r" "$BIN/ddl-train" "${common[@]}" "${flags[@]}" --metrics "$m" &&
      add synthetic peer="$peer" round="$r" --metrics "$m" --warmup "$S_WARMUP" \
        --ok-if finite==true
  done
  local mode
  for mode in $K_PEERS; do
    local flags=() limit=$LIMIT
    case $mode in
      eager) ;;
      default) flags=(--compile) limit=160 ;;
      *) flags=(--compile --compile-mode "$mode" --compile-optimizer) limit=200 ;;
    esac
    LIMIT=$limit step "torch-$mode-$r" "${PLAIN[@]}" "$PYTHON" "$PY/torch_eager.py" \
      --model "$K_MODEL" --classes "$K_CLASSES" --image-size "$K_SIZE" --batch "$K_BATCH" \
      --device "$TORCH_DEV" --precision "$K_PRECISION" "${K_LAYOUT[@]}" \
      --steps $((S_STEPS - S_WARMUP)) --warmup "$S_WARMUP" "${flags[@]}" &&
      add synthetic round="$r" --from "$(logof "torch-$mode-$r")"
  done
}

# ddl-train --compile fed by its own loader: images/s and the data-wait share of the step.
compiled_fed() {
  local m=$W/fed.jsonl
  # The compile's time too, should compile_all not have left the step compiled.
  LIMIT=280 step fed "$BIN/ddl-train" --data "$BIG/shards" --model "$K_MODEL" --image-size "$K_SIZE" \
    --batch "$K_BATCH" --devices "$DEV1" --precision "$K_PRECISION" "${K_LAYOUT[@]}" \
    --compile --compile-cache "$CACHE" --workers "$WORKERS" --max-steps "$S_STEPS" --no-eval \
    --quiet --metrics "$m" &&
    add fed workers="$WORKERS" --metrics "$m" --warmup "$S_WARMUP" \
      --images-per-step "$K_BATCH" --ok-if finite==true --ok-if epochs_seen==1 \
      --target 'data_wait_frac<0.01'
}

stage_compiled_speed() {
  W=$WORK/compiled_speed; mkdir -p "$W"
  data_big && compiled_fed
  rounds "$K_DEADLINE" compiled_round
}

finish_compiled_speed() {
  report medians "$RESULTS" compiled_speed synthetic --by peer --value images_per_s \
    --base ddl-train-compile --target 'ddl_train_compile_per_ddl_train>=1.35' \
    --target 'ddl_train_compile_per_pytorch_compile_reduce_overhead_opt>=1.0' >> "$LOG"
}

# The Python loop under torch.compile fed by ddl.Loader or torchvision's DataLoader.
compiled_python_round() {
  local r=$1 common=(--comm none --device "$TORCH_DEV" --arch "$Y_MODEL" --classes "$BIG_CLASSES"
    --batch "$Y_BATCH" --size "$Y_SIZE" --steps "$Y_STEPS" --warmup "$Y_WARMUP" --compile --amp)
  LIMIT=150 step "ddl-$r" "$PYTHON" "$PY/python_train.py" --loader ddl --data "$BIG/shards" \
    --dtype uint8 --workers "$WORKERS" "${common[@]}" &&
    add feed variant=ddl-uint8 round="$r" --from "$(logof "ddl-$r")" --ok-if 'loss<100'
  LIMIT=150 step "torchvision-$r" "${PLAIN[@]}" "$PYTHON" "$PY/python_train.py" \
    --loader torchvision --data "$BIG/images" --workers "$cores" "${common[@]}" &&
    add feed variant=torchvision round="$r" --from "$(logof "torchvision-$r")" --ok-if 'loss<100'
}

stage_compiled_python() {
  if [ "$DEVICE" != cuda ]; then
    add compiled skipped="torch.compile of the Python loop is measured on the GPU only"
    return
  fi
  data_big && rounds "$KY_DEADLINE" compiled_python_round
}

finish_compiled_python() {
  [ "$DEVICE" = cuda ] || return 0
  report medians "$RESULTS" compiled_python feed --by variant --value images_per_s \
    --base ddl-uint8 >> "$LOG"
  report medians "$RESULTS" compiled_python feed --by variant --value data_wait_frac \
    --base ddl-uint8 >> "$LOG"
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
# Under DEADLINE, a stage's timeout is cut to the time left, and a stage that would get less
# than a minute is skipped, so that the run ends with its summary and cache saved.
run_stage() {
  local s=$1 full limit start=$SECONDS rc left
  full=T_$s full=${!full} limit=$full
  if [ -n "${DEADLINE:-}" ]; then
    left=$((DEADLINE - SECONDS - DEADLINE_RESERVE))
    if [ "$left" -lt 60 ]; then
      echo "##### stage $s skipped: ${left} s left before DEADLINE" >> "$LOG"
      STAGE=$s add stage ok=false skipped=deadline
      return
    fi
    [ "$left" -ge "$limit" ] || limit=$left
  fi
  echo "##### stage $s (timeout $limit s)" >> "$LOG"
  STAGE_CUT=$((full - limit)) timeout -k 10 "$limit" "$0" --stage "$s"
  rc=$?
  local pairs=(seconds=$((SECONDS - start)) timeout="$limit")
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
  # Every stage has its timeout on this device, named in STAGES or not: a stage without one
  # would end the whole run (set -u) when it starts, on a lease that cannot be repeated.
  local f t
  for f in $(declare -F | awk '$3 ~ /^stage_/ { print substr($3, 7) }'); do
    t=T_$f
    [ -n "${!t:-}" ] || { echo "run.sh: stage $f has no timeout (T_$f) for DEVICE=$DEVICE" >&2; exit 2; }
  done
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
  SMALL=$WORK/small BIG=$WORK/big CACHE=${COMPILE_CACHE:-$WORK/compile-cache}
  ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
  local torch_lib
  torch_lib=$("$PYTHON" -c 'import importlib.util as u, os
print(os.path.join(os.path.dirname(u.find_spec("torch").origin), "lib"))') ||
    { echo "run.sh: $PYTHON has no torch" >&2; exit 2; }
  # shellcheck source=/dev/null
  . "$D/env.sh"
  # The machine's own libtorch first, then the bundle's Open MPI and libraries.
  export LD_LIBRARY_PATH=$torch_lib:$LD_LIBRARY_PATH
  # ddl-train --compile compiles with this Python, whose torch the binaries load.
  export DDL_PYTHON=$PYTHON
  export OUT RESULTS LOG WORK SMALL BIG CACHE ORIG_LD_LIBRARY_PATH PYTHON DEVICE WORKERS
  STAGE=run add start device="$DEVICE" python="$PYTHON" stages="$STAGES" workers="$WORKERS" \
    --from "$D/bundle.json"
  STAGE=run step wheel "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade \
    --target "$WORK/site" "$D"/wheel/ddl-*.whl
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
  seed_cache
  for s in $STAGES; do
    declare -F "stage_$s" > /dev/null || { echo "run.sh: no stage $s" >&2; continue; }
    run_stage "$s"
  done
  report summary "$RESULTS" "$OUT/summary.md"
  [ -n "${COMPILE_CACHE:-}" ] || save_cache
  cat "$OUT/summary.md"
}

# The cache's finished entries of Inductor's default options, each a tarball in OUT.
save_cache() {
  local f dir
  for f in "$CACHE"/*/entry.json; do
    [ -f "$f" ] && grep -q '"inductor_options": \[\]' "$f" || continue
    dir=$(dirname "$f")
    tar -czf "$OUT/cache-$(basename "$dir").tar.gz" -C "$CACHE" "$(basename "$dir")"
  done
}

# The entries an earlier run saved (SEED_CACHE/cache-*.tar.gz), unpacked into the cache;
# ddl-train checks each (key, torch, checksums) before it loads one.
seed_cache() {
  local f
  [ -n "${SEED_CACHE:-}" ] || return 0
  mkdir -p "$CACHE"
  for f in "$SEED_CACHE"/cache-*.tar.gz; do
    [ -f "$f" ] || continue
    tar -xzf "$f" -C "$CACHE" && STAGE=run add seeded entry="$(basename "$f")"
  done
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
