#!/usr/bin/env bash
# Packs this machine's Open MPI (Debian 12's 4.1.4: mpirun, its libraries and plugins, PMIx and
# their data) into DIR beside the programs already in DIR/bin, for an x86-64 machine that has no
# MPI and no compiler (the GPU machines of BENCHMARKS.md). Nothing is installed there: `. DIR/env.sh`
# relocates the bundle's Open MPI with OPAL_PREFIX / PMIX_PREFIX and LD_LIBRARY_PATH.
#
#   tools/pack-openmpi.sh DIR     # DIR/bin holds the programs; adds root/, lib/, bin/mpirun, env.sh
#
# DIR/lib gets every shared library that the programs in DIR/bin, mpirun and the plugins load
# from this machine's system library folders, but glibc's, the C++ runtime's (libstdc++,
# libgcc_s: the target's own torch brings the ones it needs) and Open MPI's own (in root/).
# Libraries found elsewhere (libtorch in a virtualenv) are not packed: the target machine's
# torch provides them, found through LD_LIBRARY_PATH.
# Used by tools/bench/mpi-bundle.sh and tools/gpu/bundle.sh.
set -euo pipefail
dir=${1:?usage: tools/pack-openmpi.sh DIR}
[ -d "$dir/bin" ] || { echo "pack-openmpi: $dir/bin: no such folder (put the programs there first)" >&2; exit 1; }
multiarch=usr/lib/x86_64-linux-gnu
mkdir -p "$dir/lib" "$dir/root/usr/bin" "$dir/root/$multiarch" "$dir/root/usr/share" "$dir/root/etc"
cp -a /usr/bin/orterun /usr/bin/orted "$dir/root/usr/bin/"
cp -a "/$multiarch/openmpi" "/$multiarch/pmix2" "$dir/root/$multiarch/"
# Open MPI's own libraries (openmpi/lib holds only links to them), less the language bindings.
cp -a "/$multiarch"/libmpi.so.40* "/$multiarch"/libopen-pal.so.40* "/$multiarch"/libopen-rte.so.40* \
  "/$multiarch"/libmca_common_*.so.* "/$multiarch"/libpmix.so.2* "$dir/root/$multiarch/"
# What only a compiler reads.
rm -rf "$dir/root/$multiarch/openmpi/include" "$dir/root/$multiarch/openmpi/lib/pkgconfig" \
  "$dir/root/$multiarch/pmix2/include" "$dir/root/$multiarch/pmix2/lib/libpmix.a"
cp -a /usr/share/openmpi "$dir/root/usr/share/"
cp -a /etc/openmpi "$dir/root/etc/"
ln -s ../root/usr/bin/orterun "$dir/bin/mpirun"
find "$dir/bin" "$dir/root" -type f \( -name '*.so*' -o -perm -u+x \) -exec ldd {} + 2>/dev/null |
  awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $lib in /lib/*|/usr/lib/*) ;; *) continue ;; esac
    case $(basename "$lib") in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*) ;;
      libstdc++.so.*|libgcc_s.so.*) ;;
      libmpi.so.*|libopen-*|liboshmem.so.*|libmca_common_*|libpmix.so.*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
cat > "$dir/env.sh" <<'EOF'
# Source to use this bundle's Open MPI and programs (bin/ first on PATH).
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
M=$D/root/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=$D/root/usr PMIX_PREFIX=$M/pmix2
export OPAL_SYSCONFDIR=$D/root/etc/openmpi OPAL_PKGDATADIR=$D/root/usr/share/openmpi
export PATH=$D/bin:$PATH
export LD_LIBRARY_PATH=$M:$M/openmpi/lib:$M/pmix2/lib:$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# PMIx finds its compression plugin's help text at the built-in path only.
export PMIX_MCA_pcompress_base_silence_warning=1
EOF
