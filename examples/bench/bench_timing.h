// examples/bench/bench_timing.h: the timing loop of the GPU benchmarks (bench_norms, bench_attention,
// bench_ops): the median, in ms, of runs of a function on device 0's normtape stream.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"

// Median time in ms of `fn` on device 0's stream: `repeats` runs queued back to back, each
// between its own pair of CUDA events, after `warmup` runs. With `hold`, the runs are queued behind
// a host function that keeps the stream waiting 2 ms per run, so that the time the host takes to
// queue them (launch overhead) is not timed; a run that waits on the GPU itself (a copy to the
// host) ends the wait early and is timed with its gaps.
inline double time_ms(const std::function<void()>& fn, int warmup = 3, int repeats = 20, bool hold = true) {
    cudaStream_t stream = normtape::cuda::stream(0);
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<cudaEvent_t> events(2 * repeats);
    for (cudaEvent_t& e : events) CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    static int hold_ms = 0;  // static: outlives this call should a check below throw before the wait ran
    if (hold) {
        hold_ms = 2 * repeats;
        auto wait = [](void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); };
        CUDA_CHECK(cudaLaunchHostFunc(stream, wait, &hold_ms));
    }
    for (int i = 0; i < repeats; ++i) {
        CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
        fn();
        CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> times;
    for (int i = 0; i < repeats; ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
        times.push_back(ms);
    }
    for (cudaEvent_t e : events) CUDA_CHECK(cudaEventDestroy(e));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}
