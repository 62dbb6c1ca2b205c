#!/usr/bin/env bash
# scripts/compile_check.sh: the library's C++ sources compile without a warning (-Werror) for each
# level of x86-64 a user's CPU may have, whatever this machine's CPU is:
#   x86-64     SSE2 only: any x86-64 (what a package built with -DNORMTAPE_NATIVE=OFF targets)
#   x86-64-v3  AVX2 (Haswell, Zen)
#   x86-64-v4  AVX-512 (Skylake-X, Ice Lake, Sapphire Rapids, Zen 4)
# so that a warning that only one CPU's vector instructions bring (inlined intrinsics in xxHash
# or Eigen) cannot land. Compile only: the objects of the library (CMake's normtape_objects), CPU
# only, in build-march-LEVEL/. The CUDA sources' check is scripts/test.sh's build: where no GPU is
# visible (CI), it compiles them for every architecture of NORMTAPE_CUDA_ARCHITECTURES_PORTABLE.
# Installs what is missing (scripts/common.sh); exits non-zero at the first level that fails.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_build_deps
for level in x86-64 x86-64-v3 x86-64-v4; do
    BUILD="$ROOT/build-march-$level"
    CMAKE_ARGS=(-DNORMTAPE_NATIVE=OFF -DNORMTAPE_CUDA=OFF -DNORMTAPE_WERROR=ON -DNORMTAPE_BUILD_TESTS=OFF
                -DNORMTAPE_BUILD_EXAMPLES=OFF "-DCMAKE_CXX_FLAGS=-march=$level")
    echo "--- compiling the library for -march=$level with -Werror"
    mkdir -p "$BUILD"
    configure_and_build normtape_objects >"$BUILD/compile.log" 2>&1 || {
        grep -E "error|warning" "$BUILD/compile.log" | head -20
        echo "compile_check: -march=$level FAILED (full log: $BUILD/compile.log)" >&2
        exit 1
    }
done
echo "compile_check: ok (x86-64, x86-64-v3, x86-64-v4)"
