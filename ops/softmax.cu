// ops/softmax.cu: the CUDA kernels of softmax (ops/softmax.h) and their launchers. One block per
// row (blocks walk the rows when there are more rows than blocks): each thread visits the columns
// j = threadIdx.x, + blockDim.x, ..., and the block combines its threads' maxima and sums in a
// fixed order (block_max, block_sum: ops/cuda_common.cuh), so results are deterministic. The
// forward reads a row three times (max, sum of exponentials, output), as the cpu loop
// (ops/softmax.cpp) does; the backward twice (sum of dy * y, output). Arithmetic in acc_t<T>,
// rounded once on store; exp is CUDA's exp/expf, not __expf. No shared memory beyond the
// reductions' 32 values, no vector loads: simple, not tuned.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"

namespace normtape::detail {

namespace {

// Most blocks of a launch (as cuda::blocks_for).
constexpr int64_t kMaxRowBlocks = 65535 * 16;

// y [rows, N] = softmax of each row of x [rows, N]. m starts at -inf: a row of only -inf gives
// exp(-inf - -inf) = NaN, as on the cpu; fmax skips a NaN, which then makes the sum NaN.
template <class T>
__global__ void softmax_forward_kernel(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int64_t N) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * N;
        T* yr = y + r * N;
        A m = -INFINITY;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) m = max(m, A(xr[j]));
        m = block_max(m, shared);
        A s = 0;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) s += exp(A(xr[j]) - m);
        s = block_sum(s, shared);
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) yr[j] = static_cast<T>(exp(A(xr[j]) - m) / s);
    }
}

// dx [rows, N] = y * (dy - sum(dy * y)) for each row.
template <class T>
__global__ void softmax_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y,
                                        int64_t rows, int64_t N) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *gr = dy + r * N, *yr = y + r * N;
        T* dr = dx + r * N;
        A dot = 0;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) dot += A(gr[j]) * A(yr[j]);
        dot = block_sum(dot, shared);
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) dr[j] = static_cast<T>(A(yr[j]) * (A(gr[j]) - dot));
    }
}

// Threads a block: N rounded up to a whole warp, at most cuda::kThreads (block_sum needs a
// multiple of 32).
int threads_for(int64_t N) { return static_cast<int>(std::min<int64_t>(cuda::kThreads, (N + 31) / 32 * 32)); }
unsigned blocks_for_rows(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, kMaxRowBlocks)); }

}  // namespace

template <class T>
void softmax_forward_cuda(T* y, const T* x, int64_t rows, int64_t N, int device) {
    if (rows == 0 || N == 0) return;
    cudaStream_t stream = cuda::stream(device);
    softmax_forward_kernel<T><<<blocks_for_rows(rows), threads_for(N), 0, stream>>>(y, x, rows, N);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void softmax_backward_cuda(T* dx, const T* dy, const T* y, int64_t rows, int64_t N, int device) {
    if (rows == 0 || N == 0) return;
    cudaStream_t stream = cuda::stream(device);
    softmax_backward_kernel<T><<<blocks_for_rows(rows), threads_for(N), 0, stream>>>(dx, dy, y, rows, N);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                           \
    template void softmax_forward_cuda<T>(T*, const T*, int64_t, int64_t, int);     \
    template void softmax_backward_cuda<T>(T*, const T*, const T*, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
