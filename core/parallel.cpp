// core/parallel.cpp: the thread count and run_chunks(), the one OpenMP parallel region of the
// library (core/parallel.h, Note [Deterministic parallel cpu kernels]). Built without OpenMP
// (_OPENMP undefined), run_chunks runs every chunk on the calling thread.
#include "core/parallel.h"

#include <atomic>
#include <exception>
#include <mutex>

#include "core/check.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace normtape {

namespace {

// What set_num_threads() set; 0 until it is called (OpenMP's default then).
std::atomic<int> requested_threads{0};

}  // namespace

void set_num_threads(int n) {
    NT_CHECK(n >= 1, "set_num_threads: expected a number of threads >= 1, got ", n);
    requested_threads.store(n);
}

int get_num_threads() {
#ifdef _OPENMP
    const int n = requested_threads.load();
    return n > 0 ? n : omp_get_max_threads();
#else
    return 1;
#endif
}

void detail::run_chunks(int64_t num_chunks, void (*body)(void* ctx, int64_t chunk), void* ctx) {
#ifdef _OPENMP
    const int threads = static_cast<int>(std::min<int64_t>(get_num_threads(), num_chunks));
    if (threads > 1 && !omp_in_parallel()) {
        // An exception must not leave the parallel region: each is caught, the lowest chunk's kept.
        std::mutex mutex;
        std::exception_ptr error;
        std::atomic<int64_t> failed_chunk{num_chunks};
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t k = 0; k < num_chunks; ++k) {
            if (k > failed_chunk.load(std::memory_order_relaxed)) continue;
            try {
                body(ctx, k);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mutex);
                if (k < failed_chunk.load()) {
                    failed_chunk.store(k);
                    error = std::current_exception();
                }
            }
        }
        if (error) std::rethrow_exception(error);
        return;
    }
#endif
    for (int64_t k = 0; k < num_chunks; ++k) body(ctx, k);
}

}  // namespace normtape
