#!/usr/bin/env bash
# On a lent GPU machine (../shared/device/README.md), from the repository root, with the pack that
# tools/gpu/pack.sh made here:  tools/gpu/gpu_check.sh .gpu/pack.tar.xz [OUT_DIR]
# (OUT_DIR defaults to $OUT, the device tool's returned folder, else gpu_check_out/). In order:
#   1. the machine (nvidia-smi), the kernel coverage, the cuda op tests and model tests on the GPU;
#   2. the PyTorch reference of the model on the GPU (pretrain_app --device cuda: f32 presets and
#      the dropout masks);
#   3. compute-sanitizer memcheck over the op tests and racecheck over the kernels with shared
#      memory;
#   4. the engine's bf16 step, B = 32, dropout on: BERT-Base s128 and BERT-Large s512, TUPE-R and
#      BERT-A (pretrain_app --batch-file --time), beside PyTorch + HF BERT eager (full and
#      masked-only head) and torch.compile on the same GPU;
#   5. ncu over a recorded step of BERT-Base TUPE-R (and Large with GPU_CHECK_NCU="base large"):
#      every kernel's time beside the performance model's prediction (tools/perf_model.py);
#   6. the side-by-side table, printed last (tools/gpu/summary.py).
# Each stage has a time limit and a log in OUT_DIR; a failing stage does not stop the others; the
# exit status is non-zero if any failed. GPU_CHECK_SKIP="sanitizer ncu compile reference ..."
# leaves stages out (names as in OUT_DIR/status.txt). Sized for ~6 minutes on an H200.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PACK="${1:-$ROOT/.gpu/pack.tar.xz}"
OUTDIR="${2:-${OUT:-$ROOT/gpu_check_out}}"
SKIP=" ${GPU_CHECK_SKIP:-} "
mkdir -p "$OUTDIR"
: > "$OUTDIR/status.txt"
[ -f "$PACK" ] || { echo "gpu_check: no pack at $PACK (make it with tools/gpu/pack.sh)" >&2; exit 2; }
WORK="$(mktemp -d)"
tar -xJf "$PACK" -C "$WORK" || { echo "gpu_check: cannot unpack $PACK" >&2; exit 2; }
P="$WORK/pack"
NCCL_LIB="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)"
ENGINE_LD="$P/lib:$P/deps:/usr/local/cuda/lib64${NCCL_LIB:+:$NCCL_LIB}"
# The engine's programs with their libraries; python keeps its own (it loads torch's CUDA).
for prog in "$P"/bin/*; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$ENGINE_LD" "$prog" > "$prog.sh"
  chmod +x "$prog.sh"
done
B="$P/bin"
status=0
stage() {  # name, limit (s), command...: log in OUTDIR/name.log, a line in status.txt
  local name="$1" limit="$2" t0 rc
  shift 2
  if [[ "$SKIP" == *" $name "* ]]; then echo "$name skipped 0" >> "$OUTDIR/status.txt"; return; fi
  echo "=== $name ($(date +%T))"
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUTDIR/$name.log" 2>&1
  rc=$?
  echo "$name $rc $(($(date +%s) - t0))" >> "$OUTDIR/status.txt"
  [ $rc -eq 0 ] || { status=1; tail -5 "$OUTDIR/$name.log"; }
}
cd "$ROOT"
echo "gpu_check: pack of $(cat "$P/commit.txt"), output in $OUTDIR"
stage machine 30 nvidia-smi
stage coverage 30 "$B/kernel_coverage.sh"
stage cuda_tests 120 "$B/engine_cuda_tests.sh"
stage cuda_models 120 "$B/engine_cuda_model_tests.sh"
ref() {
  for preset in tupe_r bert_a; do
    python3 tools/reference/check_model.py --app "$B/pretrain_app.sh" --preset "$preset" \
      --device cuda --workdir "$WORK/ref_$preset" || return 1
  done
  python3 tools/reference/check_model.py --app "$B/pretrain_app.sh" --preset tupe_r --dropout \
    --micro-batches 2 --device cuda --workdir "$WORK/ref_dropout"
}
stage reference 120 ref
stage sanitizer 150 sh -c "compute-sanitizer --tool memcheck --leak-check no '$B/engine_cuda_tests.sh' \
  '~*allocator*' && compute-sanitizer --tool racecheck '$B/engine_cuda_tests.sh' \
  '*sum_to*,*layer_norm*,*softmax*,*embedding*,*kernel helpers*,*block_*'"
steps() {
  for cfg in "bert_base_tupe_r 128" "bert_base_bert_a 128" "bert_large_tupe_r 512" "bert_large_bert_a 512"; do
    set -- $cfg
    python3 tools/gpu/make_batch.py "$WORK/batch_$2.safetensors" --batch 32 --seq "$2" || return 1
    echo "== $1"
    "$B/pretrain_app.sh" --config "configs/$1.yaml" --batch-file "$WORK/batch_$2.safetensors" \
      --steps 12 --time --dropout --device cuda --set train.precision=bf16 || return 1
  done
}
stage steps 150 steps
hf_models="base128 large512"
[[ "$SKIP" == *" compile "* ]] || hf_models="$hf_models base128c"
stage hf 200 python3 tools/gpu/hf_bench.py $hf_models
ncu_step() {
  for size in ${GPU_CHECK_NCU:-base}; do
    if [ "$size" = base ]; then cfg=bert_base_tupe_r seq=128; else cfg=bert_large_tupe_r seq=512; fi
    ncu --metrics gpu__time_duration.sum --csv --clock-control none --log-file "$OUTDIR/ncu_$size.csv" \
      "$B/record_step.sh" --config "configs/$cfg.yaml" --batch-size 32 --seq-len "$seq" \
      --out "$OUTDIR/record_$size.csv" || return 1
    xz -9f "$OUTDIR/ncu_$size.csv"
  done
}
stage ncu 180 ncu_step
echo "$(date +%T) done" >> "$OUTDIR/status.txt"
python3 tools/gpu/summary.py "$OUTDIR" | tee "$OUTDIR/summary.md"
exit $status
