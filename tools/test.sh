#!/usr/bin/env bash
# The README's test command: installs what is missing, configures, builds, and runs the whole
# CTest suite. Exits non-zero on any failure. [cuda] tests report "Skipped" without a GPU.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
"$ROOT/tools/setup.sh"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)"
