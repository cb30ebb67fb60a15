#!/usr/bin/env bash
# Installs the built libengine into a scratch prefix, then configures, builds and runs
# tests/consumer against it with find_package(engine).
set -euo pipefail
build_dir="$1"; src_dir="$2"; scratch="$3"
rm -rf "$scratch"
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
# A consumer of a sanitised build (tools/asan_test.sh) compiles and links with the same flags:
# the library's instrumentation needs the sanitizer runtime in the executable.
cache() { sed -n "s/^$1:STRING=//p" "$build_dir/CMakeCache.txt"; }
cmake -S "$src_dir" -B "$scratch/build" -G Ninja -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_CXX_FLAGS="$(cache CMAKE_CXX_FLAGS)" -DCMAKE_EXE_LINKER_FLAGS="$(cache CMAKE_EXE_LINKER_FLAGS)" >/dev/null
cmake --build "$scratch/build" >/dev/null
cd "$scratch"
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/build/consumer"
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/build/consumer_models"
