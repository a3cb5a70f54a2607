# ddl: `make demo` and `make test` work on a fresh Debian 12 machine as root.
# Everything builds in release (libtorch's C++ wrapper is compiled once and shared by both).

SHELL := /bin/bash
CARGO ?= cargo
VENV ?= $(CURDIR)/.venv

# libtorch: the virtualenv's PyTorch 2.11.0 unless the user points LIBTORCH at their own.
ifeq ($(LIBTORCH),)
export VIRTUAL_ENV := $(VENV)
export PATH := $(VENV)/bin:$(PATH)
export LIBTORCH_USE_PYTORCH := 1
endif
# Open MPI refuses root without these; CI and the reference machines run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# tch's zip reader links zstd: Debian's libzstd (setup installs it) saves compiling it.
export ZSTD_SYS_USE_PKG_CONFIG := 1
# The environment maturin builds the Python extension in, given to every cargo build too: pyo3's
# build script reruns whenever these change, so otherwise each `maturin develop` (every `make
# setup`) and the next `cargo build` rebuild pyo3 and the extension for each other.
export PYO3_PYTHON := $(VENV)/bin/python
export PYTHON_SYS_EXECUTABLE := $(VENV)/bin/python
export PYO3_BUILD_EXTENSION_MODULE := 1
export PYO3_ENVIRONMENT_SIGNATURE := cpython-$(shell python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)-64bit
# One MPI process per node may use the node's cores; keep OpenMP from oversubscribing them.
export OMP_NUM_THREADS ?= 1

.PHONY: all setup build demo test build-tests test-rust test-python lint bench wheel clean

all: build

# VENV: the virtualenv setup fills (or checks) is the one every target then uses.
setup:
	@DDL_VENV=$(VENV) scripts/setup.sh

# Every crate but the Python extension, which `make setup` builds with maturin (cargo building it
# too would rebuild it after each maturin build and back: they pass rustc different arguments).
CRATES := --workspace --exclude ddl-python

build: setup
	$(CARGO) build --release $(CRATES)

demo: build
	@scripts/demo.sh

lint: setup
	$(CARGO) fmt --all -- --check
	@scripts/same-features.sh
	@scripts/import-circles.py
	$(CARGO) clippy --release --workspace --all-targets -- -D warnings

# One feature resolution for every step: `--all-targets` includes the dev-dependencies, as
# clippy and `cargo test` do, so no crate is compiled twice with two feature sets.
test: test-rust test-python

# The pieces of `make test`, which .ci/run times one by one.
build-tests: setup
	$(CARGO) build --release $(CRATES) --all-targets

test-rust: build-tests
	$(CARGO) test --release $(CRATES)

# Two test files at a time (pytest-xdist): alone, the suite leaves a quarter of two cores idle
# while its jobs start ranks and wait on timeouts. A file's tests stay in one process, so its
# module fixtures (packed shards, the example's reference run) are made once. test_models runs
# the built binaries.
test-python: build-tests
	@if [ -x $(VENV)/bin/python ]; then $(VENV)/bin/python -m pytest -q -n 2 --dist loadfile python/tests; \
	else echo "test: no virtualenv ($(VENV)): the Python package's tests were not run"; fi

# A wheel of the Python package `ddl` in dist/: abi3 (CPython >= 3.9), libjpeg-turbo linked in
# statically, MPI linked from the system (libmpi.so.40: Open MPI 4 and 5), so the tag is plain
# `linux` rather than manylinux. WHEEL_DIR: where it goes (tools/gpu/bundle.sh passes its own).
WHEEL_DIR ?= $(CURDIR)/dist
wheel: setup
	cd python && $(VENV)/bin/maturin build --release --compatibility linux --auditwheel skip -o $(WHEEL_DIR)

bench: build
	$(CARGO) build --release $(CRATES) --examples
	@scripts/bench.sh

clean:
	$(CARGO) clean
	rm -rf demo-out bench-out dist
