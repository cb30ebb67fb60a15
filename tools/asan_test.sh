#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (run by tools/test.sh
# after the real build's suite). build-asan/ is the whole project without the CUDA backend
# (ENGINE_CUDA=OFF; the CUDA code is sanitised in build-emu-asan/, tools/emu_test.sh), compiled
# -O1 -g1 (about half the compile time of -O2 -g, tests ~2x slower than Release; the test sources
# and models/ and apps/, whose work is libengine's, at -O0: a third less compile time) with
# -fsanitize=address,undefined and -fno-sanitize-recover=all; the test sources themselves under
# ASan only (UBSan's null and alignment checks on every access at -O0 took a test source 15 ->
# 25 s to compile; UBSan checks the libraries and apps the tests drive). Every CTest of that
# build runs: the unit and gradient checks, the PyTorch reference checks (on the subset of cases
# that has every preset and option once; the Release suite runs all), the app tests (whose Python
# drivers start the sanitised binaries) and the MPI tests under mpirun -np 2.
#
# A finding fails the run even inside a process whose failure a test expects (a bad-input test
# passes on any non-zero exit): every AddressSanitizer / LeakSanitizer report goes to
# build-asan/sanitizer-logs/ (log_path) and the script fails when one is there, printing it.
# UBSan (whose runtime in GCC 12 ignores log_path) stops the process at the first finding
# (-fno-sanitize-recover) and the script fails on any "runtime error:" in the tests' output
# (Testing/Temporary/LastTest.log) besides the probe's own. Leaks are checked (LeakSanitizer) except in
# the mpirun tests, whose Open MPI libraries keep allocations LeakSanitizer cannot attribute
# (tests/CMakeLists.txt). Allocation failures return null (allocator_may_return_null), as malloc
# does, so the engine's own "cannot allocate" errors are what the tests see.
#
# Three tests run only in the Release suite: golden_numerics (the Release build's numbers bit for
# bit; -O1 code rounds differently), the corpus preparation's resident-memory bound (ASan's
# shadow memory and quarantine are resident too) and miniature_tool (a Python driver of
# pretrain_app and finetune_app sweeps, 54 s here: the apps' own tests run here, the driver's
# logic does not change under a sanitizer).
#
# engine/cpu/gemm.cpp is compiled without UBSan (ENGINE_GEMM_SOURCE_FLAGS; ASan stays): its
# checks inside Eigen's product templates doubled the file's compile, 71 -> 35 s; the products
# are checked against references in every build.
#
# The parsers of outside input (configs, safetensors, .npy, corpora, GLUE, SQuAD, the tokenizers;
# ENGINE_PARSER_SOURCE_FLAGS in CMakeLists.txt) are compiled without UBSan too (ASan stays): each
# is a libFuzzer target's under ASan + UBSan (tools/fuzz.sh, the last stage of tools/test.sh),
# which reaches the same code with far more inputs; UBSan there cost ~40% of their compile here
# (safetensors.cpp 40 -> 25 s, npy.cpp 20 -> 12 s, config.cpp 12 -> 7 s).
#
# Usage: tools/asan_test.sh [ctest arguments...]   e.g. tools/asan_test.sh -R safetensors
# Environment: ASAN_BUILD_DIR (default build-asan). Binaries in build-asan/bin/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${ASAN_BUILD_DIR:-$ROOT/build-asan}"
JOBS="$(nproc)"
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# GCC 12 at -O1 under ASan warns about uninitialised lanes inside its own AVX-512 intrinsics
# headers (Eigen's packet code); the Release build does not.
WARN="-Wno-maybe-uninitialized -Wno-uninitialized"

cmake -S "$ROOT" -B "$DIR" -G Ninja -DENGINE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DENGINE_TEST_CXX_FLAGS="-O0 -fno-sanitize=undefined" \
  -DENGINE_APP_CXX_FLAGS="-O0" -DENGINE_GEMM_SOURCE_FLAGS="-fno-sanitize=undefined" \
  -DENGINE_PARSER_SOURCE_FLAGS="-fno-sanitize=undefined" \
  -DENGINE_REFERENCE_SUBSET=ON -DCMAKE_CXX_FLAGS="$FLAGS $WARN" \
  -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" >/dev/null
cmake --build "$DIR" -j "$JOBS"

LOGS="$DIR/sanitizer-logs"
rm -rf "$LOGS"
mkdir -p "$LOGS"
status=0
RELEASE_ONLY='^golden_numerics$|^a 50 MB input prepares in bounded memory$|^miniature_tool$|^scaling_model$'
ASAN_OPTIONS="log_path=$LOGS/asan:detect_leaks=1:allocator_may_return_null=1:check_initialization_order=1:strict_string_checks=1" \
  UBSAN_OPTIONS="log_path=$LOGS/ubsan:print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir "$DIR" --output-on-failure -j "$JOBS" -E "$RELEASE_ONLY" "$@" || status=$?

# A log holds a finding ("ERROR: AddressSanitizer/LeakSanitizer", UBSan's "runtime error:"), or
# only a warning (a refused oversized allocation that the engine then reports itself).
mapfile -t reports < <(grep -lE "ERROR: |runtime error:" "$LOGS"/* 2>/dev/null || true)
if [ ${#reports[@]} -gt 0 ]; then
  echo "asan_test: ${#reports[@]} sanitizer report(s) in $LOGS:" >&2
  for r in "${reports[@]}"; do
    echo "---- $r" >&2
    head -n 60 "$r" >&2
  done
  exit 1
fi
ub="$(grep -hE ":[0-9]+(:[0-9]+)?: runtime error:" "$DIR/Testing/Temporary/LastTest.log" 2>/dev/null |
  grep -v "tests/sanitizer/cpu_probe.cpp" || true)"
if [ -n "$ub" ]; then
  echo "asan_test: UndefinedBehaviorSanitizer reports in the tests' output:" >&2
  echo "$ub" | head -n 40 >&2
  exit 1
fi
[ "$status" -eq 0 ] || exit "$status"
echo "asan_test: the suite passed under AddressSanitizer + UndefinedBehaviorSanitizer, no reports"
