// ops/cross_entropy.cu: the CUDA kernels of cross_entropy. Forward: one block per row (max, sum
// of exponentials and log-sum-exp in acc_t<T> with fixed-order block reductions), then one block
// for the mean over rows (single_block_sum_cuda, ops/cuda_common.cu); backward: elementwise
// softmax minus one-hot. No atomics.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// Most blocks of the per-row kernel (as cuda::blocks_for); each block loops over its rows.
constexpr int64_t kMaxRowBlocks = 65535 * 16;

// Per row i (blocks stride over rows): lse[i] = m + log(sum over v of exp(logits[i, v] - m)),
// m = max over v of logits[i, v]; term[i] = lse[i] - logits[i, targets[i]].
// logits: [M, V]; targets: [M]; lse, term: [M] in acc_t<T>.
template <class T>
__global__ void cross_entropy_rows_kernel(acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ term,
                                          const T* __restrict__ logits, const int64_t* __restrict__ targets, int64_t M,
                                          int64_t V) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    for (int64_t i = blockIdx.x; i < M; i += gridDim.x) {
        const T* row = logits + i * V;
        A m = A(row[0]);
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = max(m, A(row[v]));
        m = block_max(m, shared);
        A s = 0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += exp(A(row[v]) - m);
        s = block_sum(s, shared);
        if (threadIdx.x == 0) {
            A l = m + log(s);
            lse[i] = l;
            term[i] = l - A(row[targets[i]]);
        }
    }
}

// dlogits[i, v] = (exp(logits[i, v] - lse[i]) - [v == targets[i]]) * g, g = grad / M.
// logits, dlogits: [M, V]; lse, targets: [M].
template <class T>
__global__ void cross_entropy_backward_kernel(T* __restrict__ dlogits, const T* __restrict__ logits,
                                              const acc_t<T>* __restrict__ lse, const int64_t* __restrict__ targets,
                                              acc_t<T> g, int64_t M, int64_t V) {
    using A = acc_t<T>;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < M * V; k += int64_t(gridDim.x) * blockDim.x) {
        int64_t i = k / V, v = k % V;
        dlogits[k] = static_cast<T>((exp(A(logits[k]) - lse[i]) - (v == targets[i] ? A(1) : A(0))) * g);
    }
}

}  // namespace

// The per-row terms live in a temporary [M] acc_t<T> tensor, freed on return: the caching
// allocator may hand it out again at once, as later work is queued on the same stream.
template <class T>
void cross_entropy_forward_cuda(T* loss, acc_t<T>* lse, const T* logits, const int64_t* targets, int64_t M, int64_t V,
                                int device) {
    cudaStream_t stream = cuda::stream(device);
    Tensor term = empty({M}, TensorOptions().dtype(stat_dtype(dtype_of<T>())).device(Device::cuda(device)));
    acc_t<T>* pt = device_ptr<acc_t<T>>(term);
    unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
    cross_entropy_rows_kernel<T><<<blocks, cuda::kThreads, 0, stream>>>(lse, pt, logits, targets, M, V);
    CUDA_LAUNCH_CHECK();
    single_block_sum_cuda<acc_t<T>, T>(loss, pt, M, 1.0 / static_cast<double>(M), device);
}

template <class T>
void cross_entropy_backward_cuda(T* dlogits, const T* logits, const acc_t<T>* lse, const int64_t* targets,
                                 double grad, int64_t M, int64_t V, int device) {
    acc_t<T> g = acc_t<T>(grad) / acc_t<T>(M);
    cross_entropy_backward_kernel<T><<<cuda::blocks_for(M * V), cuda::kThreads, 0, cuda::stream(device)>>>(
        dlogits, logits, lse, targets, g, M, V);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                     \
    template void cross_entropy_forward_cuda<T>(T*, acc_t<T>*, const T*, const int64_t*, int64_t, int64_t, int); \
    template void cross_entropy_backward_cuda<T>(T*, const T*, const acc_t<T>*, const int64_t*, double, int64_t, \
                                                 int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
