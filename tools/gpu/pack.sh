#!/usr/bin/env bash
# Here, before a lent GPU is used (../shared/device/README.md: the device has no package
# registry): builds build-gpu/ with nvcc for the H200 only (sm_90), portable host code and without
# the optional libraries the device lacks (MPI, oneDNN, OpenBLAS), then packs the programs
# tools/gpu/gpu_check.sh runs, libengine, and the Debian libraries they load that are not glibc,
# libstdc++ or CUDA into .gpu/pack.tar.xz (ignored by git through .git/info/exclude). Then:
#   run(command="tools/gpu/gpu_check.sh .gpu/pack.tar.xz", carry=[".gpu/pack.tar.xz"])
# usage: tools/gpu/pack.sh            (BUILD_DIR overrides build-gpu)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
PROGRAMS=(engine_cuda_tests engine_cuda_model_tests kernel_coverage pretrain_app record_step)
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DENGINE_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3 \
  -DENGINE_MPI=OFF -DENGINE_ONEDNN=OFF -DENGINE_OPENBLAS=OFF -DENGINE_TEST_CXX_FLAGS=-O1 >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${PROGRAMS[@]}"

stage="$ROOT/.gpu/pack"
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/deps"
for p in "${PROGRAMS[@]}"; do cp "$BUILD_DIR/bin/$p" "$stage/bin/"; done
cp -a "$BUILD_DIR"/lib/*.so* "$stage/lib/"
# The Debian libraries the programs load: everything ldd resolves but the C library family,
# the C++ runtime and CUDA's own (the device has those).
LD_LIBRARY_PATH="$stage/lib" ldd "$stage"/bin/* "$stage"/lib/*.so* 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++* | \
        libgcc_s* | libcuda.so* | libcudart* | libcublas* | libnccl* | libnvidia* | libengine*) ;;
      *) cp -L "$lib" "$stage/deps/" ;;
    esac
  done
git -C "$ROOT" log -1 --format='%h %s' > "$stage/commit.txt"
tar -C "$ROOT/.gpu" -cJf "$ROOT/.gpu/pack.tar.xz" pack
exclude="$(git -C "$ROOT" rev-parse --git-path info/exclude)"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
echo "pack.sh: $(du -h "$ROOT/.gpu/pack.tar.xz" | cut -f1) in .gpu/pack.tar.xz ($(ls "$stage/deps" | wc -l) Debian libraries)"
