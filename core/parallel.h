// core/parallel.h: how many threads the cpu kernels run on (set_num_threads, get_num_threads,
// as torch.set_num_threads), and the two loops through which every cpu kernel that uses more
// than one thread runs: detail::parallel_for and detail::parallel_reduce (internal). Threads come
// from OpenMP where the library was built with it (core/parallel.cpp); without it everything runs
// on the calling thread. Not here: the CUDA backend, which has its own stream (core/device.h).
// (Kept to C++17: the .cu files include this header through include/normtape.h.)
//
// Note [Deterministic parallel cpu kernels]
// Every cpu result has the same bits at any number of threads. A loop's range is cut into
// chunks whose boundaries depend only on the range and the loop's grain, never on the number of
// threads; threads decide only which chunk runs where. Each output element is written by one
// chunk, computed as on one thread. A reduction (a column sum, a loss's mean, a gradient norm)
// sums each chunk into an accumulator of its own, started at zero, and then adds the chunks'
// accumulators in chunk order on the calling thread (parallel_reduce). Matrix products cut the
// output into blocks of a fixed number of rows, each a single-threaded Eigen product; Eigen's
// own threading, whose blocking depends on the thread count, is off (ops/matmul.cpp). Tests:
// tests/test_parallel.cpp compares every op's bits at 1, 2, 3 and 4 threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace normtape {

// Sets how many threads the cpu kernels use from now on, for the whole process (every calling
// thread): n >= 1. The default is OpenMP's: OMP_NUM_THREADS if set, else one per core. The
// results do not depend on it (Note [Deterministic parallel cpu kernels]); only the speed does.
// In a build without OpenMP the value is checked and ignored: the kernels run on one thread.
// Throws Error if n < 1.
void set_num_threads(int n);

// The number of threads the cpu kernels use: what set_num_threads() last set, else OpenMP's
// default (OMP_NUM_THREADS, else the number of cores); 1 in a build without OpenMP. Throws nothing.
int get_num_threads();

namespace detail {

// ---- Internal: the loops of the cpu kernels (Note [Deterministic parallel cpu kernels]) ----------

// A grain that keeps a cheap elementwise loop of fewer elements on one thread: below about this
// many elements, waking a second thread costs more than it saves.
constexpr int64_t kGrain = 32768;

// The most accumulators parallel_reduce keeps (its chunks grow beyond the grain past this).
constexpr int64_t kMaxReduceChunks = 64;

// Calls body(ctx, k) for every chunk k in [0, num_chunks), on up to get_num_threads() threads;
// on the calling thread alone when there is one chunk, one thread, or when called from inside a
// parallel region (nested loops do not spawn threads). If chunks throw, the exception of the
// lowest-numbered one that threw is rethrown on the calling thread after every thread has stopped
// (the one a single thread would have met first); chunks after it may or may not have run.
void run_chunks(int64_t num_chunks, void (*body)(void* ctx, int64_t chunk), void* ctx);

// Calls f(b, e) on consecutive chunks [b, e) that cover [begin, end): chunk k is
// [begin + k * grain, min(end, begin + (k + 1) * grain)). Chunks run on several threads, so f
// must write nothing that another chunk writes or reads. One chunk (end - begin <= grain) runs
// on the calling thread, with no thread started. grain >= 1.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
    if (end <= begin) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t num_chunks = (end - begin + grain - 1) / grain;
    if (num_chunks == 1) {
        f(begin, end);
        return;
    }
    struct Loop {
        const F* f;
        int64_t begin, end, grain;
    } loop{&f, begin, end, grain};
    run_chunks(num_chunks, [](void* ctx, int64_t k) {
        const Loop& l = *static_cast<const Loop*>(ctx);
        const int64_t b = l.begin + k * l.grain;
        (*l.f)(b, std::min(l.end, b + l.grain));
    }, &loop);
}

// The chunk length parallel_reduce uses for a range of n: the grain, or more where that would
// make more than kMaxReduceChunks chunks. A function of n and grain alone.
inline int64_t reduce_chunk(int64_t n, int64_t grain) {
    return std::max<int64_t>(std::max<int64_t>(grain, 1), (n + kMaxReduceChunks - 1) / kMaxReduceChunks);
}

// out[0 .. width) = the sum over the chunks of [begin, end), in chunk order, of what
// f(b, e, acc) adds into acc, a zeroed array of `width` doubles of the chunk's own; chunks are
// reduce_chunk(end - begin, grain) long. f may also write outputs of its own chunk, as
// parallel_for's f. out is overwritten (zeros for an empty range).
template <class F>
void parallel_reduce(int64_t begin, int64_t end, int64_t grain, int64_t width, double* out, const F& f) {
    std::fill(out, out + width, 0.0);
    if (end <= begin) return;
    const int64_t chunk = reduce_chunk(end - begin, grain);
    const int64_t num_chunks = (end - begin + chunk - 1) / chunk;
    if (num_chunks == 1) {
        f(begin, end, out);
        return;
    }
    std::vector<double> partial(static_cast<size_t>(num_chunks * width), 0.0);
    parallel_for(0, num_chunks, 1, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
            const int64_t b = begin + k * chunk;
            f(b, std::min(end, b + chunk), partial.data() + k * width);
        }
    });
    for (int64_t k = 0; k < num_chunks; ++k)
        for (int64_t j = 0; j < width; ++j) out[j] += partial[k * width + j];
}

}  // namespace detail

}  // namespace normtape
