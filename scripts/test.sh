#!/usr/bin/env bash
# scripts/test.sh: the whole test suite. Installs what is missing (including Debian's
# python3-torch for the PyTorch cross-check), builds, and runs every test through ctest.
#   scripts/test.sh              build/ (Release; the CUDA backend too where nvcc is found)
#   scripts/test.sh --sanitize   build-sanitize/: cpu only, under AddressSanitizer and UBSan
#                                (any finding fails the test that made it)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ "${1:-}" = --sanitize ]; then
    BUILD="$ROOT/build-sanitize"
    CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DNORMTAPE_SANITIZE=ON -DNORMTAPE_CUDA=OFF)
    # allocator_may_return_null: an allocation too large to satisfy returns null, as malloc does,
    # and the library's OutOfMemoryError path runs (ASan would abort the process instead).
    export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
install_build_deps
install_packages python3 python3-torch
configure_and_build
cd "$BUILD"
ctest --output-on-failure -j "$(nproc)"
