#!/usr/bin/env bash
# record_step + perf_model.py on a small config (CTest record_step_dry_run, EMU_DRY_RUN=1): the
# recorded GEMM FLOPs match the textbook count within 5% (the positional terms are the rest), and
# the model script turns the record into its tables.
# usage: perf_model_check.sh RECORD_STEP CONFIG WORKDIR
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
app="$1" config="$2" work="$3"
mkdir -p "$work"
"$app" --config "$config" --batch-size 4 --seq-len 64 --set model.vocab_size=1000 \
  --out "$work/step.csv" | tee "$work/out.txt"
ratio=$(sed -n 's/.*ratio \([0-9.]*\)$/\1/p' "$work/out.txt")
if ! awk -v r="$ratio" 'BEGIN { exit !(r >= 0.99 && r <= 1.05) }'; then
  echo "FAIL: recorded / analytic FLOPs = '$ratio' (expected 0.99 .. 1.05)"
  exit 1
fi
/usr/bin/python3 "$ROOT/tools/perf_model.py" "$work/step.csv" --batch 4 --label check
