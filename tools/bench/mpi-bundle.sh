#!/usr/bin/env bash
# Packs this machine's Open MPI (tools/pack-openmpi.sh) with `ddl-bench` and the C loop peer
# into one folder, to run tools/bench/allreduce.sh on an x86-64 machine that has no MPI and no
# compiler (the GPU machines of BENCHMARKS.md, "On a quiet 16-core machine"). For part B of
# issue 34 (ddl-train, the Python package, run.sh) use tools/gpu/bundle.sh instead.
#
#   tools/bench/mpi-bundle.sh DIR          # here: build ddl-bench and the peer, fill DIR
#   . DIR/env.sh                           # there, in a checkout: mpirun, ddl-bench, the peer
#   mkdir -p target/release && cp DIR/bin/ddl-bench target/release/
#   PYTHON=python3 ALLREDUCE_PEER=DIR/bin/mpi_allreduce tools/bench/allreduce.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tools/bench/mpi-bundle.sh DIR}
[ -e "$dir" ] && { echo "mpi-bundle: $dir exists; give a new folder" >&2; exit 1; }
cargo build --release -p ddl-tools --bin ddl-bench
mkdir -p "$dir/bin"
objcopy --strip-debug target/release/ddl-bench "$dir/bin/ddl-bench"
mpicc -O2 -Wall -o "$dir/bin/mpi_allreduce" tools/bench/mpi_allreduce.c
tools/pack-openmpi.sh "$dir"
du -sh "$dir"
