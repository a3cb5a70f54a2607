#!/usr/bin/env bash
# Builds, here, everything part B of issue 34 needs on a GPU machine that has python3 with
# torch (CUDA) but no MPI, no Rust, no compiler and no package registry, into one folder of at
# most 56 MiB that is carried there whole:
#   bin/         ddl-train, ddl-synth, ddl-pack, ddl-prof, ddl-bench, ddl-predict (stripped; they
#                load libtorch from the GPU machine's torch), mpirun
#   root/ lib/ env.sh   this machine's Open MPI and the libraries the programs need
#                (tools/pack-openmpi.sh)
#   wheel/       the abi3 wheel of the Python package ddl (`make wheel`)
#   py/          trainer/bench/torch_eager.py, examples/pytorch/train.py,
#                tools/bench/python_train.py and tools/gpu/'s scripts but preview.py (which
#                runs here, without a GPU)
#   run.sh       part B in one command (tools/gpu/run.sh: its header says what it runs)
#   bundle.json  the commit and the time it was built
#
#   tools/gpu/bundle.sh DIR        # e.g. gpu-bundle (git-ignored); then, there:
#   OUT=results DIR/run.sh         # or DEVICE=cpu OUT=results DIR/run.sh, anywhere
#
# DIR must be new, empty, or a bundle this script wrote (listed in DIR/.ddl-gpu-bundle): that
# one is replaced, file by file; a folder holding anything else is refused.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tools/gpu/bundle.sh DIR}
limit_mib=56
list=.ddl-gpu-bundle
programs=(ddl-train ddl-synth ddl-pack ddl-prof ddl-bench ddl-predict)

if [ -f "$dir/$list" ]; then
  # Our own earlier bundle: if it holds nothing else, remove exactly what it wrote (files, then
  # its emptied folders).
  others=$(cd "$dir" && comm -23 <(find . -mindepth 1 \( -type d -printf '%P/\n' -o -printf '%P\n' \) |
    grep -vx "$list" | sort) <(sort "$list"))
  if [ -n "$others" ]; then
    echo "bundle: $dir holds files an earlier bundle did not write; move them away first:" >&2
    echo "$others" | head -5 >&2
    exit 1
  fi
  (cd "$dir" && grep -v '/$' "$list" | tr '\n' '\0' | xargs -0 -r rm -f -- &&
    grep '/$' "$list" | sort -r | tr '\n' '\0' | xargs -0 -r rmdir -- && rm "$list")
elif [ -e "$dir" ] && { [ ! -d "$dir" ] || [ -n "$(ls -A "$dir")" ]; }; then
  echo "bundle: $dir exists and is not a bundle of tools/gpu/bundle.sh (no $list);" \
    "give a new or empty folder" >&2
  exit 1
fi
mkdir -p "$dir/bin" "$dir/py" "$dir/wheel"
dir=$(cd "$dir" && pwd)

# The build `make test` makes (one feature resolution, tests included): after the tests, as in
# CI, nothing is compiled again, and the bundle carries the binaries the tests ran.
make build-tests wheel WHEEL_DIR="$dir/wheel"
for p in "${programs[@]}"; do
  objcopy --strip-all "target/release/$p" "$dir/bin/$p"
done
tools/pack-openmpi.sh "$dir"
cp trainer/bench/torch_eager.py examples/pytorch/train.py tools/bench/python_train.py \
  tools/gpu/{torch_checks,compiled_graphs,report}.py "$dir/py/"
cp tools/gpu/run.sh "$dir/run.sh"
printf '{"commit": "%s", "built": "%s"}\n' "$(git describe --always --dirty 2>/dev/null || echo unknown)" \
  "$(date -u +%FT%TZ)" > "$dir/bundle.json"
written=$(cd "$dir" && find . -mindepth 1 \( -type d -printf '%P/\n' -o -printf '%P\n' \))
printf '%s\n' "$written" > "$dir/$list"

bytes=$(du -sb "$dir" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$bytes" -gt $((limit_mib << 20)) ]; then
  echo "bundle: $dir is $mib MiB, over the $limit_mib MiB that travel to the GPU machine; largest:" >&2
  du -ab "$dir" | sort -rn | sed -n '2,11p' >&2
  exit 1
fi
echo "bundle: $dir: $mib MiB (limit $limit_mib MiB); there: OUT=results $(basename "$dir")/run.sh"
