#!/usr/bin/env bash
# Installs the built libengine into a scratch prefix, then configures, builds and runs
# tests/consumer against it with find_package(engine).
set -euo pipefail
build_dir="$1"; src_dir="$2"; scratch="$3"
rm -rf "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
cmake -S "$src_dir" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/build" >/dev/null
cd "$scratch"
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/build/consumer"
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/build/consumer_models"
