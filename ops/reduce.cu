// ops/reduce.cu: the CUDA kernel of sum and mean: a deterministic two-pass reduction in
// acc_t<T> (block partial sums in a fixed order, then one block over the partials:
// single_block_sum_cuda, ops/cuda_common.cu), no atomics.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// At most this many blocks in pass 1, so that pass 2 is one block reading a few values a thread.
constexpr int64_t kMaxPartials = 1024;

// Pass 1: partial[b] = sum of x[i] over the i that block b visits (i = b * blockDim + t, then
// strides of the grid), added per thread in increasing i, then across the block by block_sum.
// x: [n]; partial: [gridDim.x].
template <class T>
__global__ void sum_partial_kernel(acc_t<T>* __restrict__ partial, const T* __restrict__ x, int64_t n) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    A s = 0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        s += A(x[i]);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

}  // namespace

// The number of pass-1 blocks depends on n only (not on the GPU), so the order of additions,
// and the result, are the same on every run and every device.
template <class T>
void sum_cuda(T* out, const T* x, int64_t n, double factor, int device) {
    cudaStream_t stream = cuda::stream(device);
    int64_t blocks = std::min<int64_t>(cuda::blocks_for(n), kMaxPartials);
    Tensor partial = empty({blocks}, TensorOptions().dtype(stat_dtype(dtype_of<T>())).device(Device::cuda(device)));
    acc_t<T>* p = device_ptr<acc_t<T>>(partial);
    sum_partial_kernel<T><<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream>>>(p, x, n);
    CUDA_LAUNCH_CHECK();
    single_block_sum_cuda<acc_t<T>, T>(out, p, blocks, factor, device);
}

template void sum_cuda<float>(float*, const float*, int64_t, double, int);
template void sum_cuda<double>(double*, const double*, int64_t, double, int);
template void sum_cuda<bf16>(bf16*, const bf16*, int64_t, double, int);

}  // namespace normtape::detail
