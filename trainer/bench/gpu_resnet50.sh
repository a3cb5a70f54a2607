#!/usr/bin/env bash
# ResNet-50 training images/s on one GPU (issues 6 and 34): the speed stage of the GPU bundle's
# run.sh (tools/gpu/run.sh), alone. ddl-train (batch 256, bf16, channels-last) against
# trainer/bench/torch_eager.py eager and under torch.compile, data on the GPU, alternating
# rounds, medians; then ddl-train fed by its own loader from 1000-class shards made there (more
# images than the timed steps use), the cores less two decoding. Writes OUT/results.jsonl,
# OUT/summary.md and OUT/log.txt.
#
#   trainer/bench/gpu_resnet50.sh [BUNDLE] [OUT]   # BUNDLE: gpu-bundle (built here when missing)
#
# Environment: SPEED_BUDGET (seconds of alternating rounds, default 100), WORKERS, PYTHON,
# DEVICE=cpu for a smoke run of the script itself (resnet18 at 32 px; its figures mean nothing).
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-gpu-bundle}
[ -x "$bundle/run.sh" ] || tools/gpu/bundle.sh "$bundle"
STAGES=speed OUT=${2:-bench-out/gpu-resnet50} exec "$bundle/run.sh"
