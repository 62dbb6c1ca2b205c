#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: fuzzes the readers of files with libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, SECONDS each (default 60): the safetensors reader
# (fuzz/fuzz_safetensors.cpp), the JSON readers of a transformers config.json and of a
# checkpoint's metadata (fuzz/fuzz_json_readers.cpp), then the tokenizer's files and the token
# files (fuzz/fuzz_tokenizer_files.cpp).
# Installs what is missing (clang and its runtime, CMake, Eigen, nlohmann-json, xxHash), configures
# build-fuzz/ with clang and -DNORMTAPE_FUZZ=ON (cpu only), builds, and runs each target on a copy
# of its seeds, fuzz/corpus/safetensors, fuzz/corpus/json and fuzz/corpus/tokenizer (new inputs it
# finds stay in build-fuzz/corpus/, never in the source tree).
# Exits non-zero on a finding; the input that caused it is written to build-fuzz/ (crash-*,
# leak-*, timeout-*), and can be replayed with build-fuzz/fuzz/fuzz_safetensors FILE (or
# fuzz_json_readers, fuzz_tokenizer_files).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/common.sh"
SECONDS_TO_RUN="${1:-60}"
FUZZ_BUILD="${NORMTAPE_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"

install_packages clang cmake make libeigen3-dev nlohmann-json3-dev libxxhash-dev libpcre2-dev
# libFuzzer and the sanitizer runtimes: Debian and Ubuntu ship them in libclang-rt-<major>-dev,
# which clang only recommends.
CLANG_MAJOR="$(clang++ -dumpversion | cut -d. -f1)"
if apt-cache show "libclang-rt-$CLANG_MAJOR-dev" >/dev/null 2>&1; then
    install_packages "libclang-rt-$CLANG_MAJOR-dev"
fi

cmake -S "$ROOT" -B "$FUZZ_BUILD" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DNORMTAPE_CUDA=OFF -DNORMTAPE_FUZZ=ON -DNORMTAPE_BUILD_TESTS=OFF -DNORMTAPE_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$FUZZ_BUILD" -j "$(nproc)" --target fuzz_safetensors fuzz_json_readers fuzz_tokenizer_files

cd "$FUZZ_BUILD"
# fuzz TARGET SEEDS DICT: -max_len: the seeds and then some; -rss_limit_mb: an absurd allocation
# from a hostile input is a finding, not something to wait for.
fuzz() {
    mkdir -p "$FUZZ_BUILD/corpus/$2"
    cp -n "$ROOT/fuzz/corpus/$2"/* "$FUZZ_BUILD/corpus/$2/" 2>/dev/null || true
    echo "normtape: fuzzing $1 for ${SECONDS_TO_RUN}s"
    "$FUZZ_BUILD/fuzz/$1" -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 -dict="$ROOT/fuzz/$3" "$FUZZ_BUILD/corpus/$2"
}
fuzz fuzz_safetensors safetensors safetensors.dict
fuzz fuzz_json_readers json json.dict
fuzz fuzz_tokenizer_files tokenizer tokenizer.dict
