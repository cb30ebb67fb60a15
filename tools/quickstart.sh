#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job on an
# embedded default that needs no network. Until pretrain_app lands this is mlp_demo: a small
# GELU/LayerNorm/dropout classifier trained with the engine on a synthetic spiral task.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/tools/setup.sh"
"$BUILD_DIR/bin/mlp_demo" "$@"
