#!/usr/bin/env bash
# libFuzzer over every parser of outside input (tests/fuzz/, docs/fuzzing.md): installs clang and
# libFuzzer when missing, builds the targets into build-fuzz/ (clang, AddressSanitizer +
# UndefinedBehaviorSanitizer, every report fatal, -O1 with line tables as libFuzzer's docs build
# it; only the parser sources, not the ops or apps),
# then runs each target from its seeds (tests/fuzz/seeds/<target>/, plus the corpus earlier runs
# grew in build-fuzz/corpus/<target>/) with its dictionary, and prints per target: executions,
# executions/s, coverage, corpus size and findings.
#
# Usage: tools/fuzz.sh [SECONDS] [TARGET ...]   (default 60 s per target, every target)
# Environment:
#   FUZZ_RUNS=N       run each target for N executions instead of SECONDS (the long run:
#                     FUZZ_RUNS=1000000)
#   FUZZ_SECONDS=S    the same as the SECONDS argument
#   FUZZ_BUILD_DIR    default build-fuzz
#   FUZZ_TIMEOUT      seconds one input may take before it is a finding (default 10)
#   FUZZ_RSS_MB       memory limit, also per allocation (default 2048)
#   FUZZ_NO_BUILD=1   run what build-fuzz/bin holds without configuring and building
#   FUZZ_JOBS=N       targets run at a time (default: the number of cores)
#   FUZZ_OPT          the optimisation flag (default -O1; tools/test.sh's short run: -O0, which
#                     clang compiles in about half the time: the CPU backend 44 -> 11 s)
# A finding (crash, sanitizer report, uncaught exception, timeout, out-of-memory, leak) leaves its
# input as build-fuzz/findings/<target>/crash-* (or timeout-*, oom-*, leak-*), prints libFuzzer's
# report from build-fuzz/logs/<target>.log, and makes the script exit non-zero after the others
# ran. Reproduce one with: build-fuzz/bin/fuzz_<target> build-fuzz/findings/<target>/crash-...
# Fixed findings get a regression input under tests/fuzz/regressions/<target>/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_PER_TARGET="${FUZZ_SECONDS:-60}"
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
  SECONDS_PER_TARGET="$1"
  shift
fi
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
TIMEOUT="${FUZZ_TIMEOUT:-10}"
RSS_MB="${FUZZ_RSS_MB:-2048}"
ALL_TARGETS=(safetensors npy config checkpoint_config hf_config glue squad corpus_text corpus_meta
             wordpiece sentencepiece)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")

# What the fuzz tree needs besides tools/setup.sh's packages: clang, its libFuzzer and sanitizer
# runtimes, and LLVM's OpenMP runtime (the CMake configuration finds OpenMP for every library).
PACKAGES=(clang libclang-rt-14-dev libomp-14-dev cmake ninja-build libeigen3-dev libyaml-cpp-dev
          nlohmann-json3-dev libsentencepiece-dev libicu-dev liblzma-dev zlib1g-dev pkg-config
          libpng-dev libstb-dev)
# shellcheck source=tools/packages.sh
source "$ROOT/tools/packages.sh"

if [ "${FUZZ_NO_BUILD:-0}" != 1 ]; then
  install_packages fuzz "${PACKAGES[@]}"
  start=$(date +%s)
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="${FUZZ_OPT:--O1} -gline-tables-only" -DENGINE_FUZZ=ON \
    -DENGINE_BUILD_TESTS=OFF -DENGINE_CUDA=OFF -DENGINE_MPI=OFF >/dev/null
  cmake --build "$BUILD" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
  echo "fuzz: built ${#targets[@]} targets in $(($(date +%s) - start)) s"
fi

if [ -n "${FUZZ_RUNS:-}" ]; then
  limit=(-runs="$FUZZ_RUNS")
  what="$FUZZ_RUNS executions"
else
  limit=(-max_total_time="$SECONDS_PER_TARGET")
  what="${SECONDS_PER_TARGET} s"
fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

# One target: its row of the table (and the report's head after a finding) in $BUILD/logs/<t>.row;
# "FINDING" in that file marks a failed target.
run_target() {
  local t="$1"
  local bin="$BUILD/bin/fuzz_$t"
  local corpus="$BUILD/corpus/$t" findings="$BUILD/findings/$t" log="$BUILD/logs/$t.log"
  local row="$BUILD/logs/$t.row"
  mkdir -p "$corpus" "$findings"
  local before t0 rc secs execs rate last cov ft corp new result
  before=$(find "$findings" -type f | wc -l)
  t0=$(date +%s)
  rc=0
  # New inputs go to the first directory (the working corpus); the seeds are only read.
  "$bin" "$corpus" "$ROOT/tests/fuzz/seeds/$t" -dict="$ROOT/tests/fuzz/dicts/$t.dict" \
    "${limit[@]}" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB" -malloc_limit_mb="$RSS_MB" \
    -artifact_prefix="$findings/" -print_final_stats=1 -close_fd_mask=1 >"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - t0))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9]*[a-zA-Z]*\).*/\1/p' <<<"$last")
  new=$(($(find "$findings" -type f | wc -l) - before))
  if [ "$rc" -ne 0 ] || [ "$new" -gt 0 ]; then
    result="FINDING (exit $rc; $findings)"
  else
    result="none"
  fi
  {
    printf '%-18s %12s %9s %7s %7s %8s  %s (%d s)\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" \
      "${ft:-?}" "${corp:-?}" "$result" "$secs"
    if [ "$result" != none ]; then
      # The report's head (what failed, the top frames) and where the input went; the whole
      # report is in the log.
      echo "---- $log ----"
      grep -m1 -B3 -A14 -E "ERROR: |runtime error|terminate called" "$log" || tail -20 "$log"
      grep -E "^(artifact_prefix|SUMMARY)" "$log" || true
      echo "----"
    fi
  } >"$row"
}

# The targets run FUZZ_JOBS at a time (default: one per core), each on its own core for its time.
JOBS="${FUZZ_JOBS:-$(nproc)}"
mkdir -p "$BUILD/logs"
for t in "${targets[@]}"; do
  [ -x "$BUILD/bin/fuzz_$t" ] || { echo "fuzz: $BUILD/bin/fuzz_$t is missing (build it, or drop FUZZ_NO_BUILD)" >&2; exit 1; }
  rm -f "$BUILD/logs/$t.row"
done
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
  run_target "$t" &
done
wait
failed=()
printf '%-18s %12s %9s %7s %7s %8s  %s\n' target executions exec/s cov ft corpus findings
for t in "${targets[@]}"; do
  row="$BUILD/logs/$t.row"
  if [ ! -s "$row" ]; then
    echo "fuzz: $t left no result (see $BUILD/logs/$t.log)" >&2
    failed+=("$t")
    continue
  fi
  cat "$row"
  grep -q "FINDING" "$row" && failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} ($what per target); inputs under $BUILD/findings/" >&2
  exit 1
fi
echo "fuzz: no findings in ${#targets[@]} targets ($what each)"
