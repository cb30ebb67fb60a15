#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, and runs the whole
# CTest suite, then the sanitizer builds', the emulation build's (tools/emu_test.sh) and the fuzz
# targets. Exits non-zero on any failure; prints each stage's time at the end (CI's budget is 45
# minutes on a 2-core machine). In build/, [cuda] tests report "Skipped" without a GPU; in
# build-emu* they run emulated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
# ctest runs a test per core and each test's OpenMP threads would otherwise spin while they wait
# (libgomp's default), taking the core from the other test: the Catch2 suites ran 55 s -> 41 s on
# 2 cores with passive waiting. (The apps set a short spin of their own unless this is set.)
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

timings=()
stage() {  # name, command...: runs the command, records its time
  local name="$1" t0
  shift
  t0=$(date +%s)
  "$@"
  timings+=("$(printf '%-34s %5d s' "$name" $(($(date +%s) - t0)))")
}

# Python and Debian's PyTorch run the reference tests (tools/reference/: the BERT model checked
# against an independent PyTorch implementation) and the pretrain_app command-line tests;
# clang-format checks the sources against .clang-format. The test binaries' own sources compile
# at -O1 (ENGINE_TEST_CXX_FLAGS; the libraries and apps they test stay at -O3): 313 compile
# seconds of the build's 875 against 350 of 851 at -O3 (little: their cost is parsing, not -O3).
# Without a GPU the nvcc build's device code is a compile check: it is compiled for one virtual
# architecture, compute_80 (Ampere, the oldest the project builds for; the sources have no
# per-architecture paths, so what compiles there compiles for sm_90), as PTX only, not the
# default 80;90 machine code: nvcc's front end and code generation check every kernel, and ptxas
# (what turns PTX into one GPU's code, a driver would do it at load) is skipped: softmax.cu
# 47 -> 27 s, the build's .cu files about 300 -> 175 s of compile CPU. With a GPU (nvidia-smi lists
# one) the default stands; CMAKE_ARGS can set it either way.
CUDA_ARCH_ARG="-DCMAKE_CUDA_ARCHITECTURES=80-virtual"
if nvidia-smi -L >/dev/null 2>&1; then CUDA_ARCH_ARG=""; fi
stage "setup + Release build (build/)" \
  env EXTRA_PACKAGES="python3 python3-numpy python3-torch clang-format ${EXTRA_PACKAGES:-}" \
  CMAKE_ARGS="-DENGINE_TEST_CXX_FLAGS=-O1 $CUDA_ARCH_ARG ${CMAKE_ARGS:-}" "$ROOT/tools/setup.sh"
stage "format check" "$ROOT/tools/check_format.sh"
stage "Release suite" ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, no CUDA
# backend; the MPI tests with 2 ranks). ASAN_SUITE=0 skips it.
if [ "${ASAN_SUITE:-1}" != 0 ]; then
  stage "ASan + UBSan build and suite" "$ROOT/tools/asan_test.sh"
fi
# The CUDA backend on the SIMT emulator (docs/cuda.md): build-emu/ in three fiber orders, then the
# cuda tests under ThreadSanitizer and AddressSanitizer. EMU_VARIANTS narrows it (e.g. "plain").
for v in ${EMU_VARIANTS:-plain tsan asan}; do
  stage "emulation ($v) build and suite" "$ROOT/tools/emu_test.sh" "$v"
done
# Every parser's libFuzzer target, briefly (build-fuzz/, clang; docs/fuzzing.md has the long
# run): FUZZ_CI_SECONDS per target, default 10; 0 skips. Built at -O0 (FUZZ_OPT): half the
# compile time of -O1, for fewer executions in the short run.
if [ "${FUZZ_CI_SECONDS:-10}" != 0 ]; then
  stage "fuzz build and run" env FUZZ_OPT="${FUZZ_OPT:--O0}" "$ROOT/tools/fuzz.sh" \
    "${FUZZ_CI_SECONDS:-10}"
fi
echo "test.sh: every stage passed; times:"
printf '  %s\n' "${timings[@]}"
