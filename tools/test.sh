#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, and runs the whole
# CTest suite, then the emulation build's (tools/emu_test.sh). Exits non-zero on any failure.
# In build/, [cuda] tests report "Skipped" without a GPU; in build-emu* they run emulated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
# Python and Debian's PyTorch run the reference tests (tools/reference/: the BERT model checked
# against an independent PyTorch implementation) and the pretrain_app command-line tests;
# clang-format checks the sources against .clang-format.
EXTRA_PACKAGES="python3 python3-numpy python3-torch clang-format ${EXTRA_PACKAGES:-}" "$ROOT/tools/setup.sh"
"$ROOT/tools/check_format.sh"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/, no CUDA
# backend; the MPI tests with 2 ranks). ASAN_SUITE=0 skips it.
if [ "${ASAN_SUITE:-1}" != 0 ]; then
  "$ROOT/tools/asan_test.sh"
fi
# The CUDA backend on the SIMT emulator (docs/cuda.md): build-emu/ in three fiber orders, then the
# cuda tests under ThreadSanitizer and AddressSanitizer. EMU_VARIANTS narrows it (e.g. "plain").
# shellcheck disable=SC2086
"$ROOT/tools/emu_test.sh" ${EMU_VARIANTS:-plain tsan asan}
# Every parser's libFuzzer target, briefly (build-fuzz/, clang; docs/fuzzing.md has the long
# run): FUZZ_CI_SECONDS per target, default 10; 0 skips.
if [ "${FUZZ_CI_SECONDS:-10}" != 0 ]; then
  "$ROOT/tools/fuzz.sh" "${FUZZ_CI_SECONDS:-10}"
fi
