#!/usr/bin/env bash
# --comm-order priority against fifo (issue 31): ddl-train with --overlap backward, CPU
# replicas, on its synthetic data (one batch held by each replica: the model, the table
# and the collectives alone), and the Python optimizer (tools/bench/python_train.py --comm ddl
# --loader fixed, DistributedOptimizer(comm_order=...)).
#
#   tools/bench/comm_order.sh [OUT_DIR]     (root; sets the emulated cluster up, tears it down)
#
# 1. The emulated 2 x 4 cluster (tools/bench/netns-cluster.sh, CO_RATE per node link), 8
#    replicas: 8 ranks of one CPU replica (CO_REPLICAS=1, the default), or ddl's own layout of
#    one rank per node with a table of 4 (CO_REPLICAS=4; 2 x 2 ranks with 2). For each
#    model of CO_MODELS, CO_RUNS runs of each order, alternating, CO_STEPS steps each; per run
#    the mean step after the first CO_SKIP (wall time per step), and the medians of compute_s,
#    allreduce_s and forward_wait_s; then the median over the runs and the ratio.
# 2. The cost model: ddl-bench calibrate on the same cluster and ranks, CO_REPLICAS compute
#    threads per rank, then ddl-bench sim of the same ranks, model, image size and allreduce with the fifo runs' median compute per step and
#    the contention calibrate measured (--cpu-replicas): the predicted fifo / priority ratio
#    beside the measured one.
# 3. The Python optimizer on the same cluster (CO_PY_MODELS), 8 ranks of one model each
#    whatever CO_REPLICAS (a PyTorch process has no table), CO_PY_STEPS timed steps after 2
#    of warm-up, buckets of CO_PY_BUCKET_MB (4) MiB, CO_RUNS runs per order, alternating; the
#    job's step = the slowest rank's seconds per step.
# 4. One node (mpirun -np 2, shared memory): ddl-train, each model, CO_RUNS runs per order.
# env: CO_MODELS ("resnet18 resnet50"), CO_PY_MODELS (resnet18), CO_SIZE (64), CO_BATCH (8),
#      CO_ALLREDUCE (auto: ddl-train's --allreduce; its online tuning runs in the first steps),
#      CO_CLASSES (1000), CO_STEPS (20), CO_PY_STEPS (6), CO_SKIP (8: past auto's tuning), CO_RUNS (5),
#      CO_RATE (1gbit), CO_REPLICAS (1), CO_PARTS ("cluster sim python node"), NETNS_LOCK.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-bench-out/comm-order}
mkdir -p "$out"
models=${CO_MODELS:-resnet18 resnet50} py_models=${CO_PY_MODELS:-resnet18}
size=${CO_SIZE:-64} batch=${CO_BATCH:-8} classes=${CO_CLASSES:-1000}
steps=${CO_STEPS:-20} py_steps=${CO_PY_STEPS:-6} skip=${CO_SKIP:-8} runs=${CO_RUNS:-5}
py_bucket=${CO_PY_BUCKET_MB:-4}
replicas=${CO_REPLICAS:-1}
case $replicas in
  1|2|4) ranks=$(( 8 / replicas )) ;;
  *) echo "comm_order: CO_REPLICAS=$replicas: expected 1, 2 or 4 (8 replicas in all)" >&2; exit 1 ;;
esac
parts=" ${CO_PARTS:-cluster sim python node} "
cluster=tools/bench/netns-cluster.sh
train=$PWD/target/release/ddl-train
bench=$PWD/target/release/ddl-bench
py=$PWD/.venv/bin/python
common=(--synthetic-data --classes "$classes" --image-size "$size" --batch "$batch"
        --overlap backward --allreduce "${CO_ALLREDUCE:-auto}" --quiet
        --max-steps "$steps")
if [ -d /tmp/ddl-netns-cluster ]; then
  echo "comm_order: an emulated cluster is up (/tmp/ddl-netns-cluster): another run owns it" >&2
  exit 1
fi
trap '"$cluster" teardown' EXIT
"$cluster" setup 2 "${CO_RATE:-1gbit}"

train_run() { # WHERE NAME FLAGS...: WHERE = cluster (8 replicas) or node (mpirun -np 2)
  local where=$1 name=$2; shift 2
  echo "comm_order: $name"
  if [ "$where" = cluster ]; then
    "$cluster" mpirun "$ranks" --bind-to none "$train" "${common[@]}" --devices "cpu:$replicas" \
      --metrics "$out/$name.jsonl" "$@"
  else
    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \
      "$train" "${common[@]}" --devices cpu:1 --metrics "$out/$name.jsonl" "$@"
  fi
}

for where in cluster node; do
  [[ $parts == *" $where "* ]] || continue
  for m in $models; do
    for r in $(seq "$runs"); do
      for order in fifo priority; do
        train_run "$where" "$where-$m-$order-$r" --model "$m" --comm-order "$order"
      done
    done
  done
done

if [[ $parts == *" sim "* ]]; then
  echo "comm_order: calibrate ($ranks ranks, 2 nodes, $replicas compute threads per rank)"
  "$cluster" mpirun "$ranks" --bind-to none "$bench" calibrate -o "$out/netns-model.json" \
    --max-bytes 64MiB --compute-threads "$replicas" > "$out/calibrate.log"
fi

if [[ $parts == *" python "* ]]; then
  for m in $py_models; do
    for r in $(seq "$runs"); do
      for order in fifo priority; do
        echo "comm_order: python-$m-$order-$r"
        "$cluster" mpirun 8 "$py" tools/bench/python_train.py --loader fixed --comm ddl \
          --arch "$m" --size "$size" --batch "$batch" --classes "$classes" \
          --steps "$py_steps" --warmup 2 --comm-order "$order" --bucket-mb "$py_bucket" \
          | grep '^{' > "$out/python-$m-$order-$r.jsonl"
      done
    done
  done
fi

python3 tools/bench/comm_order_report.py "$out" "$runs" "$skip" "$batch" "$size" "$classes" \
  "$bench" "$models" "$py_models" "$parts" "${CO_ALLREDUCE:-auto}" "$replicas" | tee "$out/report.txt"
