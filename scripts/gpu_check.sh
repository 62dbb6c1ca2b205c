#!/usr/bin/env bash
# scripts/gpu_check.sh: everything that needs a GPU, in one call on the lent H200 (see
# scripts/gpu_prepare.sh for .gpu_deps): configure for sm_90, build, run every test with the GPU
# visible (the PyTorch cross-check uses that machine's python3 with CUDA torch), then the memory
# comparison of the gpt2-medium-ish preset in bf16 and a bf16 run on tinyshakespeare. Logs and
# JSON go to $OUT (or ./gpu_out); a short summary is printed last. With the tests, the CUDA tests
# also run once under compute-sanitizer's memcheck and once under its racecheck (sanitizer-*.log).
#   scripts/gpu_check.sh [tests|bench|sanitize]   only the tests (with the sanitizers), only the
#   benchmarks, or only the compute-sanitizer runs (default: all)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu_out}"
mkdir -p "$OUT"
cd "$ROOT"
DEPS="$ROOT/.gpu_deps"
if [ -d "$DEPS/data" ] && [ ! -f ../shared/data/tinyshakespeare.txt ]; then
    mkdir -p ../shared/data && cp "$DEPS"/data/* ../shared/data/ 2>/dev/null
fi
summary=()
failed=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$DEPS" \
    > "$OUT/configure.log" 2>&1 || { tail -20 "$OUT/configure.log"; exit 1; }
if cmake --build build-gpu -j "$(nproc)" > "$OUT/build.log" 2>&1; then summary+=("build: ok"); else
    grep -E "error" "$OUT/build.log" | head -20; exit 1; fi

MODE="${1:-all}"
export NORMTAPE_PYTHON=python3
if [ "$MODE" != bench ] && [ "$MODE" != sanitize ]; then
    (cd build-gpu && ctest -j 8 --output-on-failure > "$OUT/ctest.log" 2>&1)
    summary+=("tests: $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)")
    grep -q "100% tests passed" "$OUT/ctest.log" || failed=1
    grep -E "Failed|\*\*\*Exception|Not Run" "$OUT/ctest.log" | head -20
    ./build-gpu/normtape_tests -ts=cuda,torch_crosscheck -s 2>&1 | grep -E "errors against PyTorch|  (layer|rms)/|skipped" \
        > "$OUT/crosscheck.txt"
fi

# compute-sanitizer: memcheck (out-of-bounds and misaligned device accesses, leaks, CUDA API
# errors) over the CUDA suite, without the out-of-memory test (its failing cudaMalloc is the point,
# and memcheck reports it); racecheck (shared-memory hazards) over the tests that launch our
# kernels on small shapes: the ops against the cpu, the norms over every shape class (racecheck
# takes minutes over the benchmark widths' millions of rows). Each is
# capped at 300 s; a timeout is reported, not counted as a failure. Note: memcheck sees the
# caching allocator's blocks, not our tensors: an overrun that stays inside a cached block is missed.
if [ "$MODE" != bench ]; then
    SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
    for tool in memcheck racecheck; do
        if [ $tool = memcheck ]; then filter=(-ts=cuda "-tce=*running out of memory*"); else
            filter=(-ts=cuda "-tc=*match the cpu*,*every shape class*"); fi
        log="$OUT/sanitizer-$tool.log"
        start=$SECONDS
        timeout 300 "$SANITIZER" --tool $tool --error-exitcode 1 ./build-gpu/normtape_tests "${filter[@]}" > "$log" 2>&1
        rc=$?
        took=$((SECONDS - start))
        errors="$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1)"
        if [ $rc -eq 0 ]; then verdict="ok (${errors:-no summary line})"
        elif [ $rc -eq 124 ]; then verdict="timed out after 300 s (inconclusive)"
        else verdict="FAILED, exit $rc (${errors:-no summary line}; a test failure if it says 0 errors)"; failed=1; fi
        summary+=("compute-sanitizer $tool: $verdict, ${took} s")
    done
fi

if [ "$MODE" != tests ] && [ "$MODE" != sanitize ]; then
    ./build-gpu/bench_norms --reference --json "$OUT/bench.json" --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
    summary+=("bench_norms: exit $?")
    PYTHONUNBUFFERED=1 python3 scripts/bench_torch_norms.py --ours "$OUT/bench.json" --out "$OUT/compare.json" \
        > "$OUT/compare.log" 2>&1
    summary+=("bench_torch_norms: exit $?")
fi
if [ "$MODE" = all ]; then
    ./build-gpu/train_gpt --preset gpt2-medium-ish --policy both --steps 4 --log-every 1 \
        --json "$OUT/medium.json" --chart "$OUT/medium.svg" > "$OUT/medium.log" 2>&1
    summary+=("medium preset: exit $?")
    if [ -f ../shared/data/tinyshakespeare.txt ]; then
        ./build-gpu/train_gpt --device cuda --data ../shared/data/tinyshakespeare.txt --policy both --steps 300 \
            --log-every 50 --json "$OUT/shakespeare.json" --chart "$OUT/shakespeare.svg" > "$OUT/shakespeare.log" 2>&1
        summary+=("tinyshakespeare bf16: exit $?")
    fi
fi

echo "==================== summary"
printf '%s\n' "${summary[@]}"
cat "$OUT/crosscheck.txt" 2>/dev/null
cat "$OUT/compare.log" 2>/dev/null
for f in medium shakespeare; do
    [ -f "$OUT/$f.log" ] && { echo "--- $f"; grep -vE "^\[(input|output)\] step" "$OUT/$f.log" | tail -16; }
done
exit $failed
