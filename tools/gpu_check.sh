#!/usr/bin/env bash
# For the first machine with a GPU: builds the real CUDA build (nvcc, sm_80 + sm_90, the real
# libcudart / libcublasLt / libnccl), runs every [cuda] test on the GPU (a skip is a failure
# here), the whole suite, and the benchmarks, and writes everything to one log:
#   tools/gpu_check.sh [LOG]      (default gpu_check_<host>_<date>.log in the current directory)
# Nothing in this project has been run on a GPU yet; until this script has been, every CUDA
# claim in the docs is "verified in emulation" (tools/emu_test.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOG="${1:-$PWD/gpu_check_$(hostname)_$(date +%Y%m%d_%H%M%S).log}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
exec > >(tee "$LOG") 2>&1
status=0
step() { echo; echo "=== $* ($(date -Is))"; }

step "machine"
nvidia-smi || { echo "gpu_check: nvidia-smi failed: no usable GPU here" >&2; exit 1; }
/usr/local/cuda/bin/nvcc --version
git -C "$ROOT" log -1 --oneline

step "build (nvcc, sm_80 and sm_90)"
CMAKE_ARGS="-DENGINE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=80;90 ${CMAKE_ARGS:-}" BUILD_DIR="$BUILD_DIR" \
  "$ROOT/tools/setup.sh" || exit 1

step "[cuda] tests on the GPU"
out="$("$BUILD_DIR/bin/engine_cuda_tests" 2>&1)"; rc=$?
echo "$out"
if [ $rc -eq 77 ]; then echo "gpu_check: the [cuda] tests skipped: the build sees no GPU" >&2; status=1
elif [ $rc -ne 0 ]; then status=1; fi

step "the whole suite"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" || status=1

step "benchmarks"
for b in bench_ops bench_comm; do
  [ -x "$BUILD_DIR/bin/$b" ] && { "$BUILD_DIR/bin/$b" || status=1; }
done

step "done: exit $status, log $LOG"
exit $status
