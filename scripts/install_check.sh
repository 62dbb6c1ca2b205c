#!/usr/bin/env bash
# scripts/install_check.sh: the installed package works for a project outside this tree. For the
# static library (the build/ that test.sh makes, with its CUDA setting) and for a shared one built
# for distribution (build-shared/: the library and train_gpt, -DNORMTAPE_NATIVE=OFF, and
# -DNORMTAPE_CUDNN=OFF: the build without cuDNN, which the static one has where it is found): cmake
# --install into a temporary prefix, build examples/consumer against it with find_package, run it
# (it trains a small model and fails unless the loss fell) and its second program,
# examples/memory_report/memory_report.cpp (it fails unless every way of changing the saved
# tensors gives the plain run's gradients). On the shared library, also check that it runs on any
# x86-64 (no AVX instruction in its code: its vector code is SSE2, which every x86-64 has) and what
# it exports: train_gpt links and runs against it (a wider use of the API than the consumer's),
# and no Eigen or nlohmann-json symbol is exported.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_build_deps
PREFIX_ROOT="$(mktemp -d)"
trap 'rm -rf "$PREFIX_ROOT"' EXIT

# consumer_check KIND: install $BUILD into a fresh prefix, then build and run the consumer and
# memory_report.
consumer_check() {
    local prefix="$PREFIX_ROOT/$1"
    cmake --install "$BUILD" --prefix "$prefix" >/dev/null
    rm -rf "$BUILD/consumer"  # a cached normtape_DIR would point into an old prefix
    cmake -S "$ROOT/examples/consumer" -B "$BUILD/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
    cmake --build "$BUILD/consumer" -j "$(nproc)" >/dev/null
    echo "--- consumer against the installed $1 library ($(cd "$prefix" && find lib* -name 'libnormtape*' | tr '\n' ' '))"
    "$BUILD/consumer/consumer"
    echo "--- memory_report against the installed $1 library"
    "$BUILD/consumer/memory_report" | sed -n '/^setting/,/^$/p'
}

configure_and_build normtape
consumer_check static

BUILD="$ROOT/build-shared"
CMAKE_ARGS=(-DBUILD_SHARED_LIBS=ON -DNORMTAPE_NATIVE=OFF -DNORMTAPE_CUDNN=OFF -DNORMTAPE_WERROR=ON
            -DNORMTAPE_BUILD_TESTS=OFF -DNORMTAPE_BUILD_EXAMPLES=ON)
configure_and_build normtape train_gpt
consumer_check shared
echo "--- train_gpt against $(ldd "$BUILD/train_gpt" | awk '/libnormtape/ {print $3}')"
"$BUILD/train_gpt" --data random --device cpu --steps 2 --layers 1 --embd 32 --heads 2 --seq 16 --batch 2 \
    --save "$PREFIX_ROOT/model.safetensors" --json "$PREFIX_ROOT/run.json" --chart "$PREFIX_ROOT/run.svg" | tail -2

so="$(find "$BUILD" -maxdepth 1 -name 'libnormtape.so.*.*' | head -1)"
# AVX, AVX2 and AVX-512 instructions are VEX or EVEX encoded: their mnemonics begin with v
# (vmovaps, vfmadd231ps, vzeroupper), and only they use the ymm and zmm registers.
avx="$(objdump -d --no-show-raw-insn "$so" | grep -cE $'\tv[a-z0-9]+ |%[yz]mm' || true)"
echo "--- $(basename "$so"), built with -DNORMTAPE_NATIVE=OFF: $avx AVX instructions"
[ "$avx" -eq 0 ] || { echo "install_check: the portable library has AVX instructions:" >&2
    objdump -d --no-show-raw-insn "$so" | grep -E $'\tv[a-z0-9]+ |%[yz]mm' | head >&2; exit 1; }
exported="$(nm -DC --defined-only "$so")"
echo "--- $(basename "$so") exports $(wc -l <<<"$exported") symbols ($(grep -c 'normtape::' <<<"$exported") in normtape::)"
for leak in Eigen nlohmann; do
    n="$(grep -c "$leak" <<<"$exported" || true)"
    [ "$n" -eq 0 ] || { echo "install_check: libnormtape.so exports $n $leak symbols" >&2; grep "$leak" <<<"$exported" | head >&2; exit 1; }
done
grep -q 'normtape::layer_norm(' <<<"$exported" || { echo "install_check: normtape::layer_norm is not exported" >&2; exit 1; }
echo "install_check: ok"
