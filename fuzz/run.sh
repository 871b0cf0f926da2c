#!/usr/bin/env bash
# Builds the libFuzzer targets, replays every committed seed, then fuzzes each target.
#
#   fuzz/run.sh [build dir]          default build dir: build/fuzz (relative to the repository root)
#   FUZZ_RUNS=N                      bounded mode (the default, what `make test` runs): N inputs per target from a
#                                    fixed seed (FUZZ_SEED, default 1) and the seeds in name order (default 20000;
#                                    0 = replay only). The seed fixes libFuzzer's random choices, not the coverage
#                                    it is steered by: ASan's fake stacks (detect_stack_use_after_return) and the
#                                    copy engine's threads make that differ a little between runs (a few edges
#                                    either way), so the inputs tried are close, not identical. The
#                                    replay of the committed seeds is exact; a crash found here is saved under
#                                    <build dir>/artifacts/ and belongs in fuzz/corpus/<target>/ once fixed.
#   FUZZ_SECONDS=N                   open-ended mode (`make fuzz`): fuzz each target for N seconds from a random
#                                    seed; keep what reaches new code as cov-* seeds (below)
#   FUZZ_JOBS=N                      targets fuzzed at once (default: number of CPUs)
#   FUZZ_TARGETS="fuzz_a fuzz_b"     a subset of the targets (default: every fuzz/fuzz_*.cpp)
#
# Seeds, fuzz/corpus/<target>/: hand-made ones (written by fuzz/make_corpus*.py, which keep the two kinds below);
# crash* (inputs that crashed a target, committed with the fix); cov-<hash> (an open-ended run's finds, reduced to
# the inputs that add edges over all the others, so that the bounded run starts where that run got to):
#   t=fuzz_dlpack; mkdir -p /tmp/m && cp fuzz/corpus/$t/* /tmp/m/
#   build/fuzz/fuzz/$t -set_cover_merge=1 -use_counters=0 -use_cmp=0 /tmp/m build/fuzz/corpus/$t
#   then copy each new file of /tmp/m to fuzz/corpus/$t/cov-<first 16 characters of its name>.
# The committed corpus (fuzz/corpus/<target>/) is never written: fuzzing starts from its seeds (in name order) and
# writes what it finds to a fresh <build dir>/corpus/<target>/; crash inputs land in <build dir>/artifacts/. Exits
# non-zero on any crash, leak, sanitizer report, timeout or out-of-memory, and when a seed was not read. Re-running
# only rebuilds what changed (CMake + Ninja).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-build/fuzz}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
SECONDS_PER_TARGET=${FUZZ_SECONDS:-}
RUNS=${FUZZ_RUNS:-20000}
SEED=${FUZZ_SEED:-1}
if [[ -n "$SECONDS_PER_TARGET" ]]; then
  BUDGET=(-max_total_time="$SECONDS_PER_TARGET")
  BUDGET_TEXT="${SECONDS_PER_TARGET}s, random seed"
  [[ "$SECONDS_PER_TARGET" -gt 0 ]] || RUNS=0
else
  # -runs counts inputs; one fixed seed fixes libFuzzer's own choices (see FUZZ_RUNS above for what it does not).
  BUDGET=(-runs="$RUNS" -seed="$SEED")
  BUDGET_TEXT="$RUNS runs, seed $SEED"
fi
JOBS=${FUZZ_JOBS:-$(nproc)}
# Default: every fuzz/fuzz_*.cpp (each is a target in fuzz/CMakeLists.txt with seeds in fuzz/corpus/<target>/).
TARGETS=${FUZZ_TARGETS:-$(cd "$ROOT/fuzz" && for f in fuzz_*.cpp; do printf '%s ' "${f%.cpp}"; done)}
CXX=${CXX_FUZZ:-clang++-16}
CC=${CC_FUZZ:-clang-16}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# ---- build ------------------------------------------------------------------------------------------------------
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
mkdir -p "$BUILD"
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" \
    -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTW_BUILD_FUZZ=ON >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
fi
# shellcheck disable=SC2086
cmake --build "$BUILD" --target $TARGETS

BIN="$BUILD/fuzz"
mkdir -p "$BUILD/artifacts" "$BUILD/logs"
FLAGS=(-rss_limit_mb=2048 -timeout=10 -print_final_stats=1)

# ---- replay the seeds -------------------------------------------------------------------------------------------
fail=0
for t in $TARGETS; do
  seeds=("$ROOT/fuzz/corpus/$t"/*)
  [[ -e "${seeds[0]}" ]] || { echo "no seeds in fuzz/corpus/$t" >&2; exit 1; }
  # (the fuzzing below lists the seeds comma-separated: a name with a comma or a newline would break the list)
  if [[ "${seeds[*]}" == *,* ]] || [[ "${seeds[*]}" == *$'\n'* ]]; then
    echo "fuzz/corpus/$t: a seed's name has a comma or a newline; rename it" >&2
    exit 1
  fi
  # Files (not the directory) as arguments: each runs once and nothing is written next to them.
  if "$BIN/$t" -runs=0 "${FLAGS[@]}" -artifact_prefix="$BUILD/artifacts/$t-" "${seeds[@]}" \
      >"$BUILD/logs/$t.replay.log" 2>&1; then
    echo "replay  $t: ${#seeds[@]} seeds ok"
  else
    echo "replay  $t: FAILED (log: $BUILD/logs/$t.replay.log)"
    tail -n 40 "$BUILD/logs/$t.replay.log"
    fail=1
  fi
done
[[ $fail == 0 ]] || exit 1
[[ "$RUNS" -gt 0 ]] || exit 0

# ---- fuzz each target from its seeds ----------------------------------------------------------------------------
# The seeds go in as a list in name order (-seed_inputs), not as a directory: libFuzzer shuffles its starting inputs
# from the order it reads them in, and a directory's order is the filesystem's (ext4 hashes names with a seed of
# its own), so the same seed and runs fuzzed differently on another machine. The work directory starts empty and
# takes what the run adds.
fuzz_one() {  # records its exit status in logs/<target>.rc
  local t=$1 work="$BUILD/corpus/$1" rc=0 list="$BUILD/corpus/$1.seeds"
  rm -rf "$work" && mkdir -p "$work"
  (cd "$ROOT/fuzz/corpus/$t" && LC_ALL=C ls | sed "s|^|$ROOT/fuzz/corpus/$t/|" | paste -sd, - | tr -d "\n") >"$list"
  "$BIN/$t" "${FLAGS[@]}" "${BUDGET[@]}" -artifact_prefix="$BUILD/artifacts/$t-" -seed_inputs="@$list" \
    "$work" >"$BUILD/logs/$t.fuzz.log" 2>&1 || rc=$?
  echo "$rc" >"$BUILD/logs/$t.rc"
}

running=0
for t in $TARGETS; do
  rm -f "$BUILD/logs/$t.rc"
  fuzz_one "$t" &
  running=$((running + 1))
  if ((running >= JOBS)); then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
for t in $TARGETS; do
  rc=$(cat "$BUILD/logs/$t.rc" 2>/dev/null || echo missing)
  log="$BUILD/logs/$t.fuzz.log"
  # Every seed must have been read (libFuzzer skips a listed file it cannot open and says nothing of it).
  want=$(find "$ROOT/fuzz/corpus/$t" -maxdepth 1 -type f | wc -l)
  got=$(grep -oE 'seed corpus: files: [0-9]+' "$log" | awk '{print $4}' || true)
  if [[ "$rc" == 0 && "$got" != "$want" ]]; then
    echo "fuzz    $t: FAILED: libFuzzer read ${got:-no} seeds of fuzz/corpus/$t's $want (log: $log)"
    fail=1
  elif [[ "$rc" == 0 ]]; then
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1)
    echo "fuzz    $t: ok, ${runs:-?} runs ($BUDGET_TEXT), ${cov:-cov: ?}"
  else
    echo "fuzz    $t: FAILED with status $rc (log: $log; crash inputs: $BUILD/artifacts/$t-*)"
    grep -E 'ERROR|SUMMARY|property violated|runtime error|terminate' "$log" | head -n 10 || true
    tail -n 40 "$log"
    fail=1
  fi
done
exit $fail
