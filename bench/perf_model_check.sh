#!/usr/bin/env bash
# record_step + perf_model.py on a small config (CTest record_step_dry_run, EMU_DRY_RUN=1): the
# recorded GEMM FLOPs match the textbook count within 5% (the positional terms are the rest), the
# launches of an encoder layer are reported, every op's launches are recorded with their shapes,
# the model script turns the record into its tables, and the calibrated model still reproduces
# the H200 measurements of 5d401cc and 3928985 (--check: the step within 25%, every op family of
# 1% of a step or more within 40%); --strict: no launch of fewer than 32 threads is priced as its
# op's whole traffic (a kernel the model does not know).
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
# the launches of one encoder layer (the step at one layer fewer subtracted) reported
per_layer=$(sed -n 's/.*, \([0-9]*\) an encoder layer.*/\1/p' "$work/out.txt")
if ! [ "${per_layer:-0}" -gt 0 ] 2>/dev/null; then
  echo "FAIL: no launches per encoder layer reported ('$per_layer')"
  exit 1
fi
# every launch recorded as name:blocks:threads (the model times launches)
/usr/bin/python3 - "$work/step.csv" <<'PY'
import csv, sys
bad = [r["index"] for r in csv.DictReader(open(sys.argv[1]))
       if len([k for k in r["kernels"].split(";") if k.count(":") == 2]) != int(r["launches"]) + int(r["gemms"])]
if bad:
    sys.exit(f"FAIL: ops {bad[:5]} do not list one kernel:blocks:threads per launch")
PY
/usr/bin/python3 "$ROOT/bench/perf_model.py" "$work/step.csv" --batch 4 --label check --strict
/usr/bin/python3 "$ROOT/bench/perf_model.py" --check
