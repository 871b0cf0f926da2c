#!/usr/bin/env bash
# scripts/test-gpu.sh — builds tensorwire with CUDA and runs its tests on a machine with an NVIDIA GPU and nvcc
# (`make test-gpu`). Meant for a bare GPU machine that has the CUDA toolkit, CMake, Ninja, Python 3 with nanobind,
# pytest, hypothesis and the GPU libraries the tests use (PyTorch, CuPy, Numba, JAX), but neither GoogleTest, UCX
# nor network access: `make gpu-bundle` beforehand copies GoogleTest's sources, a UCX with CUDA transports and
# Debian's UCX headers into third_party/ (git-ignored: send it along with the tree); the build compiles GoogleTest
# when no installed one is found and the network layer against those headers, and the UCX goes first on
# LD_LIBRARY_PATH.
#
# Run from anywhere; it works in the repository root. Everything it produces goes to ${OUT:-build/gpu-out}, at most
# eight files there (summary.md, build.log, ctest.log, sanitizer.log, pytest-cuda.log, pytest.log, junit.xml,
# bench-cuda.json); the build is build/gpu and intermediate files are under build/gpu/results.
#
# Steps, in order; a failing step does not stop the ones after it (they skip when what they need was not built):
#   configure    cmake (Release, tests, Python extension against this machine's python3)
#   build        ninja, every core, keeps going past failures (-k 0)
#   ctest-gpu    the C++ GPU tests (ctest label "gpu": tw_test_cuda, tw_test_cuda_ipc), -j8, JUnit
#   pytest-cuda  tests/python/test_cuda.py, test_cuda_interface.py, test_cuda_nogpu.py: the Python GPU tests, right
#                after the C++ ones, so that a short budget runs them before anything a CPU machine also runs
#   pytest-cuda-ipc  tests/python/test_cuda_ipc.py (CUDA tensors between processes), in a run of its own: a hang
#                or a crash there loses only its own results
#   sanitizer    tw_test_cuda under compute-sanitizer memcheck (skipped, with a note, without compute-sanitizer)
#   sanitizer-ipc  tw_test_cuda_ipc (CUDA tensors between processes) under memcheck, its peer processes included
#                (not the SIGKILL tests: ctest-gpu runs those)
#   ctest        the rest of the C++ suite (CI runs it too)
#   bench        `python3 -m tensorwire bench --device cuda` when the benchmark has --device (never fails the run)
#   pytest       the rest of tests/python, less test_ipc_soak.py and test_net.py (UCX, long runs): CI runs these
#                too, so they come last
# summary.md gets a table of the steps (status, tests passed/failed/skipped, seconds), the failing tests, the skip
# reasons of the GPU tests, the machine (GPU, driver, nvcc, library versions, commit) and the tails of failed logs.
# The exit status is non-zero when any step failed.
#
# Time: each step has a cap, and the whole script keeps within TW_GPU_BUDGET seconds (default 560, for a 10-minute
# command limit) so that the summary is always written; a step with too little time left (under 45 s, or under its
# cap when that is smaller) is skipped, saying so, and a step the budget cut short that then runs out of time is
# "cut short", not a failure. Each C++ test has 60 s (TW_TEST_TIMEOUT at configure).
# Environment:
#   OUT               where the results go (default build/gpu-out)
#   TW_GPU_STEPS      the steps to run, space-separated (default: all of the above); a later call on a machine that
#                     still has build/gpu can run, say, TW_GPU_STEPS="pytest bench" alone
#   TW_GPU_BUDGET     seconds for the whole script (default 560)
#   TW_GPU_JOBS       build parallelism (default: every core)
#   TW_GPU_WERROR     ON to keep -Werror (default OFF: warnings are CI's business, and this compiler may differ)
#   TW_CMAKE_ARGS     extra arguments for the configure step
#   TW_COMMIT         the commit the tree is from, when the tree travels without .git (else git, else
#                     third_party/gpu-commit written by `make gpu-bundle`, else build/gpu-commit)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUILD=$ROOT/build/gpu
WORK=$BUILD/results
mkdir -p "$WORK"
START=$SECONDS
BUDGET=${TW_GPU_BUDGET:-560}
RESERVE=20  # seconds kept for the summary
JOBS=${TW_GPU_JOBS:-$(nproc 2>/dev/null || echo 8)}
STEPS=" ${TW_GPU_STEPS:-configure build ctest-gpu pytest-cuda pytest-cuda-ipc sanitizer sanitizer-ipc ctest bench pytest} "
PY=$(command -v python3 || true)

SUMMARY=$OUT/summary.md
FACTS=$WORK/facts.md
: >"$FACTS"

# A UCX with CUDA transports from `make gpu-bundle` (scripts/bundle-ucx.sh; this machine has no UCX of its own):
# first on the library path, so that the network tests run, and CUDA tensors cross device memory to device memory
# ("ucx-cuda", which tests/python/test_cuda_ipc.py then expects: TW_TEST_UCX_CUDA=1).
if [[ -f $ROOT/third_party/ucx/lib/libucp.so.0 ]]; then
  export LD_LIBRARY_PATH="$ROOT/third_party/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "- UCX: $(cat "$ROOT/third_party/ucx/.tw-source" 2>/dev/null || echo unknown) from third_party/ucx" \
       "(CUDA transports), first on LD_LIBRARY_PATH" >>"$FACTS"
  # Whether UCX's CUDA module loads here (it needs libcuda; without it UCX has no CUDA memory type, and the tests
  # that expect "ucx-cuda" get "ucx-staged"): the reason is in the facts, not guessed from a failed test.
  # (both: the transport, and the memory hooks without which UCX takes device addresses for host ones)
  if cuda_mod=$("${PY:-python3}" -c 'import ctypes, sys; [ctypes.CDLL(p) for p in sys.argv[1:]]; print("loads")' \
                  "$ROOT/third_party/ucx/lib/ucx/libuct_cuda.so.0" "$ROOT/third_party/ucx/lib/ucx/libucm_cuda.so.0" \
                  2>&1 | tail -n 1); then
    echo "- UCX's CUDA transport module: $cuda_mod" >>"$FACTS"
    if [[ $cuda_mod == loads ]]; then export TW_TEST_UCX_CUDA=1; fi
  else
    echo "- UCX's CUDA transport module does NOT load: ${cuda_mod:0:300}" >>"$FACTS"
  fi
else
  echo "- UCX: none bundled (run \`make gpu-bundle\`): the network tests skip" >>"$FACTS"
fi
if [[ -f $ROOT/third_party/ucx-include/ucp/api/ucp.h ]]; then
  echo "- UCX headers: $(cat "$ROOT/third_party/ucx-include/.tw-source" 2>/dev/null || echo unknown) from third_party/ucx-include" >>"$FACTS"
else
  echo "- UCX headers: none bundled: the network layer is built only if this machine has ucp/api/ucp.h" >>"$FACTS"
fi

# ---- step bookkeeping ------------------------------------------------------------------------------------------
NAMES=() STATUS=() SECS=() NOTES=() JUNITS=() LOGS=()

record() {  # name status seconds note junit log
  NAMES+=("$1") STATUS+=("$2") SECS+=("$3") NOTES+=("$4") JUNITS+=("$5") LOGS+=("$6")
  printf '[test-gpu] %-12s %-14s %4ss  %s\n' "$1" "$2" "$3" "$4"
}

wanted() { [[ "$STEPS" == *" $1 "* ]]; }

time_left() { echo $((BUDGET - (SECONDS - START) - RESERVE)); }

# run_step NAME LOG CAP JUNIT IGNORED -- command...: runs the command under `timeout` (the smaller of CAP and the
# time left), appending its output to LOG; records pass/fail (or "fail (ignored)" when IGNORED is 1).
run_step() {
  local name=$1 log=$2 cap=$3 junit=$4 ignored=$5
  shift 6
  local left limit t0 rc=0 status note=""
  left=$(time_left)
  limit=$((cap < left ? cap : left))
  if ((limit < (cap < 45 ? cap : 45))); then
    record "$name" skip 0 "no time left in the ${BUDGET}s budget (${left}s)" "" ""
    return 0
  fi
  t0=$SECONDS
  {
    echo
    echo "==== $name: $(date -u '+%F %T') UTC, limit ${limit}s"
    echo "==== \$ $*"
  } >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1 || rc=$?
  if ((rc == 0)); then
    status=pass
  else
    status=fail
    if ((rc == 124 || rc == 137)); then note="timed out after ${limit}s"; else note="exit status $rc"; fi
    if [[ $ignored == 1 ]]; then status="fail (ignored)"; fi
    # (the budget, not the step, ran out: what it finished is in its log)
    if ((rc == 124 || rc == 137)) && ((limit < cap)); then
      status="cut short"
      note="the budget left it ${limit}s of its ${cap}s cap"
    fi
  fi
  echo "==== $name: $status${note:+ ($note)} after $((SECONDS - t0))s" >>"$log"
  record "$name" "$status" $((SECONDS - t0)) "$note" "$junit" "$log"
}

skip_step() { record "$1" skip 0 "$2" "" ""; }

# ---- the machine -----------------------------------------------------------------------------------------------
# nvcc: on PATH, or where the CUDA toolkit usually lives.
if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/cuda/bin; do
    if [[ -x $d/nvcc ]]; then
      PATH=$d:$PATH
      break
    fi
  done
fi
NVCC=$(command -v nvcc || true)

commit="unknown"
if [[ -n ${TW_COMMIT:-} ]]; then
  commit="$TW_COMMIT (TW_COMMIT)"
elif c=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null); then
  dirty=""
  if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then dirty=" + uncommitted changes"; fi
  commit="$c$dirty (git)"
elif [[ -s third_party/gpu-commit ]]; then
  commit="$(head -c 300 third_party/gpu-commit | tr '\n' ' ') (third_party/gpu-commit, written by make gpu-bundle)"
elif [[ -s build/gpu-commit ]]; then
  commit="$(head -c 300 build/gpu-commit | tr '\n' ' ') (build/gpu-commit)"
fi

{
  echo "- commit: $commit"
  echo "- host: $(uname -n) $(uname -m), $(nproc 2>/dev/null || echo '?') cores, started $(date -u '+%F %T') UTC"
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "- nvidia-smi -L: $(timeout 30 nvidia-smi -L 2>&1 | tr '\n' ';' || true)"
    echo "- GPU (name, driver, memory): $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tr '\n' ';' || true)"
    echo "- GPU (compute mode, persistence mode, memory used): $(timeout 30 nvidia-smi --query-gpu=compute_mode,persistence_mode,memory.used --format=csv,noheader 2>&1 | tr '\n' ';' || true)"
  else
    echo "- nvidia-smi: not found"
  fi
  if [[ -n $NVCC ]]; then
    echo "- nvcc: $NVCC, $(timeout 30 "$NVCC" --version 2>&1 | grep -i 'release' | tail -n 1 || true)"
    # A driver older than the toolkit cannot load what this nvcc builds (PTX of a newer ISA): every test of
    # tensorwire's strided kernels then fails at cuModuleLoadData. Said here, so that a failure reads as that.
    drv_cuda=$(timeout 30 nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1 || true)
    nvcc_rel=$(timeout 30 "$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -n 1 || true)
    if [[ -n $drv_cuda && -n $nvcc_rel ]]; then
      if [[ $(printf '%s\n%s\n' "$drv_cuda" "$nvcc_rel" | sort -V | head -n 1) != "$nvcc_rel" ]]; then
        echo "- WARNING: the driver supports CUDA $drv_cuda, older than nvcc $nvcc_rel: kernels this nvcc builds may not load (cuModuleLoadData), failing every strided-kernel test"
      else
        echo "- driver CUDA $drv_cuda >= nvcc $nvcc_rel: the kernels load"
      fi
    fi
  else
    echo "- nvcc: not found"
  fi
  echo "- cmake: $(cmake --version 2>/dev/null | sed -n 1p || echo 'not found'); ninja: $(ninja --version 2>/dev/null || echo 'not found')"
  echo "- c++: $(c++ --version 2>/dev/null | sed -n 1p || echo 'not found')"
  if command -v compute-sanitizer >/dev/null 2>&1; then
    echo "- compute-sanitizer: $(compute-sanitizer --version 2>&1 | grep -i version | sed -n 1p || true)"
  else
    echo "- compute-sanitizer: not found"
  fi
  if [[ -n $PY ]]; then
    echo "- python3: $PY"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 120 "$PY" - <<'EOF' 2>&1 || echo "  (the version probe failed)"
import importlib, sys
print(f"  - Python {sys.version.split()[0]}")
for name in ["numpy", "torch", "torchvision", "cupy", "numba", "numba.cuda", "jax", "jaxlib", "pyarrow", "ml_dtypes",
             "nanobind", "pytest", "hypothesis"]:
    try:
        m = importlib.import_module(name)
        extra = ""
        if name == "torch":
            extra = f", CUDA {m.version.cuda}, is_available={m.cuda.is_available()}"
        elif name == "numba.cuda":
            print(f"  - numba.cuda: is_available={m.is_available()}")
            continue
        elif name == "jax":
            try:
                extra = f", devices={[str(d) for d in m.devices()]}"
            except Exception as e:  # no GPU backend
                extra = f", devices: {type(e).__name__}: {e}"
        elif name == "cupy":
            try:
                extra = f", runtime {m.cuda.runtime.runtimeGetVersion()}, devices {m.cuda.runtime.getDeviceCount()}"
            except Exception as e:
                extra = f", {type(e).__name__}: {e}"
        print(f"  - {name} {getattr(m, '__version__', '?')}{extra}")
    except Exception as e:
        print(f"  - {name}: absent ({type(e).__name__}: {str(e)[:160]})")
EOF
  else
    echo "- python3: not found"
  fi
} >>"$FACTS"
cat "$FACTS"

# The tests: fail instead of skipping when no device is seen, and require the kernels nvcc builds.
export TW_REQUIRE_CUDA=1
if [[ -n $NVCC ]]; then export TW_EXPECT_CUDA_KERNELS=1; fi
export HYPOTHESIS_PROFILE=ci PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
# PyTorch's own allocator, as the tests expect ("cuda-ipc" for its tensors; the expandable-segments tests set this
# in their own child processes)
if [[ -n ${PYTORCH_CUDA_ALLOC_CONF:-} ]]; then
  echo "- PYTORCH_CUDA_ALLOC_CONF was '$PYTORCH_CUDA_ALLOC_CONF': unset for the tests" >>"$FACTS"
  unset PYTORCH_CUDA_ALLOC_CONF
fi
export PYTHONPATH=$BUILD/pkg${PYTHONPATH:+:$PYTHONPATH}

# ---- configure and build ---------------------------------------------------------------------------------------
if wanted configure; then
  if [[ -z $NVCC ]]; then
    {
      echo "test-gpu: no nvcc (not on PATH, nor in /usr/local/cuda/bin): this script needs the CUDA toolkit to build"
      echo "tensorwire's kernels. It is meant for the GPU machine; install the toolkit or put nvcc on PATH."
    } | tee -a "$OUT/build.log" >&2
    record nvcc fail 0 "no nvcc: the CUDA toolkit is needed" "" "$OUT/build.log"
  elif [[ -z $PY ]]; then
    record configure fail 0 "no python3" "" ""
  else
    export CUDACXX=$NVCC
    args=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTW_BUILD_TESTS=ON -DTW_BUILD_PYTHON=ON
          "-DPython_EXECUTABLE=$PY" "-DTW_NVCC=$NVCC" "-DTW_WERROR=${TW_GPU_WERROR:-OFF}" -DTW_TEST_TIMEOUT=60)
    # GoogleTest's sources from `make gpu-bundle`: tests/cpp/CMakeLists.txt builds them only when no installed
    # GoogleTest is found.
    # UCX's headers (Debian's, from `make gpu-bundle`: this machine has none), without which the network layer is
    # built as "UCX unavailable" and the bundled UCX goes unused.
    if [[ -f $ROOT/third_party/ucx-include/ucp/api/ucp.h ]]; then
      args+=("-DTW_UCX_INCLUDE=$ROOT/third_party/ucx-include")
    fi
    if [[ -f $ROOT/third_party/googletest/CMakeLists.txt ]]; then
      args+=("-DTW_GTEST_SOURCE_DIR=$ROOT/third_party/googletest")
    else
      echo "test-gpu: third_party/googletest is missing (run \`make gpu-bundle\` and send third_party/ along):" \
           "the build needs an installed GoogleTest then" | tee -a "$OUT/build.log"
    fi
    # shellcheck disable=SC2206  # word splitting intended
    if [[ -n ${TW_CMAKE_ARGS:-} ]]; then args+=($TW_CMAKE_ARGS); fi
    run_step configure "$OUT/build.log" 120 "" 0 -- cmake "${args[@]}"
  fi
fi
configured=0
if [[ -f $BUILD/build.ninja ]]; then configured=1; fi

if wanted build; then
  if ((configured)); then
    run_step build "$OUT/build.log" 300 "" 0 -- cmake --build "$BUILD" -j "$JOBS" -- -k 0
  else
    skip_step build "not configured"
  fi
fi

# ---- C++ -------------------------------------------------------------------------------------------------------
# (ctest writes its JUnit at the end only: the GPU tests run apart from the rest, so that one hang loses less)
if wanted ctest-gpu; then
  if ((configured)) && [[ -f $BUILD/CTestTestfile.cmake ]]; then
    rm -f "$WORK/ctest-gpu.xml"
    run_step ctest-gpu "$OUT/ctest.log" 150 "$WORK/ctest-gpu.xml" 0 -- \
      ctest --test-dir "$BUILD" -L gpu --output-on-failure -j 8 --output-junit "$WORK/ctest-gpu.xml"
  else
    skip_step ctest-gpu "not configured"
  fi
fi

# ---- Python ----------------------------------------------------------------------------------------------------
have_ext=0
if compgen -G "$BUILD/pkg/tensorwire/_tensorwire*.so" >/dev/null; then have_ext=1; fi
CUDA_TESTS=(tests/python/test_cuda.py tests/python/test_cuda_nogpu.py tests/python/test_cuda_interface.py)
CUDA_IPC_TESTS=(tests/python/test_cuda_ipc.py)
# (A module that cannot be imported on that machine, say for a library it lacks, fails alone: without
# --continue-on-collection-errors pytest would run none of the tests of the step.)
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rs --continue-on-collection-errors)

if wanted pytest-cuda; then
  if ((have_ext)); then
    present=()
    for f in "${CUDA_TESTS[@]}"; do if [[ -f $f ]]; then present+=("$f"); fi; done
    rm -f "$WORK/pytest-cuda.xml"
    run_step pytest-cuda "$OUT/pytest-cuda.log" 150 "$WORK/pytest-cuda.xml" 0 -- \
      "${PYTEST[@]}" "--junitxml=$WORK/pytest-cuda.xml" "${present[@]}"
  else
    skip_step pytest-cuda "the Python extension was not built"
  fi
fi

if wanted pytest-cuda-ipc; then
  if ((have_ext)); then
    rm -f "$WORK/pytest-cuda-ipc.xml"
    run_step pytest-cuda-ipc "$OUT/pytest-cuda.log" 180 "$WORK/pytest-cuda-ipc.xml" 0 -- \
      "${PYTEST[@]}" "--junitxml=$WORK/pytest-cuda-ipc.xml" "${CUDA_IPC_TESTS[@]}"
  else
    skip_step pytest-cuda-ipc "the Python extension was not built"
  fi
fi

# ---- compute-sanitizer (C++) ----------------------------------------------------------------------------------
if wanted sanitizer; then
  bin=$BUILD/tests/cpp/tw_test_cuda
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    skip_step sanitizer "compute-sanitizer is not installed"
  elif [[ ! -x $bin ]]; then
    skip_step sanitizer "tests/cpp/tw_test_cuda was not built"
  else
    rm -f "$WORK/sanitizer.xml"
    # (--report-api-errors no: a driver call that fails on purpose, a probe or a query of unfinished work, is not a
    # memory error; the tests check those results themselves)
    run_step sanitizer "$OUT/sanitizer.log" 120 "$WORK/sanitizer.xml" 0 -- \
      compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$bin" \
      "--gtest_output=xml:$WORK/sanitizer.xml"
  fi
fi

if wanted sanitizer-ipc; then
  bin=$BUILD/tests/cpp/tw_test_cuda_ipc
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    skip_step sanitizer-ipc "compute-sanitizer is not installed"
  elif [[ ! -x $bin ]]; then
    skip_step sanitizer-ipc "tests/cpp/tw_test_cuda_ipc was not built"
  else
    rm -f "$WORK/sanitizer-ipc.xml"
    # (--target-processes all: the tw_cuda_ipc_peer processes the tests start are checked too; the tests that
    # SIGKILL an instrumented process are left to ctest-gpu)
    run_step sanitizer-ipc "$OUT/sanitizer.log" 150 "$WORK/sanitizer-ipc.xml" 0 -- \
      compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --error-exitcode 1 "$bin" \
      "--gtest_filter=-*Killed*" "--gtest_output=xml:$WORK/sanitizer-ipc.xml"
  fi
fi

if wanted ctest; then
  if ((configured)) && [[ -f $BUILD/CTestTestfile.cmake ]]; then
    rm -f "$WORK/ctest.xml"
    run_step ctest "$OUT/ctest.log" 150 "$WORK/ctest.xml" 0 -- \
      ctest --test-dir "$BUILD" -LE gpu --output-on-failure -j 8 --output-junit "$WORK/ctest.xml"
  else
    skip_step ctest "not configured"
  fi
fi

# ---- the benchmark, then the CPU-side Python suite ---------------------------------------------------------------
if wanted bench; then
  if ((have_ext)); then
    help=$(timeout 60 "$PY" -m tensorwire bench --help 2>&1 || true)
    if grep -q -- '--device' <<<"$help"; then
      outflag=--out
      if ! grep -q -- '--out' <<<"$help" && grep -q -- '--json' <<<"$help"; then outflag=--json; fi
      run_step bench "$WORK/bench.log" 180 "" 1 -- \
        "$PY" -m tensorwire bench --device cuda "$outflag" "$OUT/bench-cuda.json"
    else
      skip_step bench "tensorwire bench has no --device option"
    fi
  else
    skip_step bench "the Python extension was not built"
  fi
fi

if wanted pytest; then
  if ((have_ext)); then
    ignores=(--ignore=tests/python/test_ipc_soak.py --ignore=tests/python/test_net.py)
    for f in "${CUDA_TESTS[@]}" "${CUDA_IPC_TESTS[@]}"; do ignores+=("--ignore=$f"); done
    rm -f "$WORK/pytest.xml"
    run_step pytest "$OUT/pytest.log" 240 "$WORK/pytest.xml" 0 -- \
      "${PYTEST[@]}" "--junitxml=$WORK/pytest.xml" "${ignores[@]}" tests/python
  else
    skip_step pytest "the Python extension was not built"
  fi
fi

# ---- summary ---------------------------------------------------------------------------------------------------
overall=PASS
for s in "${STATUS[@]}"; do
  if [[ $s == fail ]]; then overall=FAIL; fi
done
if [[ $overall == PASS ]]; then
  for s in "${STATUS[@]}"; do
    if [[ $s == "cut short" ]]; then overall="PASS (incomplete: a step was cut short)"; fi
  done
fi

steps_tsv=$WORK/steps.tsv
: >"$steps_tsv"
for i in "${!NAMES[@]}"; do
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${NOTES[$i]}" "${JUNITS[$i]}" \
    "${LOGS[$i]}" >>"$steps_tsv"
done

write_summary_python() {
  OVERALL=$overall TOTAL=$((SECONDS - START)) "$PY" - "$steps_tsv" "$FACTS" "$SUMMARY" "$OUT/junit.xml" <<'EOF'
import os, sys, xml.etree.ElementTree as ET

steps_tsv, facts, summary, merged_path = sys.argv[1:5]
steps = [line.rstrip("\n").split("\t") for line in open(steps_tsv) if line.strip()]


def outcome(case):
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return "failed"
    if "skipped" in tags or case.get("result") == "skipped" or case.get("status") in ("notrun", "disabled"):
        return "skipped"
    return "passed"


merged = ET.Element("testsuites")
rows, failures, skips = [], [], []
for name, status, secs, note, junit, log in steps:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    have = bool(junit) and os.path.exists(junit)
    if have:
        try:
            root = ET.parse(junit).getroot()
            suites = [root] if root.tag == "testsuite" else root.findall(".//testsuite")
            for suite in suites:
                suite.set("name", f"{name}: {suite.get('name', '')}")
                merged.append(suite)
                for case in suite.findall("testcase"):
                    o = outcome(case)
                    counts[o] += 1
                    label = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
                    if o == "failed":
                        failures.append(f"{name}: {label}")
                    elif o == "skipped" and name in ("pytest-cuda", "pytest-cuda-ipc", "ctest-gpu", "sanitizer",
                                                    "sanitizer-ipc"):
                        el = case.find("skipped")
                        why = (el.get("message") if el is not None else None) or case.get("status") or ""
                        skips.append(f"{name}: {label}: {why[:200]}")
        except ET.ParseError as e:
            note = (note + "; " if note else "") + f"unreadable JUnit: {e}"
            have = False
    c = counts if have else None
    rows.append((name, status, *(str(c[k]) if c else "-" for k in ("passed", "failed", "skipped")), secs, note))

ET.ElementTree(merged).write(merged_path, encoding="utf-8", xml_declaration=True)

out = [f"# tensorwire GPU run: {os.environ['OVERALL']}", "",
       f"{os.environ['TOTAL']} s in all. Steps in order; a failed step does not stop the next.", "",
       "| step | status | passed | failed | skipped | seconds | note |", "|---|---|---|---|---|---|---|"]
out += ["| " + " | ".join(r) + " |" for r in rows]
out += ["", "## Machine", "", open(facts).read().rstrip()]
if failures:
    out += ["", f"## Failed tests ({len(failures)})", ""] + [f"- {f}" for f in failures[:80]]
    if len(failures) > 80:
        out.append(f"- ... and {len(failures) - 80} more (junit.xml)")
if skips:  # the GPU-only steps' reasons first
    order = {"ctest-gpu": 0, "pytest-cuda": 0, "pytest-cuda-ipc": 0, "sanitizer": 1, "sanitizer-ipc": 1}
    skips.sort(key=lambda s: order.get(s.split(":", 1)[0], 3))
    out += ["", f"## Skipped GPU-step tests ({len(skips)})", ""] + [f"- {s}" for s in skips[:40]]
    if len(skips) > 40:
        out.append(f"- ... and {len(skips) - 40} more (junit.xml)")
for name, status, secs, note, junit, log in steps:
    if status.startswith("fail") and log and os.path.exists(log):
        lines = open(log, errors="replace").read().splitlines()
        out += ["", f"## {name}: the last {min(len(lines), 60)} lines of {os.path.basename(log)}", "", "```"]
        out += [l[:400] for l in lines[-60:]] + ["```"]
bench_log = os.path.join(os.path.dirname(steps_tsv), "bench.log")
if os.path.exists(bench_log):
    lines = open(bench_log, errors="replace").read().splitlines()
    out += ["", "## bench output (last 100 lines)", "", "```"] + [l[:400] for l in lines[-100:]] + ["```"]
open(summary, "w").write("\n".join(out) + "\n")
EOF
}

if [[ -n $PY ]] && write_summary_python; then
  :
else  # no Python, or the summary script failed: a plain table
  {
    echo "# tensorwire GPU run: $overall"
    echo
    echo "| step | status | seconds | note |"
    echo "|---|---|---|---|"
    for i in "${!NAMES[@]}"; do echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} | ${NOTES[$i]} |"; done
    echo
    echo "## Machine"
    echo
    cat "$FACTS"
  } >"$SUMMARY"
fi

# At most 16 MiB a file comes back from the GPU machine: keep the end of a longer log.
for f in "$OUT"/*.log; do
  if [[ -f $f ]] && (($(stat -c %s "$f") > 15 * 1024 * 1024)); then
    tail -c $((15 * 1024 * 1024)) "$f" >"$f.tmp" && mv "$f.tmp" "$f"
  fi
done

echo
cat "$SUMMARY"
if [[ $overall == FAIL ]]; then exit 1; fi
