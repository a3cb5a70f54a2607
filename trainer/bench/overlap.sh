#!/usr/bin/env bash
# ddl-train step time and images/s per --overlap mode, 2 ranks x REPLICAS CPU replicas
# (BENCHMARKS.md, ddl-train section; REPLICAS=4 over netns: the emulated 2 x 4 cluster in ddl's
# own layout, one rank per node with a table of 4, as issue 43 measures what the compiled step,
# which only pipelines, gives up against backward). Runs the modes alternately RUNS times; per run the median over steps
# 4..STEPS of the per-step metrics (step wall = global batch / images_per_s), then the median
# over runs.
#
#   trainer/bench/overlap.sh shm   SHARDS [OUT]   # plain mpirun -np 2 (shared memory)
#   trainer/bench/overlap.sh netns SHARDS [OUT]   # across tools/bench/netns-cluster.sh hosts
#                                                 # (run its `setup 2 1gbit` first)
# Environment: RUNS (5), STEPS (15), MODES ("off pipeline backward"), MODEL (resnet18),
# IMAGE_SIZE (64), BATCH (16), REPLICAS (1), ALGO (ring), BUCKET_MB (25), DDL_TRAIN
# (target/release/ddl-train).
set -euo pipefail
cd "$(dirname "$0")/../.."
launch=${1:?shm or netns}
shards=${2:?shard directory}
out=${3:-bench-out/overlap-$launch}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
case $launch in
  shm) launcher=(mpirun --oversubscribe --bind-to none -np 2) ;;
  # --bind-to none: the emulated hosts share this machine's cores; Open MPI's default binding
  # would put both ranks on core 0.
  netns) launcher=(tools/bench/netns-cluster.sh mpirun 2 --bind-to none) ;;
  *) echo "usage: $0 shm|netns SHARDS [OUT]" >&2; exit 2 ;;
esac
for run in $(seq "${RUNS:-5}"); do
  for mode in ${MODES:-off pipeline backward}; do
    "${launcher[@]}" "${DDL_TRAIN:-$PWD/target/release/ddl-train}" --data "$shards" \
      --model "${MODEL:-resnet18}" --image-size "${IMAGE_SIZE:-64}" --batch "${BATCH:-16}" \
      --devices "cpu:${REPLICAS:-1}" --workers 1 --residency rank --no-eval --quiet \
      --max-steps "${STEPS:-15}" --allreduce "${ALGO:-ring}" --bucket-mb "${BUCKET_MB:-25}" \
      --overlap "$mode" --metrics "$out/$mode-$run.jsonl"
  done
done
python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-*.jsonl"))):
    mode = os.path.basename(path).rsplit("-", 1)[0]
    steps = [json.loads(l) for l in open(path)][3:]
    steps = [s for s in steps if s.get("type") == "step"]
    batch = 2 * int(os.environ.get("REPLICAS", "1")) * int(os.environ.get("BATCH", "16"))
    med = lambda k: statistics.median(s[k] for s in steps)
    runs.setdefault(mode, []).append(
        (statistics.median(batch / s["images_per_s"] for s in steps),
         med("images_per_s"), med("compute_s"), med("allreduce_s")))
print(f"{'mode':>9} {'runs':>4} {'step_s':>7} {'images/s':>9} {'compute_s':>9} {'allreduce_s':>11}")
for mode, rs in runs.items():
    cols = [statistics.median(r[i] for r in rs) for i in range(4)]
    print(f"{mode:>9} {len(rs):>4} {cols[0]:>7.3f} {cols[1]:>9.1f} {cols[2]:>9.3f} {cols[3]:>11.3f}")
PY
