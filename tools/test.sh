#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, and runs the whole
# CTest suite. Exits non-zero on any failure. [cuda] tests report "Skipped" without a GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
# Python and Debian's PyTorch run the reference tests (tools/reference/: the BERT model checked
# against an independent PyTorch implementation) and the pretrain_app command-line tests;
# clang-format checks the sources against .clang-format.
EXTRA_PACKAGES="python3 python3-numpy python3-torch clang-format ${EXTRA_PACKAGES:-}" "$ROOT/tools/setup.sh"
"$ROOT/tools/check_format.sh"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
