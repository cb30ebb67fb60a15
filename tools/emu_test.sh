#!/usr/bin/env bash
# The CUDA backend on the SIMT emulator (run by tools/test.sh after the real build's suite):
#   build-emu/       the emulation build: the [cuda] tests in forward, reverse and random fiber
#                    order and the emulator's own tests (CTest labels cuda, emulator); only the
#                    programs those run are built (target emulation_tests; `cmake --build
#                    build-emu` builds the benchmarks and the other apps too);
#   build-emu-tsan/  the same kernels and tests under ThreadSanitizer (fiber-aware: a shared-memory
#                    race between threads of a block is reported; not the mpirun tests: MPI is not
#                    instrumented);
#   build-emu-asan/  and under AddressSanitizer (out-of-bounds global and shared accesses).
# Usage: tools/emu_test.sh [plain|tsan|asan ...]   (default: all three). Exits non-zero on any
# failure. Binaries in build-emu*/bin/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="$(nproc)"
variants=("$@")
[ ${#variants[@]} -eq 0 ] && variants=(plain tsan asan)

# dir, optimisation flags, the test sources' own (ENGINE_TEST_CXX_FLAGS), libengine's C++ sources'
# own (ENGINE_CPU_SOURCE_FLAGS), models/ and the apps' own (ENGINE_APP_CXX_FLAGS), extra flags,
# [targets...] (default: all)
configure_and_build() {
  local dir="$1" opt="$2" test_opt="$3" cpu_opt="$4" app_opt="$5" flags="$6"
  shift 6
  cmake -S "$ROOT" -B "$dir" -G Ninja -DENGINE_CUDA_EMULATE=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="$opt" -DENGINE_TEST_CXX_FLAGS="$test_opt" \
    -DENGINE_CPU_SOURCE_FLAGS="$cpu_opt" -DENGINE_APP_CXX_FLAGS="$app_opt" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  if [ $# -gt 0 ]; then
    cmake --build "$dir" -j "$JOBS" --target "$@"
  else
    cmake --build "$dir" -j "$JOBS"
  fi
}
# The sanitiser builds compile at -O1 -g1 (line numbers in the reports): about half the compile
# time of -O2 -g, and the kernel tests ran as fast (ASan) or nearly (TSan); the test sources at
# -O0 (they call the ops; the kernels and the emulator are the libraries'). They run the kernel
# tests: the op kernels against the CPU, the kernel coverage and the sanitiser probes (not the
# whole-model, reference and mpirun tests, which build-emu runs).
SAN_TARGETS=(engine_cuda_tests kernel_coverage sanitizer_probe)
SAN_EXCLUDE="dist|models|reference"

for v in "${variants[@]}"; do
  case "$v" in
    plain)
      # models/ and the apps at -O1 (their work is libengine's kernels, at -O3): finetune_tasks.cpp
      # 17.5 -> 12.6 s of compile.
      configure_and_build "$ROOT/build-emu" "-O3 -DNDEBUG" "" "" "-O1" "" emulation_tests
      ctest --test-dir "$ROOT/build-emu" --output-on-failure -j "$JOBS"
      ;;
    tsan)
      # libgomp is not instrumented: the CPU reference runs on one OpenMP thread here. libengine's
      # C++ sources (the CPU reference, the host side of the ops) are not instrumented either: the
      # races looked for are the kernels' and the emulator's, between the fibers of a block.
      configure_and_build "$ROOT/build-emu-tsan" "-O1 -g1" "-O0" "-fno-sanitize=thread" "" \
        "-fsanitize=thread" \
        "${SAN_TARGETS[@]}"
      OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
        ctest --test-dir "$ROOT/build-emu-tsan" --output-on-failure -j "$JOBS" -L "cuda|sanitizer" \
        -LE "$SAN_EXCLUDE" -E "_reverse|_random"
      ;;
    asan)
      # libengine's C++ sources (the CPU backend, the host side of the ops) without ASan: they
      # are sanitised in build-asan/ (tools/asan_test.sh); here it looks for the kernels' and the
      # emulator's bad accesses (252 -> 149 s of compile CPU).
      configure_and_build "$ROOT/build-emu-asan" "-O1 -g1" "-O0" "-fno-sanitize=address" "" \
        "-fsanitize=address -fno-omit-frame-pointer" "${SAN_TARGETS[@]}"
      ASAN_OPTIONS="detect_leaks=0" \
        ctest --test-dir "$ROOT/build-emu-asan" --output-on-failure -j "$JOBS" -L "cuda|sanitizer" \
        -LE "$SAN_EXCLUDE" -E "_reverse|_random"
      ;;
    *)
      echo "emu_test: unknown variant '$v' (plain, tsan, asan)" >&2
      exit 2
      ;;
  esac
done
