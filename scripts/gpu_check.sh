#!/usr/bin/env bash
# scripts/gpu_check.sh: everything that needs an NVIDIA GPU, in one command. Configures build-gpu/
# for this machine's GPU (CMake's native; CUDA_ARCH=... for other architectures), builds, runs every
# test with the GPU visible (the PyTorch cross-check needs a python3 with CUDA torch), every test
# again from build-ptx80/, a build of compute_80 PTX only, which the driver compiles for this GPU,
# so that the code of GPUs before Hopper (no thread-block clusters) runs on it too; every test
# once more under compute-sanitizer's memcheck and initcheck, and the small CUDA ones under
# racecheck, with the caching allocator off (the runs are listed above group_filter), the norm
# kernels' and the attention's benchmarks beside PyTorch's, the other bandwidth-bound kernels' (bench_ops), the
# memory comparison of the gpt2-medium-ish preset in bf16 and its step beside PyTorch eager's, the
# saved bytes at a fixed number of tokens, and a bf16 run on data/tinyshakespeare.txt. Logs, JSON
# and charts go to $GPU_OUT (default gpu_out/); a short summary is printed last. Exits 1 if a test,
# a sanitizer run, a benchmark or a training run fails.
#   scripts/gpu_check.sh [all|tests|ptx80|bench|sanitize|attention|step|profile|nanogpt|decoders|memory|budget|sweep|
#                         muon|muon-shakespeare|distributed|dryrun|fused-norm|baseline|graph|targets|bpe]
#     tests: the tests only (GPU_TESTS=REGEX: only the ctest tests it matches); ptx80: the tests
#     from build-ptx80/ only (GPU_TESTS too; it does not build build-gpu/); sanitize: the
#     sanitizers only (SANITIZE_RUNS=NAME... picks some of its runs, SANITIZE_SHARDS=K splits each;
#     it builds only the tests); bench: the benchmarks and training runs only (each of the four fits in 10
#     minutes on an H100 or H200 with nothing built yet); profile: only scripts/profile_step.sh,
#     the step's kernel time by category beside PyTorch's (needs Nsight Compute's ncu); nanogpt:
#     nanoGPT's Shakespeare GPU configuration trained by train_gpt and by PyTorch eager
#     (scripts/train_torch_shakespeare.py); decoders: the same size with --arch gpt2, nanochat and
#     llama (2 key/value heads), 2500 steps, by train_gpt under each policy and by PyTorch eager;
#     memory: the gpt2-medium-ish preset under each policy
#     with --memory-report, plain, with --offload on and with --checkpoint blocks (the saved bytes
#     left on the GPU and the step time of each); budget: the fused head loss's tests, the preset
#     under Normalized with --fused-loss off and on, the head loss alone (bench_ops --head-loss),
#     PyTorch eager's and torch.compile's step; sweep: PyTorch's two steps, then train_gpt
#     --memory-sweep on the preset (every setting timed, measured peak against predict_peak) and
#     scripts/memory_sweep_report.py (the planner's pick against the sweep's fastest for budgets of
#     2, 4, 8 and 16 GiB); muon: Muon's tests on the GPU (and under memcheck), bench_muon on the
#     preset's matrices, the preset's step with AdamW and with Muon; muon-shakespeare: nanoGPT's
#     GPU configuration with --arch gpt2, nanochat and llama (2 key/value heads), each with AdamW
#     and with Muon (the first 2500 steps of the 5000-step schedule), train_gpt's runs
#     (MUON_RUNS=ours|torch|both, default both) and PyTorch's Muon reference
#     (scripts/train_torch_shakespeare.py --optimizer muon), then scripts/muon_report.py's table
#     and curves. None of profile, nanogpt, decoders, memory, budget, sweep, muon and
#     muon-shakespeare is part of all (default: all). dryrun: the dry run's tests on the GPU (two
#     models of the tests' own and a grid of small GPTs, predicted = measured to the byte), the
#     preset's step under seven settings (train_gpt's measured peak against predict_peak, which
#     dry-runs the same step), with ZeRO-1 on 2 GPUs where the machine has them, and bench_dry_run.
#     fused-norm: the norms' tests on the GPU (fused_norm, layer_norm, rms_norm, cast, cuda's norm cases), and the fused
#     add + norm at M = 16384 rows in bf16 (bench_norms --hold --rows) beside PyTorch eager's and
#     torch.compile's (scripts/bench_torch_fused_norm.py); part of bench too. baseline: this tree's
#     train_gpt beside the one built from BASELINE_SRC (another checkout's source, e.g. from
#     `git archive`), each run alternated three times in one call: the preset's step under each
#     policy, and 200 bf16 steps on data/tinyshakespeare.txt with --dropout 0.1 (the
#     loss curves, saved bytes and peaks side by side, scripts/compare_runs.py). graph: the CUDA
#     graph's tests and the optimizers' on the GPU; 100 bf16 steps on data/tinyshakespeare.txt with
#     --cuda-graph off and on (the loss curves must be equal bit for bit); GPT-2 124M (12 layers, C 768,
#     vocabulary 50304, tied, B 16, T 1024, random tokens) and the gpt2-medium-ish preset, each with
#     --cuda-graph off and on, alternated twice (step time, peak, MFU); with LLMC_SRC (a checkout of
#     karpathy/llm.c) and CUDNN_FRONTEND (cudnn-frontend's include/), scripts/bench_llmc.sh too.
#     targets: the step's speed targets, each beside its reference in the same call, with nothing
#     else built: graph's 100-step curves; bench_attention beside SDPA; bench_muon (eager and as
#     CUDA graphs); the preset's step with --cuda-graph off and on beside PyTorch eager's and
#     torch.compile's; with LLMC_SRC and CUDNN_FRONTEND, GPT-2 124M beside llm.c (bench_llmc.sh).
#     bpe: nanoGPT's Shakespeare GPU configuration on the text's bytes and on the ids of a 4,096-token
#     BPE that train_tokenizer trains on the training split in the same call, the same steps and
#     schedule; their held-out losses in bits per byte side by side.
# Needs the CUDA toolkit and the build dependencies that scripts/common.sh installs (Eigen, doctest,
# CLI11, nlohmann-json, xxHash's header); CMake also looks for them under $CMAKE_PREFIX_PATH.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPU_OUT="$(mkdir -p "${GPU_OUT:-$ROOT/gpu_out}" && cd "${GPU_OUT:-$ROOT/gpu_out}" && pwd)"
MODE="${1:-all}"
case "$MODE" in all|tests|ptx80|bench|sanitize|attention|step|profile|nanogpt|decoders|memory|budget|sweep|muon|muon-shakespeare|distributed|dryrun|fused-norm|baseline|graph|targets|bpe) ;;
    *) echo "usage: scripts/gpu_check.sh [all|tests|ptx80|bench|sanitize|attention|step|profile|nanogpt|decoders|memory|budget|sweep|muon|muon-shakespeare|distributed|dryrun|fused-norm|baseline|graph|targets|bpe]" >&2
       exit 2;; esac
cd "$ROOT"
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
summary=()
failed=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$GPU_OUT/gpu.txt"

# build DIR LABEL [CMAKE ARGS...]: configures and builds DIR from $SRC (default: this tree) with -Werror
# (only $BUILD_TARGETS where it is set), logs under $GPU_OUT.
build() {
    local dir=$1 label=$2; shift 2
    cmake -S "${SRC:-.}" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DNORMTAPE_WERROR=ON "$@" > "$GPU_OUT/configure-$label.log" 2>&1 ||
        { tail -20 "$GPU_OUT/configure-$label.log"; exit 1; }
    # shellcheck disable=SC2086  # a list of targets
    if cmake --build "$dir" -j "$(nproc)" ${BUILD_TARGETS:+--target $BUILD_TARGETS} > "$GPU_OUT/build-$label.log" 2>&1; then
        summary+=("build $label: ok ($(sed -n 's/^-- normtape: //p' "$GPU_OUT/configure-$label.log"))"); else
        grep -E "error" "$GPU_OUT/build-$label.log" | head -20; exit 1; fi
}
# The sanitizers need only the library and the tests (which bring train_gpt and generate).
[ "$MODE" = sanitize ] && BUILD_TARGETS="${BUILD_TARGETS:-normtape normtape_tests}"
[ "$MODE" = fused-norm ] && BUILD_TARGETS="${BUILD_TARGETS:-normtape normtape_tests bench_norms}"
[ "$MODE" = graph ] && BUILD_TARGETS="${BUILD_TARGETS:-normtape normtape_tests train_gpt}"
[ "$MODE" = targets ] && BUILD_TARGETS="${BUILD_TARGETS:-normtape train_gpt bench_attention bench_muon}"
[ "$MODE" = bpe ] && BUILD_TARGETS="${BUILD_TARGETS:-normtape train_gpt train_tokenizer}"
if [ "$MODE" = baseline ]; then
    [ -f "${BASELINE_SRC:-}/CMakeLists.txt" ] || { echo "baseline: BASELINE_SRC must name a source tree" >&2; exit 2; }
    BUILD_TARGETS="${BUILD_TARGETS:-train_gpt}"
    SRC="$BASELINE_SRC" build build-baseline baseline ${CUDA_ARCH:+-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"}
    rm -f "$GPU_OUT"/preset_*.json "$GPU_OUT"/dropout_*.json  # no run of an earlier call is compared
fi
[ "$MODE" = ptx80 ] || build build-gpu gpu ${CUDA_ARCH:+-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH"}

export NORMTAPE_PYTHON=python3
if [ "$MODE" = all ] || [ "$MODE" = tests ]; then
    (cd build-gpu && ctest -j "$(nproc)" --output-on-failure -R "${GPU_TESTS:-.}" > "$GPU_OUT/ctest.log" 2>&1)
    summary+=("tests: $(grep -E 'tests passed|tests failed' "$GPU_OUT/ctest.log" | tail -1)")
    grep -q "100% tests passed" "$GPU_OUT/ctest.log" || failed=1
    grep -E "Failed|\*\*\*Exception|Not Run|Skipped" "$GPU_OUT/ctest.log" | head -20
    ./build-gpu/normtape_tests -ts=cuda,torch_crosscheck -s 2>&1 | grep -E "errors against PyTorch|  (layer|rms)/|skipped" \
        > "$GPU_OUT/crosscheck.txt"
fi

# The same tests from compute_80 PTX: flash attention from sm_80 code, the norms without clusters.
if [ "$MODE" = all ] || [ "$MODE" = ptx80 ]; then
    build build-ptx80 ptx80 -DCMAKE_CUDA_ARCHITECTURES=80-virtual
    (cd build-ptx80 && ctest -j "$(nproc)" --output-on-failure -R "${GPU_TESTS:-.}" > "$GPU_OUT/ctest-ptx80.log" 2>&1)
    summary+=("tests from compute_80 PTX: $(grep -E 'tests passed|tests failed' "$GPU_OUT/ctest-ptx80.log" | tail -1)")
    grep -q "100% tests passed" "$GPU_OUT/ctest-ptx80.log" || failed=1
    grep -E "Failed|\*\*\*Exception|Not Run" "$GPU_OUT/ctest-ptx80.log" | head -20
fi

# sanitize TOOL LABEL FILTER...: the tests FILTER picks under compute-sanitizer's TOOL with the
# caching allocator off (NORMTAPE_NO_CUDA_MEMORY_CACHING=1, so that each tensor has its own bounds),
# capped at $SANITIZE_TIMEOUT s (default 540; a timeout is reported, not counted as a failure; the log
# names the test cases that finished, with their durations). $SANITIZER_OPTIONS goes to
# compute-sanitizer. The verdict is printed and written to sanitizer-LABEL-TOOL.verdict, which
# verdict() adds to the summary, so that runs can go in parallel. What counts:
# - racecheck does not follow the asynchronous barriers of cuDNN's Hopper kernels (TMA, wgmma) and
#   reports hazards inside them wherever cuDNN runs attention: a hazard counts only outside cuDNN's kernels.
# - NCCL's own probe of its kernels (cudaFuncGetAttributes answering cudaErrorNoKernelImageForDevice
#   inside libnccl, which NCCL handles) and errors inside PyTorch's kernels (the reference that the
#   cross-checks run in a child python) do not count; every other error of every process does.
# - initcheck runs with NVTX on, to read the ranges that ops/matmul.cu and ops/attention_cudnn.cpp
#   mark as written by cuBLAS and cuDNN (cuda_mark_written, core/cuda_allocator.h).
# - A range of test cases that makes no CUDA call is no error (--require-cuda-init no).
SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
SANITIZE_TIMEOUT="${SANITIZE_TIMEOUT:-540}"
sanitize() {
    local tool=$1 label=$2; shift 2
    local log="$GPU_OUT/sanitizer-$label-$tool.log" start=$SECONDS nvtx=() targets=(--target-processes all)
    [ "$tool" = initcheck ] && nvtx=(--nvtx yes)
    [[ " ${SANITIZER_OPTIONS:-} " != *" --target-processes "* ]] || targets=()  # the caller's choice
    # shellcheck disable=SC2086  # SANITIZER_OPTIONS is a list of options
    NORMTAPE_NO_CUDA_MEMORY_CACHING=1 timeout "$SANITIZE_TIMEOUT" "$SANITIZER" --tool "$tool" "${nvtx[@]}" \
        --require-cuda-init no --print-limit 0 "${targets[@]}" ${SANITIZER_OPTIONS:-} --error-exitcode 1 ./build-gpu/normtape_tests \
        --duration=true "$@" > "$log" 2>&1
    local rc=$? took=$((SECONDS - start))
    local ours total nccl torch errors cases verdict passed=0 first="${log%.log}.first"
    grep -q "Status: SUCCESS" "$log" && passed=1
    # Each process tracked prints its own summary: the errors are their sum. Every error is printed
    # (--print-limit 0), so that each is told apart below.
    total=$(awk '/ERROR SUMMARY: [0-9]+ errors?[[:space:]]*$/ { for (i = 1; i < NF; ++i) if ($i == "SUMMARY:") s += $(i + 1) }
                 END { print s + 0 }' "$log")
    # A record is a "========= " line with a capital (not the banner, a summary or the notice of a
    # process's exit status) and the "=========" lines after it. NCCL's probe is one whose frames are
    # in libnccl; PyTorch's, one in its kernels or libraries (the reference, run by a child python);
    # under racecheck, one in cuDNN's kernels is neither and not ours. The first of ours (30 lines at
    # most) goes to $first.
    rm -f "$first"
    read -r nccl torch < <(awk -v tool="$tool" -v first="$first" '
        function close_record() {
            if (!open) return
            if (probe && in_nccl) n++
            else if (in_torch) p++
            else if (!in_cudnn && !written) { for (i = 1; i <= k && i <= 30; ++i) print lines[i] > first; written = 1 }
            open = 0
        }
        /^========= [A-Z]/ {
            close_record()
            if (!/COMPUTE-SANITIZER|SUMMARY|Target application returned|terminate/) {
                open = 1; k = 0; in_nccl = 0; in_torch = 0; in_cudnn = 0
                probe = /Program hit cudaErrorNoKernelImageForDevice/
            }
        }
        open && /^=========/ {
            lines[++k] = $0
            if (/libnccl\.so/) in_nccl = 1
            if (/at::native::|c10::|libtorch/) in_torch = 1
            if (tool == "racecheck" && /cudnn_generated/) in_cudnn = 1
        }
        END { close_record(); print n + 0, p + 0 }' "$log")
    case $tool in
        racecheck) ours=$(grep -E "Race reported" "$log" | grep -vc "cudnn_generated") ;;
        *) ours=$(( total - nccl - torch )) ;;
    esac
    [ $rc -eq 1 ] && [ "$ours" -eq 0 ] && [ $passed = 1 ] && rc=0
    errors="$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')"
    [ $tool = racecheck ] || errors="ERROR SUMMARY: $total errors in all processes"
    [ $tool = racecheck ] && errors="${errors:-no summary line}; outside cuDNN's own kernels: $ours"
    [ "$nccl" -gt 0 ] && errors+="; NCCL's own probe: $nccl"
    [ "$torch" -gt 0 ] && errors+="; in PyTorch's kernels: $torch"
    cases="$(grep -E '^\[doctest\] test cases' "$log" | tail -1 | sed 's/^\[doctest\] //')"
    if [ $rc -eq 0 ]; then verdict="ok (${errors:-no summary line}; ${cases:-no doctest summary})"
    elif [ $rc -eq 124 ]; then
        verdict="timed out after $SANITIZE_TIMEOUT s (inconclusive; $(grep -c '^[0-9.]* s: ' "$log") test cases finished)"
    else verdict="FAILED, exit $rc (${errors:-no summary line}; ${cases:-no doctest summary})"; fi
    # Printed at once too, so that a call cut off by its time limit still says what finished, with a
    # failure's first record: a device call brings few files back.
    echo "compute-sanitizer $tool, $label: $verdict, ${took} s" | tee "${log%.log}.verdict"
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -f "$first" ]; then sed "s/^/$label $tool: /" "$first"; fi
}
# verdict LABEL TOOL: adds a finished sanitize run's verdict to the summary; a failure fails the script.
verdict() {
    local line
    line="$(cat "$GPU_OUT/sanitizer-$1-$2.verdict" 2>/dev/null || echo "compute-sanitizer $2, $1: FAILED, no verdict")"
    summary+=("$line")
    [[ $line != *FAILED* ]] || failed=1
}

# overrun_check: the allocator switch's own check. A copy of core/tensor_cuda.cu's fill_kernel with
# its bound moved one element on (i <= n), written under $GPU_OUT/overrun/ and never into the tree,
# fills a 1,000-float tensor from normtape's allocate() under memcheck, once with caching on and once
# off: memcheck must report the write past the tensor with caching off (the tensor is its own
# cudaMalloc) and cannot with it on (the write lands inside a cached block).
overrun_check() {
    local dir="$GPU_OUT/overrun"
    mkdir -p "$dir"
    { printf '#include <cstdio>\n#include "core/allocator.h"\ntemplate <class T>\n'
      sed -n '/__global__ void fill_kernel/,/^}/p' core/tensor_cuda.cu | sed 's/i < n;/i <= n;/'
      cat <<'EOF'
int main() {
    const int64_t n = 1000;
    auto* p = static_cast<float*>(normtape::allocate(normtape::Device::cuda(0), n * sizeof(float)));
    fill_kernel<<<1, 256>>>(p, 1.0f, n);
    cudaError_t err = cudaDeviceSynchronize();
    normtape::deallocate(normtape::Device::cuda(0), p, n * sizeof(float));
    std::printf("the planted overrun ran: %s\n", cudaGetErrorString(err));
    return 0;
}
EOF
    } > "$dir/overrun.cu"
    if ! grep -q "i <= n;" "$dir/overrun.cu"; then
        summary+=("overrun check: FAILED, no fill_kernel with an 'i < n;' bound in core/tensor_cuda.cu"); failed=1; return
    fi
    # The allocator's objects bring the CUDA context's, which call cuBLAS, cuBLASLt and cuRAND.
    if ! nvcc -std=c++20 -O1 -arch=native -I. -Iinclude -Ibuild-gpu/generated "$dir/overrun.cu" -o "$dir/overrun" \
            build-gpu/libnormtape.a -lcublas -lcublasLt -lcurand > "$dir/build.log" 2>&1; then
        tail -5 "$dir/build.log"; summary+=("overrun check: FAILED to build (overrun/build.log)"); failed=1; return
    fi
    # Each run must have reached its end; with caching on memcheck must say 0 errors, with it off
    # it must name the invalid write.
    local caching off log found ran
    for caching in on off; do
        off=$([ $caching = off ] && echo 1 || echo 0)
        log="$dir/memcheck-caching-$caching.log"
        NORMTAPE_NO_CUDA_MEMORY_CACHING=$off "$SANITIZER" --tool memcheck "$dir/overrun" > "$log" 2>&1
        found="$(grep -m1 -E "Invalid __global__ write" "$log")"
        ran="$(grep -c "the planted overrun ran" "$log")"
        summary+=("overrun check, caching $caching: ${found:-no invalid write}; $(grep "ERROR SUMMARY" "$log")")
        echo "${summary[-1]}"
        if [ "$ran" -eq 0 ]; then summary+=("overrun check, caching $caching: FAILED, did not run to its end"); failed=1; fi
        if [ "$off" = 1 ] && [ -z "$found" ]; then failed=1; fi
        if [ "$off" = 0 ] && { [ -n "$found" ] || ! grep -q "ERROR SUMMARY: 0 errors" "$log"; }; then failed=1; fi
    done
}

# The sanitizer runs: every test case, in six groups that together hold them all, each under memcheck
# (out-of-bounds and misaligned device accesses, leaks, CUDA API errors) and initcheck (reads of
# device memory never written), but two tests of running out of memory, the CUDA one (its failing
# cudaMalloc is the point, and memcheck reports it) and train_gpt's on the cpu (under the sanitizer
# its child process dies of a segmentation fault in place of the out-of-memory error), and two of
# train_gpt's files on the cpu (220 child processes that launch no kernel). Five groups are suites
# (core: every suite that the other four do not name); the sixth, long, is the few test cases whose
# own loops take longer than a device call (LONG_CASES), which the others leave out. Every run
# follows child processes (--target-processes all: a child that is not followed waits for the
# sanitizer and times out): the programs group's train_gpt, generate and MPI ranks, and the PyTorch
# reference that the cross-checks of the nn and long groups run. racecheck (shared-memory hazards)
# runs over the test cases of our kernels on CUDA on small shapes (racecheck-cuda) and over the
# long ones among them (racecheck-long, LONG_KERNEL_CASES), not over whole GPT steps.
# SANITIZE_RUNS picks some runs (default every one); RUN:K splits that run's test cases into K
# consecutive ranges (doctest's --first/--last), or the long group's loops into K parts
# (NORMTAPE_TEST_PART=k/K, tests/test_util.h), each its own process, labelled GROUP.k
# (SANITIZE_SHARDS=K is the default K, 1 unless set); RUN:K:k,... runs only those of them (a
# failed range again, under the same label). The processes go round the machine's GPUs
# (CUDA_VISIBLE_DEVICES; the programs group sees them all, for its data-parallel runs),
# SANITIZE_JOBS at once (default 4 per GPU). docs/GPU_TESTS.md gives the
# splits that ran in 10-minute calls on four H200s:
#   overrun       overrun_check above
#   memcheck-core, memcheck-ops, memcheck-attention, memcheck-nn, memcheck-programs, memcheck-long
#   initcheck-core, initcheck-ops, initcheck-attention, initcheck-nn, initcheck-programs, initcheck-long
#   racecheck-cuda, racecheck-long
LONG_KERNEL_CASES="*cuDNN's attention matches normtape's kernels*"
LONG_KERNEL_CASES+=",*fast norm kernels match the reference kernels at every*"
LONG_KERNEL_CASES+=",*match the cpu in both policies over every shape class*"
LONG_CASES="$LONG_KERNEL_CASES,*predict_peak is the measured peak of a training step*,torch_crosscheck: GPT loss*"
OPS_SUITES=layer_norm,rms_norm,fused_norm,add,mul,scale,sum,mean,gelu,relu_squared,swiglu,softmax,dropout,embedding,rotary_embedding,matmul,linear,linear_gelu
ATTENTION_SUITES=causal_attention,causal_self_attention,causal_self_attention_rows,cross_entropy,linear_cross_entropy
NN_SUITES=nn,gpt,generate,checkpoint,hf,safetensors,muon,memory_plan,torch_crosscheck
PROGRAM_SUITES=train_gpt,generate_cli,memory_report,distributed
ALL_SANITIZE_RUNS="overrun memcheck-core memcheck-ops memcheck-attention memcheck-nn memcheck-programs memcheck-long
    initcheck-core initcheck-ops initcheck-attention initcheck-nn initcheck-programs initcheck-long racecheck-cuda
    racecheck-long"
# group_filter GROUP TOOL: sets filter to the doctest options that pick the group's test cases.
group_filter() {
    local skip="-tce=*running out of memory*,*more than memory holds*,*single-byte changes of a checkpoint*"
    skip+=",*kills during saves*,$LONG_CASES"
    case "$1" in
        core) filter=("-tse=$OPS_SUITES,$ATTENTION_SUITES,$NN_SUITES,$PROGRAM_SUITES" "$skip") ;;
        ops) filter=("-ts=$OPS_SUITES" "$skip") ;;
        attention) filter=("-ts=$ATTENTION_SUITES" "$skip") ;;
        nn) filter=("-ts=$NN_SUITES" "$skip") ;;
        programs) filter=("-ts=$PROGRAM_SUITES" "$skip") ;;
        cuda) filter=("-tc=*cuda*,*match the cpu*"
                      "$skip,*GPT step on the GPU*,torch_crosscheck*,hf:*,generate*,errors:*") ;;
        long) filter=("-tc=$LONG_CASES")
              [ "$2" != racecheck ] || filter=("-tc=$LONG_KERNEL_CASES") ;;
    esac
}
if [ "$MODE" = all ] || [ "$MODE" = sanitize ]; then
    runs="${SANITIZE_RUNS:-$ALL_SANITIZE_RUNS}"
    known=" $(echo $ALL_SANITIZE_RUNS) "
    for spec in $runs; do
        run=${spec%%:*}
        [[ $known == *" $run "* ]] || { echo "gpu_check.sh: no sanitizer run named $run (runs:$known)" >&2; exit 2; }
        [ "$run" = "$spec" ] && continue
        usage="gpu_check.sh: $spec: expected RUN, RUN:K or RUN:K:k,... with 1 <= k <= K (not for overrun)"
        [[ $run != overrun && ${spec#*:} =~ ^([1-9][0-9]*)(:([1-9][0-9]*(,[1-9][0-9]*)*))?$ ]] || { echo "$usage" >&2; exit 2; }
        for k in ${BASH_REMATCH[3]//,/ }; do [ "$k" -le "${BASH_REMATCH[1]}" ] || { echo "$usage" >&2; exit 2; }; done
    done
    rm -f "$GPU_OUT"/sanitizer-*.verdict  # none left from an earlier call
    for run in $runs; do [ "$run" != overrun ] || overrun_check; done
    # The GPUs the caller made visible, or all of them.
    IFS=, read -ra gpu_list <<< "${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}"
    slot=0 launched=()
    jobs_at_once=${SANITIZE_JOBS:-$((4 * ${#gpu_list[@]}))}
    # The cpu kernels' OpenMP threads share the cores among the processes.
    omp=$(( $(nproc) / jobs_at_once )); omp=${OMP_NUM_THREADS:-$((omp > 0 ? omp : 1))}
    for spec in $runs; do
        run=${spec%%:*} shards=${SANITIZE_SHARDS:-1} only=
        if [ "$run" != "$spec" ]; then shards=${spec#*:}; shards=${shards%%:*}; fi
        [[ $spec != *:*:* ]] || only=",${spec##*:},"
        [ "$run" != overrun ] || continue
        tool=${run%%-*} group=${run#*-}
        group_filter "$group" "$tool"
        count=$(./build-gpu/normtape_tests "${filter[@]}" --count | sed -n 's/.*filters: *//p')
        if [ "${count:-0}" -eq 0 ]; then summary+=("compute-sanitizer $run: FAILED, no test case to run"); failed=1; continue; fi
        per=$(( (count + shards - 1) / shards ))
        for ((k = 1; k <= shards; k++)); do
            [[ -z $only || $only == *",$k,"* ]] || continue
            label=$group range=() part=
            if [ "$shards" -gt 1 ]; then
                label=$group.$k
                if [ "$group" = long ]; then part=$k/$shards
                else range=("--first=$(( (k - 1) * per + 1 ))" "--last=$((k * per))"); fi
            fi
            while [ "$(jobs -rp | wc -l)" -ge "$jobs_at_once" ]; do wait -n; done
            # The programs group sees every GPU, for its data-parallel runs; any other process runs on
            # one GPU (chosen here: a background command's expansions are its own).
            if [ "$group" = programs ]; then gpus=$(IFS=,; echo "${gpu_list[*]}")
            else gpus=${gpu_list[slot++ % ${#gpu_list[@]}]}; fi
            OMP_NUM_THREADS=$omp CUDA_VISIBLE_DEVICES=$gpus NORMTAPE_TEST_PART=$part \
                sanitize "$tool" "$label" "${filter[@]}" "${range[@]}" &
            launched+=("$label $tool")
        done
    done
    wait
    for run in "${launched[@]}"; do verdict $run; done
fi

# step LABEL COMMAND...: runs the command, notes its exit status, and fails the script if it failed
# (train_gpt exits 1 when the measured saving differs from the prediction).
step() {
    local label=$1; shift
    "$@"
    local rc=$?
    summary+=("$label: exit $rc")
    [ $rc -eq 0 ] || failed=1
}

# Attention alone: its tests on the GPU (cuDNN's backend against our kernels, both against the
# cpu), compute-sanitizer over the cuDNN case, and the benchmark beside PyTorch's SDPA.
if [ "$MODE" = attention ]; then
    step "attention tests" ./build-gpu/normtape_tests "-tc=*attention*,*cuDNN*,memory: every preset*" \
        > "$GPU_OUT/attention_tests.log" 2>&1
    summary+=("attention tests: $(grep -E '^\[doctest\] test cases' "$GPU_OUT/attention_tests.log")")
    sanitize memcheck cudnn "-tc=*cuDNN*"
    verdict cudnn memcheck
    sanitize racecheck cudnn "-tc=*cuDNN*"
    verdict cudnn racecheck
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ] || [ "$MODE" = attention ]; then
    step bench_attention ./build-gpu/bench_attention --json "$GPU_OUT/attention.json" > "$GPU_OUT/attention.log" 2>&1
    step bench_torch_attention env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_attention.py \
        --ours "$GPU_OUT/attention.json" --out "$GPU_OUT/torch_attention.json" --markdown "$GPU_OUT/attention.md" \
        > "$GPU_OUT/torch_attention.log" 2>&1
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    step bench_norms ./build-gpu/bench_norms --reference --json "$GPU_OUT/bench.json" --csv "$GPU_OUT/bench.csv" \
        > "$GPU_OUT/bench.log" 2>&1
    step bench_torch_norms env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_norms.py --ours "$GPU_OUT/bench.json" \
        --out "$GPU_OUT/compare.json" --markdown "$GPU_OUT/table.md" > "$GPU_OUT/compare.log" 2>&1
    step bench_ops ./build-gpu/bench_ops --json "$GPU_OUT/ops.json" > "$GPU_OUT/ops.log" 2>&1
fi
if [ "$MODE" = fused-norm ]; then
    { ./build-gpu/normtape_tests -ts=fused_norm,layer_norm,rms_norm,cast && ./build-gpu/normtape_tests -ts=cuda -tc='*norm*'; } \
        > "$GPU_OUT/fused_norm_tests.log" 2>&1
    rc=$?
    summary+=("fused norm tests: exit $rc, $(grep -E '^\[doctest\] test cases' "$GPU_OUT/fused_norm_tests.log" | paste -sd ';')")
    [ $rc -eq 0 ] || { failed=1; grep -E -A12 "ERROR" "$GPU_OUT/fused_norm_tests.log" | head -40; }
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ] || [ "$MODE" = fused-norm ]; then
    step bench_norms_fused ./build-gpu/bench_norms --hold --rows 16384 --n 768 1024 4096 8192 --dtype bf16 \
        --json "$GPU_OUT/fused_norm.json" > "$GPU_OUT/fused_norm.log" 2>&1
    step bench_torch_fused_norm env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_fused_norm.py \
        --ours "$GPU_OUT/fused_norm.json" --out "$GPU_OUT/fused_norm_compare.json" \
        --markdown "$GPU_OUT/fused_norm.md" > "$GPU_OUT/fused_norm_compare.log" 2>&1
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
    # 12 steps: the phase medians (forward, backward, optimizer) leave out the first two.
    # The three policies with GELU recompute (the default), then without it.
    step "medium preset" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy all --steps 12 --log-every 1 \
        --json "$GPU_OUT/medium.json" --chart "$GPU_OUT/medium.svg" > "$GPU_OUT/medium.log" 2>&1
    step "medium preset, no GELU recompute" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy all \
        --recompute-activation off --steps 12 --log-every 1 --json "$GPU_OUT/medium_saved_gelu.json" \
        --chart "$GPU_OUT/medium_saved_gelu.svg" > "$GPU_OUT/medium_saved_gelu.log" 2>&1
    for mode in eager compile; do
        step "bench_torch_gpt $mode" env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_gpt.py \
            --ours "$GPU_OUT/medium.json" $([ $mode = compile ] && echo --compile) \
            --json "$GPU_OUT/torch_gpt_$mode.json" > "$GPU_OUT/torch_gpt_$mode.log" 2>&1
    done
    # The saved bytes at a fixed number of tokens do not depend on T (nothing T x T is saved).
    fixed_tokens() {
        local a b
        a=$(./build-gpu/train_gpt --device cuda --data random --batch 8 --seq 128 --steps 2 --policy both \
            --json "$GPU_OUT/tokens_8x128.json" --chart "$GPU_OUT/tokens_8x128.svg" | grep "saved activation bytes (tape)")
        b=$(./build-gpu/train_gpt --device cuda --data random --batch 4 --seq 256 --steps 2 --policy both \
            --json "$GPU_OUT/tokens_4x256.json" --chart "$GPU_OUT/tokens_4x256.svg" | grep "saved activation bytes (tape)")
        printf 'B=8 T=128: %s\nB=4 T=256: %s\n' "$a" "$b" > "$GPU_OUT/fixed_tokens.log"
        [ -n "$a" ] && [ "$a" = "$b" ]
    }
    step "saved bytes, B*T fixed" fixed_tokens
    step "tinyshakespeare bf16" ./build-gpu/train_gpt --device cuda --data data/tinyshakespeare.txt --policy all \
        --steps 300 --log-every 50 --json "$GPU_OUT/shakespeare.json" --chart "$GPU_OUT/shakespeare.svg" \
        > "$GPU_OUT/shakespeare.log" 2>&1
fi

# nanoGPT's config/train_shakespeare_char.py in train_gpt's flags (README, "Training on Shakespeare"),
# then the same model, data and schedule in PyTorch eager.
if [ "$MODE" = nanogpt ]; then
    step "nanoGPT GPU config, train_gpt" ./build-gpu/train_gpt --device cuda --dtype bf16 --layers 6 --heads 6 \
        --embd 384 --seq 256 --batch 64 --steps 5000 --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --dropout 0.2 \
        --policy input --eval-every 250 --eval-batches 100 --log-every 250 --sample 600 \
        --json "$GPU_OUT/nanogpt.json" --chart "$GPU_OUT/nanogpt.svg" > "$GPU_OUT/nanogpt.log" 2>&1
    step "nanoGPT GPU config, PyTorch" env PYTHONUNBUFFERED=1 python3 scripts/train_torch_shakespeare.py \
        --preset nanogpt-gpu --eval-batches 100 --json "$GPU_OUT/nanogpt_torch.json" > "$GPU_OUT/nanogpt_torch.log" 2>&1
    summary+=("ours:    $(grep -E 'validation: best loss' "$GPU_OUT/nanogpt.log")")
    summary+=("PyTorch: $(tail -1 "$GPU_OUT/nanogpt_torch.log")")
fi

# The decoders at nanoGPT's GPU size, same data, steps and schedule: train_gpt (every policy, each
# checked against predicted_saved_bytes) and PyTorch eager, per architecture.
if [ "$MODE" = decoders ]; then
    for arch in gpt2 nanochat llama; do
        kv=0
        [ "$arch" = gpt2 ] || kv=2
        step "decoders, $arch, train_gpt" ./build-gpu/train_gpt --device cuda --dtype bf16 --arch "$arch" \
            --kv-heads "$kv" --layers 6 --heads 6 --embd 384 --seq 256 --batch 64 --steps 2500 --lr 1e-3 \
            --min-lr 1e-4 --warmup 100 --beta2 0.99 --dropout 0.2 --policy all --eval-every 250 --eval-batches 100 \
            --log-every 500 --json "$GPU_OUT/decoders_$arch.json" --chart "$GPU_OUT/decoders_$arch.svg" \
            > "$GPU_OUT/decoders_$arch.log" 2>&1
        step "decoders, $arch, PyTorch" env PYTHONUNBUFFERED=1 python3 scripts/train_torch_shakespeare.py \
            --preset nanogpt-gpu --arch "$arch" --kv-heads "$kv" --steps 2500 --eval-batches 100 \
            --json "$GPU_OUT/decoders_${arch}_torch.json" > "$GPU_OUT/decoders_${arch}_torch.log" 2>&1
        summary+=("$arch ours:    $(grep -E 'validation: best loss' "$GPU_OUT/decoders_$arch.log" | tr '\n' ' ')")
        summary+=("$arch PyTorch: $(tail -1 "$GPU_OUT/decoders_${arch}_torch.log")")
    done
fi

# The preset's step beside PyTorch eager's and torch.compile's (the same model, batch and AdamW).
if [ "$MODE" = step ]; then
    step "preset, normalized" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy normalized --steps 12 \
        --log-every 4 --json "$GPU_OUT/step_normalized.json" > "$GPU_OUT/step_normalized.log" 2>&1
    step "preset, input, no GELU recompute" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy input \
        --recompute-activation off --steps 12 --log-every 4 --json "$GPU_OUT/step_input.json" \
        > "$GPU_OUT/step_input.log" 2>&1
    for mode in eager compile; do
        step "bench_torch_gpt $mode" env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_gpt.py \
            --ours "$GPU_OUT/step_normalized.json" $([ $mode = compile ] && echo --compile) \
            --json "$GPU_OUT/torch_gpt_$mode.json" > "$GPU_OUT/torch_gpt_$mode.log" 2>&1
    done
fi

# This tree's train_gpt beside BASELINE_SRC's, alternated so that both see the GPU in the same state.
if [ "$MODE" = baseline ]; then
    for k in 1 2 3; do
        for tree in baseline gpu; do
            step "preset $tree $k" ./build-$tree/train_gpt --preset gpt2-medium-ish --policy all --steps 30 --log-every 10 \
                --json "$GPU_OUT/preset_${tree}_$k.json" > "$GPU_OUT/preset_${tree}_$k.log" 2>&1
            step "dropout $tree $k" ./build-$tree/train_gpt --data data/tinyshakespeare.txt --device cuda \
                --dtype bf16 --dropout 0.1 --policy all --steps 200 --log-every 50 --json "$GPU_OUT/dropout_${tree}_$k.json" \
                > "$GPU_OUT/dropout_${tree}_$k.log" 2>&1
        done
    done
    step compare_runs python3 scripts/compare_runs.py "$GPU_OUT" > "$GPU_OUT/baseline.md" 2>&1
    cat "$GPU_OUT/baseline.md"
fi

# Muon on the GPU: its tests (newton_schulz and the step against the cpu and f64, the PyTorch
# reference, checkpoints, the step's predicted memory) and memcheck over them; its step on the preset's
# matrices against the products alone (bench_muon); the preset's step with each optimizer.
if [ "$MODE" = muon ]; then
    step "muon tests" ./build-gpu/normtape_tests "-tc=*muon*,*Muon*,checkpoint*,memory_plan*" \
        > "$GPU_OUT/muon_tests.log" 2>&1
    summary+=("muon tests: $(grep -E '^\[doctest\] test cases' "$GPU_OUT/muon_tests.log")")
    sanitize memcheck muon "-tc=muon*"
    verdict muon memcheck
    step bench_muon ./build-gpu/bench_muon --json "$GPU_OUT/bench_muon.json" > "$GPU_OUT/bench_muon.log" 2>&1
    for optimizer in adamw muon; do
        step "preset, $optimizer" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy normalized --steps 12 \
            --log-every 4 --optimizer $optimizer --json "$GPU_OUT/muon_preset_$optimizer.json" \
            --chart "$GPU_OUT/muon_preset_$optimizer.svg" > "$GPU_OUT/muon_preset_$optimizer.log" 2>&1
        summary+=("preset, $optimizer: $(grep -E 'median per step' "$GPU_OUT/muon_preset_$optimizer.log")")
        summary+=("preset, $optimizer: $(grep -E 'optimizer state:' "$GPU_OUT/muon_preset_$optimizer.log")")
    done
    summary+=("$(tail -3 "$GPU_OUT/bench_muon.log" | tr '\n' ';')")
fi

# The dry run (core/dry_run.h): its tests on the GPU, then the preset's step, measured by train_gpt
# against predict_peak's dry run of the same step: every one equal to the byte but offload's (a bound).
if [ "$MODE" = dryrun ]; then
    step "dry-run tests" ./build-gpu/normtape_tests "-ts=dry_run,memory_plan" > "$GPU_OUT/dryrun_tests.log" 2>&1
    summary+=("dry-run tests: $(grep -E '^\[doctest\] (test cases|assertions)' "$GPU_OUT/dryrun_tests.log" | tr '\n' ' ')")
    runs=("--policy input --recompute-activation off" "--policy normalized" "--policy output --fused-loss on"
          "--policy normalized --checkpoint blocks" "--policy input --micro-batch 4"
          "--policy normalized --optimizer muon" "--policy normalized --offload on")
    for i in "${!runs[@]}"; do
        # shellcheck disable=SC2086
        step "preset ${runs[$i]}" ./build-gpu/train_gpt --preset gpt2-medium-ish --steps 2 ${runs[$i]} \
            --json "$GPU_OUT/dry_$i.json" > "$GPU_OUT/dry_$i.log" 2>&1
    done
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
        step "2 GPUs, ZeRO-1" python3 -m torch.distributed.run --standalone --no-python --nproc-per-node 2 \
            ./build-gpu/train_gpt --preset gpt2-medium-ish --steps 2 --policy normalized --optimizer muon \
            --shard-optimizer on --json "$GPU_OUT/dry_dp.json" > "$GPU_OUT/dry_dp.log" 2>&1
    fi
    python3 - "$GPU_OUT" "${runs[@]}" <<'PY' | tee "$GPU_OUT/dryrun.txt"
import json, os, sys
out, runs = sys.argv[1], sys.argv[2:]
for name, label in [(f"dry_{i}", r) for i, r in enumerate(runs)] + [("dry_dp", "ZeRO-1, 2 GPUs, muon, rank 0")]:
    if not os.path.exists(f"{out}/{name}.json"):
        continue
    r = json.load(open(f"{out}/{name}.json"))["runs"][0]
    m, p = r["peak_allocated_bytes"], r["predicted_peak_bytes"]
    print(f"{label}: measured {m} predicted {p} {'equal' if m == p else f'differ by {p - m}'}")
PY
    step bench_dry_run ./build-gpu/bench_dry_run --real-steps 1 --repeat 3 --json "$GPU_OUT/bench_dry_run.json" \
        > "$GPU_OUT/bench_dry_run.log" 2>&1
    summary+=("bench_dry_run: $(tail -1 "$GPU_OUT/bench_dry_run.log")")
fi

# Data parallel on every GPU of the machine (torchrun --no-python, one process per GPU; NCCL): the
# distributed tests on one GPU, then the preset's step on one GPU and on all of them, plain and
# with the optimizer state sharded (ZeRO-1), AdamW and Muon. --batch is each GPU's.
if [ "$MODE" = distributed ]; then
    gpus=$(nvidia-smi -L | wc -l)
    step "distributed tests" ./build-gpu/normtape_tests "-tc=*distributed*,*rendezvous*,*post-accumulate*" \
        > "$GPU_OUT/distributed_tests.log" 2>&1
    summary+=("distributed tests: $(grep -E '^\[doctest\] test cases' "$GPU_OUT/distributed_tests.log")")
    preset=(--preset gpt2-medium-ish --policy normalized --steps 16 --log-every 4)
    for optimizer in adamw muon; do
        step "one GPU, $optimizer" ./build-gpu/train_gpt "${preset[@]}" --optimizer $optimizer \
            --json "$GPU_OUT/dp1_$optimizer.json" --chart "$GPU_OUT/dp1.svg" > "$GPU_OUT/dp1_$optimizer.log" 2>&1
        for shard in off on; do
            step "$gpus GPUs, $optimizer, shard $shard" python3 -m torch.distributed.run --standalone --no-python \
                --nproc-per-node "$gpus" ./build-gpu/train_gpt "${preset[@]}" --optimizer $optimizer \
                --shard-optimizer $shard --json "$GPU_OUT/dp${gpus}_${optimizer}_$shard.json" \
                --chart "$GPU_OUT/dp.svg" > "$GPU_OUT/dp${gpus}_${optimizer}_$shard.log" 2>&1
        done
        for f in "$GPU_OUT"/dp1_$optimizer.log "$GPU_OUT"/dp${gpus}_${optimizer}_*.log; do
            summary+=("$(basename "$f" .log): $(grep -E 'median per step|optimizer state:|peak allocated' "$f" | tr '\n' ' ')")
        done
    done
    # A ZeRO-1 checkpoint of step 8 written by both GPUs, resumed on one GPU (32 rows a step) and on
    # both: their last losses beside the run that never stopped.
    step "$gpus GPUs, checkpoint at step 8" python3 -m torch.distributed.run --standalone --no-python \
        --nproc-per-node "$gpus" ./build-gpu/train_gpt "${preset[@]}" --optimizer muon --shard-optimizer on --stop-at 8 \
        --save "$GPU_OUT/dp_ck.safetensors" --chart "$GPU_OUT/dp.svg" > "$GPU_OUT/dp_ck.log" 2>&1
    step "resumed on one GPU" ./build-gpu/train_gpt --resume "$GPU_OUT/dp_ck.safetensors" --log-every 4 \
        --chart "$GPU_OUT/dp.svg" > "$GPU_OUT/dp_resumed1.log" 2>&1
    step "resumed on $gpus GPUs" python3 -m torch.distributed.run --standalone --no-python --nproc-per-node "$gpus" \
        ./build-gpu/train_gpt --resume "$GPU_OUT/dp_ck.safetensors" --shard-optimizer on --log-every 4 \
        --chart "$GPU_OUT/dp.svg" > "$GPU_OUT/dp_resumed$gpus.log" 2>&1
    for f in dp${gpus}_muon_on dp_resumed1 dp_resumed$gpus; do
        summary+=("$f: $(grep -E 'step +16/16' "$GPU_OUT/$f.log")")
    done
    # Started by mpirun instead, every parameter compared across the ranks after each step.
    if command -v mpirun > /dev/null; then
        step "mpirun, $gpus GPUs, replicas checked" mpirun --allow-run-as-root -np "$gpus" ./build-gpu/train_gpt \
            "${preset[@]}" --steps 4 --optimizer muon --shard-optimizer on --check-replicas --chart "$GPU_OUT/dp.svg" \
            > "$GPU_OUT/dp_mpirun.log" 2>&1
        summary+=("mpirun: $(grep -E 'data parallel:|step +4/' "$GPU_OUT/dp_mpirun.log" | tr '\n' ' ')")
    fi
    python3 - "$GPU_OUT" "$gpus" <<'PY' | tee "$GPU_OUT/distributed.txt"
import json, sys
out, gpus = sys.argv[1], sys.argv[2]
for opt in ("adamw", "muon"):
    one = json.load(open(f"{out}/dp1_{opt}.json"))["runs"][0]
    for shard in ("off", "on"):
        try:
            many = json.load(open(f"{out}/dp{gpus}_{opt}_{shard}.json"))["runs"][0]
        except OSError:
            print(f"{opt} shard {shard}: no JSON (the run failed)"); continue
        st, st1 = many["optimizer_state"], one["optimizer_state"]
        state = lambda s: s["adamw_moment_bytes"] + s["muon_momentum_bytes"]
        predicted = st["predicted_adamw_moment_bytes"] + st["predicted_muon_momentum_bytes"]
        print(f"{opt} shard {shard}: tokens/s {many['tokens_per_s']:.0f} on {gpus} GPUs vs {one['tokens_per_s']:.0f} "
              f"on one: {many['tokens_per_s'] / one['tokens_per_s']:.2f}x; optimizer state per rank {state(st)} "
              f"(predicted {predicted}) vs {state(st1)} on one GPU: {state(st) / state(st1):.3f}")
PY
fi

# nanoGPT's Shakespeare GPU configuration (the nanogpt mode's flags, evaluated every 100 steps) per
# architecture and optimizer, stopped at step 2500 of the 5000-step schedule (the AdamW runs'
# validation loss is best near step 2000, then they overfit).
if [ "$MODE" = muon-shakespeare ]; then
    for arch in gpt2 nanochat llama; do
        kv=0
        [ "$arch" = gpt2 ] || kv=2
        for optimizer in adamw muon; do
            [ "${MUON_RUNS:-both}" = torch ] && break
            step "shakespeare, $arch, $optimizer, train_gpt" ./build-gpu/train_gpt --device cuda --dtype bf16 \
                --arch "$arch" --kv-heads "$kv" --layers 6 --heads 6 --embd 384 --seq 256 --batch 64 --steps 5000 \
                --stop-at 2500 --lr 1e-3 --min-lr 1e-4 --warmup 100 --dropout 0.2 --policy input \
                $([ "$optimizer" = adamw ] && echo --beta2 0.99) --optimizer "$optimizer" --eval-every 100 --eval-batches 100 --log-every 500 \
                --json "$GPU_OUT/muon_${arch}_$optimizer.json" --chart "$GPU_OUT/muon_${arch}_$optimizer.svg" \
                > "$GPU_OUT/muon_${arch}_$optimizer.log" 2>&1
        done
        [ "${MUON_RUNS:-both}" = ours ] && continue
        step "shakespeare, $arch, muon, PyTorch" env PYTHONUNBUFFERED=1 python3 scripts/train_torch_shakespeare.py \
            --preset nanogpt-gpu --arch "$arch" --kv-heads "$kv" --stop-at 2500 --eval-every 100 --eval-batches 100 \
            --optimizer muon --json "$GPU_OUT/muon_${arch}_muon_torch.json" > "$GPU_OUT/muon_${arch}_muon_torch.log" 2>&1
    done
    python3 scripts/muon_report.py "$GPU_OUT" --markdown "$GPU_OUT/muon.md" --svg "$GPU_OUT/muon_shakespeare.svg" \
        > "$GPU_OUT/muon_report.log" 2>&1
    summary+=("$(cat "$GPU_OUT/muon_report.log")")
fi

# The preset's saved bytes and step time: as it is, with the blocks' saved tensors in pinned host
# memory, and with the blocks checkpointed (train_gpt exits 1 if those bytes differ from the formula).
if [ "$MODE" = memory ]; then
    for run in plain "offload --offload on" "checkpoint --checkpoint blocks" \
               "offload_checkpoint --offload on --checkpoint blocks"; do
        read -r name flags <<<"$run"
        # shellcheck disable=SC2086
        step "preset, $name" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy all --steps 12 --log-every 4 \
            --memory-report $flags --json "$GPU_OUT/memory_$name.json" --chart "$GPU_OUT/memory_$name.svg" \
            > "$GPU_OUT/memory_$name.log" 2>&1
    done
fi

# The fused head loss on the GPU: its tests, then the preset under Normalized + GELU recompute with
# the loss unfused and fused, beside PyTorch eager's and torch.compile's step on the same GPU.
if [ "$MODE" = budget ]; then
    step "fused loss tests" ./build-gpu/normtape_tests \
        "-tc=linear_cross_entropy*,*fused*,memory: every preset*,hf: on cuda*" > "$GPU_OUT/budget_tests.log" 2>&1
    summary+=("fused loss tests: $(grep -E '^\[doctest\] test cases' "$GPU_OUT/budget_tests.log")")
    for fused in off on; do
        step "preset, fused loss $fused" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy normalized --steps 12 \
            --log-every 4 --fused-loss $fused --json "$GPU_OUT/budget_fused_$fused.json" \
            --chart "$GPU_OUT/budget_fused_$fused.svg" > "$GPU_OUT/budget_fused_$fused.log" 2>&1
    done
    step "bench_ops head loss" ./build-gpu/bench_ops --head-loss --dtype bf16 --json "$GPU_OUT/head_loss.json" \
        > "$GPU_OUT/head_loss.log" 2>&1
fi

# PyTorch eager's and torch.compile's step of the preset (budget and sweep), then (sweep) every
# memory setting of the preset timed for 3 steps, their peaks against predict_peak, the Pareto chart
# with PyTorch's two points.
if [ "$MODE" = budget ] || [ "$MODE" = sweep ]; then
    for mode in eager compile; do
        [ "$MODE" = sweep ] && [ -f "$GPU_OUT/torch_gpt_$mode.json" ] && continue  # given, from the same GPU
        step "bench_torch_gpt $mode" env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_gpt.py \
            $([ -f "$GPU_OUT/budget_fused_on.json" ] && echo --ours "$GPU_OUT/budget_fused_on.json") \
            $([ $mode = compile ] && echo --compile) --json "$GPU_OUT/torch_gpt_$mode.json" \
            > "$GPU_OUT/torch_gpt_$mode.log" 2>&1
    done
fi
if [ "$MODE" = sweep ]; then
    step "memory sweep" ./build-gpu/train_gpt --preset gpt2-medium-ish --steps 3 --memory-sweep \
        --sweep-reference "$GPU_OUT/torch_gpt_eager.json" --sweep-reference "$GPU_OUT/torch_gpt_compile.json" \
        --json "$GPU_OUT/sweep.json" --chart "$GPU_OUT/sweep.svg" > "$GPU_OUT/sweep.log" 2>&1
    python3 scripts/memory_sweep_report.py "$GPU_OUT/sweep.json" > "$GPU_OUT/sweep_report.txt" 2>&1
fi

# graph_curves: 100 bf16 steps on data/tinyshakespeare.txt with --cuda-graph off and on; fails
# unless the two loss curves are equal bit for bit.
graph_curves() {
    for g in off on; do
        step "shakespeare, graph $g" ./build-gpu/train_gpt --data data/tinyshakespeare.txt --steps 100 --policy normalized \
            --cuda-graph $g --log-every 50 --json "$GPU_OUT/graph_curve_$g.json" --chart "$GPU_OUT/graph_curve_$g.svg" \
            > "$GPU_OUT/graph_curve_$g.log" 2>&1
    done
    step "curves equal" python3 -c "import json,sys; a,b=(json.load(open(sys.argv[i]))['runs'][0]['losses'] for i in (1,2)); \
print('loss curves, graph off and on:', 'equal bit for bit' if a==b else 'DIFFER at step %d' % next(i for i in range(len(a)) if a[i]!=b[i])); sys.exit(a!=b)" \
        "$GPU_OUT/graph_curve_off.json" "$GPU_OUT/graph_curve_on.json" > "$GPU_OUT/graph_curves.txt"
    cat "$GPU_OUT/graph_curves.txt"
}
if [ "$MODE" = graph ]; then
    (cd build-gpu && ctest -j 4 --output-on-failure -R "cuda_graph|AdamW|muon:|dry" > "$GPU_OUT/graph_tests.log" 2>&1)
    summary+=("graph and optimizer tests: $(grep -E 'tests passed|tests failed' "$GPU_OUT/graph_tests.log" | tail -1)")
    grep -q "100% tests passed" "$GPU_OUT/graph_tests.log" || { failed=1; grep -E -A12 "ERROR|Failed" "$GPU_OUT/graph_tests.log" | head -60; }
    graph_curves
    gpt2=(--layers 12 --heads 12 --embd 768 --seq 1024 --batch 16 --vocab 50304 --tie on --data random)
    for round in 1 2; do
        for g in off on; do
            step "gpt2 124M, graph $g ($round)" ./build-gpu/train_gpt "${gpt2[@]}" --policy normalized --steps 30 \
                --log-every 10 --cuda-graph $g --json "$GPU_OUT/graph_gpt2_${g}_$round.json" --chart "$GPU_OUT/graph.svg" \
                > "$GPU_OUT/graph_gpt2_${g}_$round.log" 2>&1
            step "preset, graph $g ($round)" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy normalized --steps 20 \
                --log-every 10 --cuda-graph $g --json "$GPU_OUT/graph_preset_${g}_$round.json" --chart "$GPU_OUT/graph.svg" \
                > "$GPU_OUT/graph_preset_${g}_$round.log" 2>&1
        done
    done
    if [ -n "${LLMC_SRC:-}" ]; then
        step "llm.c beside train_gpt" scripts/bench_llmc.sh "$LLMC_SRC" "$CUDNN_FRONTEND" build-gpu/train_gpt "$GPU_OUT/llmc" \
            > "$GPU_OUT/llmc.log" 2>&1
    fi
    python3 - "$GPU_OUT" > "$GPU_OUT/graph_steps.txt" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/graph_*_o*_[12].json")):
    r = json.load(open(f))["runs"][0]
    mfu = "%.1f%%" % (100 * r["mfu"]) if r.get("mfu") is not None else "-"
    print("%-28s median step %8.2f ms  peak allocated %6.0f MiB  reserved %6.0f MiB  MFU %s" % (
        f.split("/")[-1][:-5], r["step_ms_median"], r["peak_allocated_bytes"] / 2**20, r["peak_reserved_bytes"] / 2**20, mfu))
PY
fi

# nanoGPT's Shakespeare run on bytes and on a BPE's ids (4,096 tokens trained on the training split).
if [ "$MODE" = bpe ]; then
    step "train_tokenizer" ./build-gpu/train_tokenizer --data data/tinyshakespeare.txt --out "$GPU_OUT/shakespeare4096" \
        --vocab 4096 > "$GPU_OUT/train_tokenizer.log" 2>&1
    for run in bytes bpe; do
        step "nanoGPT GPU config, $run" ./build-gpu/train_gpt --device cuda --dtype bf16 --layers 6 --heads 6 \
            --embd 384 --seq 256 --batch 64 --steps 5000 --lr 1e-3 --min-lr 1e-4 --warmup 100 --beta2 0.99 --dropout 0.2 \
            --policy input --eval-every 250 --eval-batches 100 --log-every 250 \
            $([ $run = bpe ] && echo --tokenizer "$GPU_OUT/shakespeare4096.tiktoken") \
            --json "$GPU_OUT/shakespeare_$run.json" --chart "$GPU_OUT/shakespeare_$run.svg" > "$GPU_OUT/shakespeare_$run.log" 2>&1
        summary+=("$run: $(grep -E 'validation: best loss' "$GPU_OUT/shakespeare_$run.log")")
    done
    python3 - "$GPU_OUT" > "$GPU_OUT/bpe.txt" <<'PY'
import json, sys
for run in ("bytes", "bpe"):
    r = json.load(open(f"{sys.argv[1]}/shakespeare_{run}.json"))["runs"][0]
    best = min(range(len(r["val_bpb"])), key=lambda i: r["val_bpb"][i])
    print(f"{run:5}: best held-out {r['val_bpb'][best]:.4f} bits per byte ({r['val_losses'][best]:.4f} nats per token, "
          f"{r['val_bytes_per_token']:.3f} bytes per token) at step {r['val_steps'][best]}; last {r['val_bpb'][-1]:.4f}; "
          f"{r['train_seconds']:.1f} s")
PY
    cat "$GPU_OUT/train_tokenizer.log" "$GPU_OUT/bpe.txt"
fi

# The step's speed targets, each measured beside its reference in this call.
if [ "$MODE" = targets ]; then
    graph_curves
    step bench_attention ./build-gpu/bench_attention --json "$GPU_OUT/attention.json" > "$GPU_OUT/attention.log" 2>&1
    step bench_torch_attention env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_attention.py \
        --ours "$GPU_OUT/attention.json" --out "$GPU_OUT/torch_attention.json" --markdown "$GPU_OUT/attention.md" \
        > "$GPU_OUT/torch_attention.log" 2>&1
    step bench_muon ./build-gpu/bench_muon --json "$GPU_OUT/bench_muon.json" > "$GPU_OUT/bench_muon.log" 2>&1
    summary+=("$(tail -4 "$GPU_OUT/bench_muon.log" | tr '\n' ';')")
    for g in off on; do
        step "preset, graph $g" ./build-gpu/train_gpt --preset gpt2-medium-ish --policy normalized --steps 20 \
            --log-every 10 --cuda-graph $g --json "$GPU_OUT/step_graph_$g.json" > "$GPU_OUT/step_graph_$g.log" 2>&1
        summary+=("preset, graph $g: $(grep -E 'median per step' "$GPU_OUT/step_graph_$g.log")")
    done
    for mode in eager compile; do
        step "bench_torch_gpt $mode" env PYTHONUNBUFFERED=1 python3 scripts/bench_torch_gpt.py \
            --ours "$GPU_OUT/step_graph_off.json" $([ $mode = compile ] && echo --compile) \
            --json "$GPU_OUT/torch_gpt_$mode.json" > "$GPU_OUT/torch_gpt_$mode.log" 2>&1
    done
    python3 - "$GPU_OUT" > "$GPU_OUT/targets.txt" <<'PY'
import json, sys
d = sys.argv[1]
ours = {g: json.load(open(f"{d}/step_graph_{g}.json"))["runs"][0] for g in ("off", "on")}
for mode in ("eager", "compile"):
    t = json.load(open(f"{d}/torch_gpt_{mode}.json"))
    print(f"preset step: torch {mode} {t['step_ms']:.2f} ms, peak over base {t['fwd_bwd_peak_over_base_bytes'] / 2**20:.1f} MiB; "
          + "; ".join(f"ours graph {g} {r['step_ms_median']:.2f} ms ({r['step_ms_median'] / t['step_ms']:.3f}x)" for g, r in ours.items()))
PY
    if [ -n "${LLMC_SRC:-}" ]; then
        step "llm.c beside train_gpt" scripts/bench_llmc.sh "$LLMC_SRC" "$CUDNN_FRONTEND" build-gpu/train_gpt "$GPU_OUT/llmc" \
            > "$GPU_OUT/llmc.log" 2>&1
    fi
fi

if [ "$MODE" = profile ]; then
    if scripts/profile_step.sh build-gpu "$GPU_OUT" > "$GPU_OUT/profile.log" 2>&1; then summary+=("profile: ok"); else
        summary+=("profile: FAILED"); failed=1; fi
fi

echo "==================== summary"
printf '%s\n' "${summary[@]}"
cat "$GPU_OUT/crosscheck.txt" 2>/dev/null
cat "$GPU_OUT/compare.log" 2>/dev/null
for f in medium medium_saved_gelu shakespeare; do
    [ -f "$GPU_OUT/$f.log" ] && { echo "--- $f"; grep -vE "^\[(input|output|normalized) *\] step" "$GPU_OUT/$f.log" | tail -20; }
done
[ -f "$GPU_OUT/ops.log" ] && { echo "--- cross-entropy, gelu, add: % of copy"; grep -E "%|copy" "$GPU_OUT/ops.log" | tail -30; }
[ -f "$GPU_OUT/fixed_tokens.log" ] && { echo "--- saved bytes at a fixed number of tokens"; cat "$GPU_OUT/fixed_tokens.log"; }
[ -f "$GPU_OUT/attention.md" ] && { echo "--- attention, ms (ours / torch below 1: ours faster)"; cat "$GPU_OUT/attention.md"; }
[ -f "$GPU_OUT/profile.log" ] && { echo "--- kernel time by category"; head -16 "$GPU_OUT/profile.log"; }
[ -f "$GPU_OUT/head_loss.log" ] && { echo "--- head loss, ms"; grep -E "head loss" "$GPU_OUT/head_loss.log"; }
[ -f "$GPU_OUT/sweep.log" ] && { echo "--- memory sweep"; grep -E "^.\*|memory sweep:|exceeds" "$GPU_OUT/sweep.log" | tail -40; }
[ -f "$GPU_OUT/sweep_report.txt" ] && cat "$GPU_OUT/sweep_report.txt"
[ -f "$GPU_OUT/graph_steps.txt" ] && { echo "--- steps with --cuda-graph off and on"; cat "$GPU_OUT/graph_curves.txt" "$GPU_OUT/graph_steps.txt"; }
[ -f "$GPU_OUT/targets.txt" ] && { echo "--- the preset's step beside PyTorch"; cat "$GPU_OUT/graph_curves.txt" "$GPU_OUT/targets.txt"; }
[ -f "$GPU_OUT/llmc.log" ] && { echo "--- GPT-2 124M beside llm.c"; tail -8 "$GPU_OUT/llmc.log"; }
for f in "$GPU_OUT"/budget_fused_*.log "$GPU_OUT"/step_*.log "$GPU_OUT"/torch_gpt_*.log; do
    [ -f "$f" ] && { echo "--- $(basename "$f" .log)"; grep -vE "^\[(input|output|normalized) *\] step" "$f" | tail -12; }
done
for f in "$GPU_OUT"/memory_*.log; do
    [ -f "$f" ] && { echo "--- $(basename "$f" .log)"; grep -vE "^\[(input|output|normalized) *\] step" "$f" | tail -25; }
done
exit $failed
