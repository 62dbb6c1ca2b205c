// nn/adamw.cu: AdamW and the gradient norm on the GPU (formula: nn/adamw_update.h). block_sum and
// the gradient norm's last pass (single_block_sum_cuda) are the ops' (ops/cuda_common.cuh,
// ops/cuda_common.cu: nn may use ops).
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "nn/adamw_update.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

template <class T>
__global__ void adamw_kernel(T* __restrict__ p, acc_t<T>* __restrict__ master, const T* __restrict__ g,
                             acc_t<T>* __restrict__ m, acc_t<T>* __restrict__ v, int64_t n, AdamWStep s) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        adamw_update<T>(p + i, master ? master + i : nullptr, g[i], m + i, v + i, s);
}

constexpr int kSumBlocks = 256, kSumThreads = 256;

// partial[block] = sum of x^2 over a grid-stride slice, in double; then one block sums the
// partials in order (single_block_sum_cuda): deterministic.
template <class T>
__global__ void sum_squares_partial_kernel(double* __restrict__ partial, const T* __restrict__ x, int64_t n) {
    __shared__ double shared[32];
    double s = 0;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        double v = double(acc_t<T>(x[i]));
        s += v * v;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

}  // namespace

template <class T>
void adamw_step_cuda(T* p, acc_t<T>* master, const T* g, acc_t<T>* m, acc_t<T>* v, int64_t n, const AdamWStep& s,
                     int device) {
    adamw_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(p, master, g, m, v, n, s);
    CUDA_LAUNCH_CHECK();
}

template <class T>
double sum_squares_cuda(const T* x, int64_t n, int device) {
    Tensor partial = empty({kSumBlocks + 1}, TensorOptions().dtype(DType::F64).device(Device::cuda(device)));
    double* pp = device_ptr<double>(partial);
    cudaStream_t stream = cuda::stream(device);
    sum_squares_partial_kernel<T><<<kSumBlocks, kSumThreads, 0, stream>>>(pp, x, n);
    CUDA_LAUNCH_CHECK();
    single_block_sum_cuda<double, double>(pp + kSumBlocks, pp, kSumBlocks, 1.0, device);
    double out = 0;
    CUDA_CHECK(cudaMemcpyAsync(&out, pp + kSumBlocks, sizeof(double), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
}

#define NT_INSTANTIATE(T)                                                                                         \
    template void adamw_step_cuda<T>(T*, acc_t<T>*, const T*, acc_t<T>*, acc_t<T>*, int64_t, const AdamWStep&, int); \
    template double sum_squares_cuda<T>(const T*, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
