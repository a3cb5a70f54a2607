#!/usr/bin/env bash
# Packs this machine's Open MPI (Debian 12's 4.1.4: mpirun, its plugins, PMIx and every shared
# library they load but glibc's) with `ddl-bench` and the C loop peer into one folder, to run
# tools/bench/allreduce.sh on an x86-64 machine that has no MPI and no compiler (the GPU
# machines of BENCHMARKS.md, "On a quiet 16-core machine"). Nothing is installed there: the
# bundle's Open MPI is relocated with OPAL_PREFIX / PMIX_PREFIX and LD_LIBRARY_PATH.
#
#   tools/bench/mpi-bundle.sh DIR          # here: build ddl-bench and the peer, fill DIR
#   . DIR/env.sh                           # there, in a checkout: mpirun, ddl-bench, the peer
#   mkdir -p target/release && cp DIR/bin/ddl-bench target/release/
#   PYTHON=python3 ALLREDUCE_PEER=DIR/bin/mpi_allreduce tools/bench/allreduce.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:?usage: tools/bench/mpi-bundle.sh DIR}
[ -e "$dir" ] && { echo "mpi-bundle: $dir exists; give a new folder" >&2; exit 1; }
multiarch=usr/lib/x86_64-linux-gnu
cargo build --release -p ddl-tools --bin ddl-bench
mkdir -p "$dir/bin" "$dir/lib" "$dir/root/usr/bin" "$dir/root/$multiarch" "$dir/root/usr/share" \
  "$dir/root/etc"
objcopy --strip-debug target/release/ddl-bench "$dir/bin/ddl-bench"
mpicc -O2 -Wall -o "$dir/bin/mpi_allreduce" tools/bench/mpi_allreduce.c
cp -a /usr/bin/orterun /usr/bin/orted "$dir/root/usr/bin/"
cp -a "/$multiarch/openmpi" "/$multiarch/pmix2" "$dir/root/$multiarch/"
rm -rf "$dir/root/$multiarch/openmpi/include"
cp -a /usr/share/openmpi "$dir/root/usr/share/"
cp -a /etc/openmpi "$dir/root/etc/"
ln -s ../root/usr/bin/orterun "$dir/bin/mpirun"
# Every shared library the programs and plugins load, but glibc's and the bundle's own.
find "$dir/bin" "$dir/root" -type f \( -name '*.so*' -o -perm -u+x \) -exec ldd {} + 2>/dev/null |
  awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*) ;;
      libmpi.so.*|libopen-*|liboshmem.so.*|libmca_common_*|libpmix.so.*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
cat > "$dir/env.sh" <<'EOF'
# Source to use this bundle's Open MPI, ddl-bench and C loop.
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
M=$D/root/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=$D/root/usr PMIX_PREFIX=$M/pmix2
export OPAL_SYSCONFDIR=$D/root/etc/openmpi OPAL_PKGDATADIR=$D/root/usr/share/openmpi
export PATH=$D/bin:$PATH
export LD_LIBRARY_PATH=$M/openmpi/lib:$M/pmix2/lib:$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# PMIx finds its compression plugin's help text at the built-in path only.
export PMIX_MCA_pcompress_base_silence_warning=1
EOF
du -sh "$dir"
