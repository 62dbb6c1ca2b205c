// ops/attention.cu: causal self-attention on the GPU: per batch element, the heads' products are
// strided-batched cuBLAS GEMMs over the packed qkv layout (f32 accumulation), and the causal
// softmax and its backward are row kernels. Scores and their gradient live in per-batch scratch
// (f32 scores, dS in T for the last two products), the probabilities in `att` (saved).
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr int kSoftmaxThreads = 256;

// Row-major C[batch] = op(A[batch]) @ op(B[batch]) (see gemm_cuda for the column-major swap).
// A: rows x cols with leading dimension lda (row stride), batch stride sa; likewise B and C.
template <class TA, class TC>
void batched_gemm(int device, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const TA* A,
                  int64_t lda, int64_t sa, const TA* B, int64_t ldb, int64_t sb, TC* C, int64_t ldc, int64_t sc,
                  int64_t batch) {
    using Acc = acc_t<TA>;
    Acc a = static_cast<Acc>(alpha), b = 0;
    cublasComputeType_t compute = std::is_same_v<TA, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cuda::cublas(device), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(N),
                                            static_cast<int>(M), static_cast<int>(K), &a, B, cuda_type<TA>(),
                                            static_cast<int>(ldb), sb, A, cuda_type<TA>(), static_cast<int>(lda), sa, &b,
                                            C, cuda_type<TC>(), static_cast<int>(ldc), sc, static_cast<int>(batch),
                                            compute, CUBLAS_GEMM_DEFAULT));
}

// One block per row (h, t) of one batch element: att[t, s] = softmax over s <= t of scores[t, s],
// 0 for s > t. scores: [NH, T, T] of acc_t<T>; att: [NH, T, T] of T.
template <class T>
__global__ void causal_softmax_kernel(T* __restrict__ att, const acc_t<T>* __restrict__ scores, int64_t Tn) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    int64_t row = blockIdx.x, t = row % Tn;
    const A* s = scores + row * Tn;
    T* a = att + row * Tn;
    A m = -INFINITY;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = max(m, s[j]);
    m = block_max(m, shared);
    A sum = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) sum += exp(s[j] - m);
    sum = block_sum(sum, shared);
    for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x) a[j] = static_cast<T>(j <= t ? exp(s[j] - m) / sum : A(0));
}

// One block per row: dscores[t, s] = scale * att[t, s] * (datt[t, s] - sum_s' att[t, s'] datt[t, s']).
template <class T>
__global__ void causal_softmax_backward_kernel(T* __restrict__ dscores, const T* __restrict__ att,
                                               const acc_t<T>* __restrict__ datt, int64_t Tn, acc_t<T> scale) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    int64_t row = blockIdx.x, t = row % Tn;
    const T* a = att + row * Tn;
    const A* d = datt + row * Tn;
    A dot = 0;
    for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) dot += A(a[j]) * d[j];
    dot = block_sum(dot, shared);
    T* out = dscores + row * Tn;
    for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x)
        out[j] = static_cast<T>(j <= t ? scale * A(a[j]) * (d[j] - dot) : A(0));
}

}  // namespace

template <class T>
void attention_forward_cuda(T* out, T* att, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH, int device) {
    using A = acc_t<T>;
    int64_t hs = C / NH;
    double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    Tensor scores = empty({NH, Tn, Tn}, TensorOptions().dtype(stat_dtype(dtype_of<T>())).device(Device::cuda(device)));
    for (int64_t b = 0; b < B; ++b) {
        const T* q = qkv + b * Tn * 3 * C;
        T* att_b = att + b * NH * Tn * Tn;
        // scores = scale * q @ k^T, per head: [T, hs] x [hs, T]
        batched_gemm<T, A>(device, false, true, Tn, Tn, hs, scale, q, 3 * C, hs, q + C, 3 * C, hs,
                           device_ptr<A>(scores), Tn, Tn * Tn, NH);
        causal_softmax_kernel<T><<<static_cast<unsigned>(NH * Tn), kSoftmaxThreads, 0, cuda::stream(device)>>>(
            att_b, device_ptr<A>(scores), Tn);
        CUDA_LAUNCH_CHECK();
        // out = att @ v: [T, T] x [T, hs], written into the head's columns of out
        batched_gemm<T, T>(device, false, false, Tn, hs, Tn, 1.0, att_b, Tn, Tn * Tn, q + 2 * C, 3 * C, hs,
                           out + b * Tn * C, C, hs, NH);
    }
}

template <class T>
void attention_backward_cuda(T* dqkv, const T* dout, const T* qkv, const T* att, int64_t B, int64_t Tn, int64_t C,
                             int64_t NH, int device) {
    using A = acc_t<T>;
    int64_t hs = C / NH;
    double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    TensorOptions opts = TensorOptions().device(Device::cuda(device));
    Tensor datt = empty({NH, Tn, Tn}, opts.dtype(stat_dtype(dtype_of<T>())));
    Tensor dscores = empty({NH, Tn, Tn}, opts.dtype(dtype_of<T>()));
    for (int64_t b = 0; b < B; ++b) {
        const T* q = qkv + b * Tn * 3 * C;
        const T* att_b = att + b * NH * Tn * Tn;
        const T* dout_b = dout + b * Tn * C;
        T* dq = dqkv + b * Tn * 3 * C;
        // datt = dout @ v^T
        batched_gemm<T, A>(device, false, true, Tn, Tn, hs, 1.0, dout_b, C, hs, q + 2 * C, 3 * C, hs,
                           device_ptr<A>(datt), Tn, Tn * Tn, NH);
        // dv = att^T @ dout
        batched_gemm<T, T>(device, true, false, Tn, hs, Tn, 1.0, att_b, Tn, Tn * Tn, dout_b, C, hs, dq + 2 * C, 3 * C, hs,
                           NH);
        causal_softmax_backward_kernel<T><<<static_cast<unsigned>(NH * Tn), kSoftmaxThreads, 0, cuda::stream(device)>>>(
            device_ptr<T>(dscores), att_b, device_ptr<A>(datt), Tn, static_cast<A>(scale));
        CUDA_LAUNCH_CHECK();
        // dq = dscores @ k, dk = dscores^T @ q
        batched_gemm<T, T>(device, false, false, Tn, hs, Tn, 1.0, device_ptr<T>(dscores), Tn, Tn * Tn, q + C, 3 * C, hs,
                           dq, 3 * C, hs, NH);
        batched_gemm<T, T>(device, true, false, Tn, hs, Tn, 1.0, device_ptr<T>(dscores), Tn, Tn * Tn, q, 3 * C, hs,
                           dq + C, 3 * C, hs, NH);
    }
}

#define NT_INSTANTIATE(T)                                                                                     \
    template void attention_forward_cuda<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, int);      \
    template void attention_backward_cuda<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
