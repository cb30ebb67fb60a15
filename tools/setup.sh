#!/usr/bin/env bash
# Installs the Debian packages the build needs (only those missing), then configures and builds
# into build/ (binaries in build/bin/). Sourced by tools/test.sh and tools/quickstart.sh; can be
# run on its own. Environment: BUILD_DIR (default build), BUILD_TYPE (default Release),
# CMAKE_ARGS (extra configure flags), EXTRA_PACKAGES (more Debian packages to install).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"

PACKAGES=(g++ cmake ninja-build libeigen3-dev libyaml-cpp-dev nlohmann-json3-dev catch2
          libsentencepiece-dev libicu-dev liblzma-dev zlib1g-dev pkg-config libopenmpi-dev openmpi-bin
          libpng-dev libstb-dev libboost-context-dev libopenblas-openmp-dev libdnnl-dev)
# shellcheck disable=SC2206
PACKAGES+=(${EXTRA_PACKAGES:-})

# shellcheck source=tools/packages.sh
source "$ROOT/tools/packages.sh"

install_packages setup "${PACKAGES[@]}"
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
