#!/usr/bin/env bash
# scripts/gpu_prepare.sh: run on the development machine before sending the tree to the lent GPU
# machine. That machine has nvcc, CMake, Eigen, doctest and torch but not CLI11 or nlohmann-json,
# and no ../shared: this copies the two header-only libraries (with their CMake packages) and the
# test text into .gpu_deps/ (ignored by git), which travels with the tree (carry: .gpu_deps).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.gpu_deps"
rm -rf "$DEPS"
mkdir -p "$DEPS/include" "$DEPS/share/cmake" "$DEPS/data"
cp -r /usr/include/CLI /usr/include/nlohmann "$DEPS/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$DEPS/share/cmake/"
if [ -f "$ROOT/../shared/data/tinyshakespeare.txt" ]; then cp "$ROOT/../shared/data/tinyshakespeare.txt" "$DEPS/data/"; fi
du -sh "$DEPS"
