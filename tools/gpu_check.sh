#!/usr/bin/env bash
# For the first machine with a GPU: builds the real CUDA build (nvcc, sm_80 + sm_90, the real
# libcudart / libcublasLt / libnccl), runs the kernel coverage, every [cuda] op and model test on
# the GPU (a skip is a failure here), the PyTorch reference with --device cuda, the recorded
# BERT-Base / Large steps with their measured times beside the performance model's predictions,
# the whole suite, and the benchmarks, and writes everything to one log:
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

step "kernel coverage"
"$BUILD_DIR/bin/kernel_coverage" || status=1

for t in engine_cuda_tests engine_cuda_model_tests; do
  step "$t on the GPU (op parity; whole-model parity in f32 / bf16 / fp16, resume, host reads)"
  out="$("$BUILD_DIR/bin/$t" 2>&1)"; rc=$?
  echo "$out"
  if [ $rc -eq 77 ]; then echo "gpu_check: $t skipped: the build sees no GPU" >&2; status=1
  elif [ $rc -ne 0 ]; then status=1; fi
done

step "the PyTorch reference on the GPU (pretrain_app --device cuda)"
for preset in tupe_r tupe_a bert_a bert_r; do
  /usr/bin/python3 "$ROOT/tools/reference/check_model.py" --app "$BUILD_DIR/bin/pretrain_app" \
    --preset "$preset" --device cuda --workdir "$BUILD_DIR/gpu_check/ref_$preset" || status=1
done
# Train mode: the device's dropout masks against the reference's Philox stream, bit for bit.
/usr/bin/python3 "$ROOT/tools/reference/check_model.py" --app "$BUILD_DIR/bin/pretrain_app" \
  --preset tupe_r --dropout --micro-batches 2 --device cuda \
  --workdir "$BUILD_DIR/gpu_check/ref_tupe_r_dropout" || status=1

if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && [ -x "$BUILD_DIR/bin/dist_cuda_tests" ]; then
  step "data parallel on 2 GPUs: NCCL collectives, pretrain_app --device cuda under mpirun"
  mpirun -np 2 "$BUILD_DIR/bin/dist_cuda_tests" || status=1
  /usr/bin/python3 "$ROOT/tests/apps/check_distributed_training.py" mpirun "$BUILD_DIR/bin/pretrain_app" \
    "$BUILD_DIR/gpu_check/dist_pretrain" --device cuda || status=1
else
  echo "gpu_check: fewer than 2 GPUs: the data-parallel GPU checks are not run" >&2
fi

step "recorded steps: measured time beside the model's prediction (docs/performance-model.md)"
mkdir -p "$BUILD_DIR/gpu_check"
for cfg in "bert_base_tupe_r 128" "bert_base_bert_a 128" "bert_large_tupe_r 512" "bert_large_bert_a 512"; do
  read -r name seq <<<"$cfg"
  "$BUILD_DIR/bin/record_step" --config "$ROOT/configs/$name.yaml" --batch-size 32 --seq-len "$seq" \
    --out "$BUILD_DIR/gpu_check/${name}_s$seq.csv" || status=1
  /usr/bin/python3 "$ROOT/tools/perf_model.py" "$BUILD_DIR/gpu_check/${name}_s$seq.csv" --batch 32 \
    --label "$name s$seq (predicted)" --top 0 || status=1
done

step "the whole suite"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" || status=1

step "benchmarks"
for b in bench_ops bench_comm; do
  [ -x "$BUILD_DIR/bin/$b" ] && { "$BUILD_DIR/bin/$b" || status=1; }
done

step "done: exit $status, log $LOG"
exit $status
