#!/usr/bin/env bash
# On a lent GPU machine (../shared/device/README.md), from the repository root, with the pack that
# tools/gpu/pack.sh made here:  tools/gpu/gpu_check.sh .gpu/pack.tar.xz [OUT_DIR]
# (OUT_DIR defaults to $OUT, the device tool's returned folder, else gpu_check_out/). By priority:
#   1. the machine (nvidia-smi);
#   2. the engine's bf16 step, B = 32, dropout on: BERT-Base s128 and BERT-Large s512, TUPE-R and
#      BERT-A (pretrain_app --batch-file --time), each eager and as one captured CUDA graph
#      (train.cuda_graph), then PyTorch + HF BERT eager (full and masked-only head) and
#      torch.compile on the same GPU;
#   3. the cuda op tests and model tests on the GPU; the PyTorch reference of the model against
#      pretrain_app --device cuda (every preset and option once, dropout masks bit for bit, and
#      ELECTRA);
#   4. ncu over a recorded step of BERT-Base TUPE-R and BERT-Large TUPE-R: every kernel's time
#      beside the performance model's prediction (bench/perf_model.py);
#   5. compute-sanitizer memcheck over the op tests and racecheck over the kernels with shared
#      memory; the kernel coverage;
#   6. the side-by-side table, printed last (tools/gpu/summary.py).
# Each stage has a time limit, cut to what is left of GPU_CHECK_BUDGET seconds (default 480: the
# whole run fits a device call with time to spare), and a log; a failing stage does not stop the
# others; the exit status is non-zero if any failed. The device tool brings back at most 8 files,
# so the logs travel as OUT_DIR/logs.tar (re-packed after every stage: a run cut short still
# returns what finished), beside OUT_DIR/summary.md. GPU_CHECK_SKIP="sanitizer ncu_large compile
# ..." leaves stages out (names as in status.txt).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PACK="${1:-$ROOT/.gpu/pack.tar.xz}"
OUTDIR="${2:-${OUT:-$ROOT/gpu_check_out}}"
SKIP=" ${GPU_CHECK_SKIP:-} "
DEADLINE=$(($(date +%s) + ${GPU_CHECK_BUDGET:-480}))
mkdir -p "$OUTDIR"
[ -f "$PACK" ] || { echo "gpu_check: no pack at $PACK (make it with tools/gpu/pack.sh)" >&2; exit 2; }
WORK="$(mktemp -d)"
LOGS="$WORK/logs"
mkdir -p "$LOGS"
: > "$LOGS/status.txt"
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
pack_logs() { tar -C "$WORK" -cf "$OUTDIR/logs.tar.part" logs && mv "$OUTDIR/logs.tar.part" "$OUTDIR/logs.tar"; }
stage() {  # name, limit (s), command...: log in logs/name.log, a line "name rc seconds" in status.txt
  local name="$1" limit="$2" t0 rc left
  shift 2
  if [[ "$SKIP" == *" $name "* ]]; then echo "$name skipped 0" >> "$LOGS/status.txt"; return; fi
  left=$((DEADLINE - $(date +%s) - 15))  # 15 s kept for the summary
  if [ "$left" -lt 10 ]; then echo "$name no_time 0" >> "$LOGS/status.txt"; return; fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "=== $name ($(date +%T), limit ${limit} s)"
  t0=$(date +%s)
  # bash -c: the command may be one of the functions below (exported with the variables they read)
  timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  echo "$name $rc $(($(date +%s) - t0))" >> "$LOGS/status.txt"
  [ $rc -eq 0 ] || { status=1; tail -5 "$LOGS/$name.log"; }
  pack_logs
}
cd "$ROOT"
echo "gpu_check: pack of $(cat "$P/commit.txt"), output in $OUTDIR"
cp "$P/commit.txt" "$LOGS/"
export PATH="$PATH:/usr/local/cuda/bin"  # ncu, compute-sanitizer
stage machine 20 sh -c "nvidia-smi; grep -m1 'model name' /proc/cpuinfo; nproc"
steps() {
  for cfg in "bert_base_tupe_r 128" "bert_base_bert_a 128" "bert_large_tupe_r 512" "bert_large_bert_a 512"; do
    set -- $cfg
    [ -f "$WORK/batch_$2.safetensors" ] ||
      python3 tools/gpu/make_batch.py "$WORK/batch_$2.safetensors" --batch 32 --seq "$2" || return 1
    echo "== $1"
    "$B/pretrain_app.sh" --config "configs/$1.yaml" --batch-file "$WORK/batch_$2.safetensors" \
      --steps 20 --time --dropout --device cuda --set train.precision=bf16 || return 1
    # The same step replayed as one captured CUDA graph (train.cuda_graph; timed after step 2).
    echo "== $1 graph"
    "$B/pretrain_app.sh" --config "configs/$1.yaml" --batch-file "$WORK/batch_$2.safetensors" \
      --steps 14 --time --dropout --device cuda --set train.precision=bf16 \
      --set train.cuda_graph=true || return 1
  done
  # Shaw's relative positions through the fused kernels (predicted 7.31 ms, 2026-12-06).
  echo "== bert_base_learned_rpe graph"
  "$B/pretrain_app.sh" --config configs/bert_base_tupe_r.yaml --batch-file "$WORK/batch_128.safetensors" \
    --steps 14 --time --dropout --device cuda --set train.precision=bf16 --set train.cuda_graph=true \
    --set model.position.preset=learned_rpe || return 1
  # TUPE-R's backward with dQ and the bias gradient from two kernels instead of the cluster kernel
  # (flash_backward_q_bias, 2026-12-06; predicted 7.04 / 72.43 ms against 6.94 / 69.87 ms): the
  # same run times both.
  for cfg in "bert_base_tupe_r 128" "bert_large_tupe_r 512"; do
    set -- $cfg
    echo "== $1 graph clusters off"
    ENGINE_ATTENTION_CLUSTERS=off "$B/pretrain_app.sh" --config "configs/$1.yaml" \
      --batch-file "$WORK/batch_$2.safetensors" --steps 14 --time --dropout --device cuda \
      --set train.precision=bf16 --set train.cuda_graph=true || return 1
  done
}
export -f steps
export WORK LOGS B
stage steps 240 steps
hf_models="base128 large512"
[[ "$SKIP" == *" compile "* ]] || hf_models="$hf_models base128c"
stage hf 180 python3 tools/gpu/hf_bench.py $hf_models
stage cuda_tests 90 "$B/engine_cuda_tests.sh"
stage cuda_models 90 "$B/engine_cuda_model_tests.sh"
# Every preset and option at least once (tests/CMakeLists.txt's REFERENCE_SUBSET_CASES), ELECTRA.
ref() {
  python3 tools/reference/run_cases.py tools/reference/check_model.py "$WORK/ref" \
    --app "$B/pretrain_app.sh" --device cuda -- \
    "bert_a:--sop:--dropout:--micro-batches=2" "bert_r:--pre-ln" "tupe_a:--cls-reset=code" \
    "tupe_r:--dropout:--micro-batches=2" "tupe_a_tie_cls:--seq=32" "bert_a_d" \
    "learned_rpe:--dropout:--micro-batches=2" "learnable_sin_ape+sin_rpe" "bert_a+learned_rpe" \
    "no_pe" "learnable_sin_rpe" "tupe_r:--pre-ln:--cls-reset=code" "sin_ape:--embedding-size=48" \
    "learned_rpe:--type-vocab=0" "tupe_a" "bert_a" "tupe_r" "sin_rpe" \
    "rope:--dropout:--micro-batches=2" "alibi:--width=48:--heads=6" || return 1
  python3 tools/reference/run_cases.py tools/reference/check_electra.py "$WORK/ref_electra" \
    --app "$B/pretrain_app.sh" --device cuda -- \
    "tupe_r" "learnable_sin_ape:--embedding=64" "bert_r:--generator-size=0.25:--type-vocab=0"
}
export -f ref
stage reference 120 ref
ncu_step() {  # size: every kernel of a recorded step (record_step runs two: the second is kept)
  if [ "$1" = base ]; then cfg=bert_base_tupe_r seq=128; else cfg=bert_large_tupe_r seq=512; fi
  ncu --metrics gpu__time_duration.sum --csv --clock-control none --log-file "$LOGS/ncu_$1.csv" \
    "$B/record_step.sh" --config "configs/$cfg.yaml" --batch-size 32 --seq-len "$seq" \
    --out "$LOGS/record_$1.csv" || return 1
  xz -9f "$LOGS/ncu_$1.csv"
}
export -f ncu_step
stage ncu_base 90 ncu_step base
stage ncu_large 120 ncu_step large
stage sanitizer 120 sh -c "compute-sanitizer --tool memcheck --leak-check no '$B/engine_cuda_tests.sh' \
  '~*allocator*' && compute-sanitizer --tool racecheck '$B/engine_cuda_tests.sh' \
  '*sum_to*,*layer_norm*,*softmax*,*embedding*,*kernel helpers*,*block_*,*sort*,*scatter*'"
stage coverage 20 "$B/kernel_coverage.sh"
echo "done $(date +%T) 0" >> "$LOGS/status.txt"
python3 tools/gpu/summary.py "$LOGS" > "$LOGS/summary.md" 2>&1
pack_logs
cp "$LOGS/summary.md" "$OUTDIR/summary.md"
cat "$OUTDIR/summary.md"
exit $status
