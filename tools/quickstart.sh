#!/usr/bin/env bash
# The README's first command: installs what is missing (apt-get), builds, and runs the main job on
# a default that needs no network beyond the Debian archive:
#   1. a small real-English corpus from the GNU Collaborative International Dictionary of English
#      (Debian's dict-gcide: Webster's 1913 + WordNet definitions and quotations);
#   2. a SentencePiece BPE vocabulary of 8000 pieces trained on it;
#   3. memory-mapped train/valid shards;
#   4. a tiny TUPE-R model (configs/tiny_tupe_r.yaml) pretrained for a few minutes on the CPU,
#      with the validation loss falling;
#   5. its validation curve as a PNG.
# Re-running continues an interrupted run (--resume) and reuses the prepared data.
# Environment: RUN_DIR (default runs/quickstart), QUICKSTART_MB (corpus size, default 8),
# QUICKSTART_STEPS (default: the config's 1000), and setup.sh's BUILD_DIR, BUILD_TYPE, CMAKE_ARGS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RUN="${RUN_DIR:-$ROOT/runs/quickstart}"
EXTRA_PACKAGES="python3 python3-matplotlib dict-gcide ${EXTRA_PACKAGES:-}" "$ROOT/tools/setup.sh"
APP="$BUILD_DIR/bin/pretrain_app"
mkdir -p "$RUN"

if [ ! -s "$RUN/gcide.txt" ]; then
  /usr/bin/python3 "$ROOT/tools/gcide_corpus.py" "$RUN/gcide.txt.tmp" --max-mb "${QUICKSTART_MB:-8}"
  mv "$RUN/gcide.txt.tmp" "$RUN/gcide.txt"
fi
if [ ! -s "$RUN/bpe8k.model" ]; then
  "$APP" train-tokenizer --input "$RUN/gcide.txt" --out "$RUN/bpe8k" --vocab-size 8000
fi
if [ ! -s "$RUN/corpus/meta.json" ]; then
  "$APP" prepare --tokenizer "$RUN/bpe8k.model" --input "$RUN/gcide.txt" --out "$RUN/corpus" \
    --valid-ratio 99 --overwrite
fi

OUT="$RUN/tiny_tupe_r"
RESUME=()
if compgen -G "$OUT/checkpoints/step_*.safetensors" > /dev/null; then RESUME=(--resume); fi
STEPS=()
if [ -n "${QUICKSTART_STEPS:-}" ]; then
  # The config warms up for 50 steps; a shorter run warms up for a fifth of its steps.
  WARMUP=$(( QUICKSTART_STEPS < 50 ? QUICKSTART_STEPS / 5 : 50 ))
  STEPS=(--set "train.steps=$QUICKSTART_STEPS" --set "train.warmup_steps=$WARMUP")
fi
"$APP" --config "$ROOT/configs/tiny_tupe_r.yaml" --set "data.corpus=$RUN/corpus" --out "$OUT" \
  "${STEPS[@]}" "${RESUME[@]}"
/usr/bin/python3 "$ROOT/tools/plot_curves.py" "$RUN/curves.png" "$OUT=TUPE-R (tiny)" --train
# The learned positional correlations (docs/poscorr.md).
CKPT="$OUT/model.safetensors"
[ -s "$CKPT" ] || CKPT="$(ls "$OUT"/checkpoints/step_*.safetensors | tail -n 1)"
"$(dirname "$APP")/poscorr_app" --checkpoint "$CKPT" --out "$RUN/poscorr"

echo
echo "quickstart: done."
echo "  checkpoints:  $OUT/checkpoints/ (resume with --resume), weights: $OUT/model.safetensors"
echo "  metrics:      $OUT/metrics.jsonl"
echo "  curves:       $RUN/curves.png"
echo "  positions:    $RUN/poscorr/ (tupe_term.png: TUPE's positional term per head; summary.json)"
