// ops/norm/norm_reference.cu: the reference CUDA kernels of layer_norm and rms_norm, both policies,
// written to be checked by eye: one block per row for the statistics, y and dx (fixed-order block
// reductions), and dweight/dbias in two passes (per chunk of rows, then the chunks in order by
// column_sum_cuda). f32, f64 and bf16, any N, any alignment. norm_*_cuda (ops/norm/norm_forward.cu,
// ops/norm/norm_backward.cu) fall back to them where the fast kernels do not apply (f64, N not a
// multiple of a 16-byte vector, misaligned data, rows longer than the fast kernels hold); tests
// and examples/bench/bench_norms.cpp call them directly to compare. Also the fused norm's rowscale,
// a plain elementwise kernel. Not here: the fast kernels.
#include <algorithm>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr int kRowThreads = 256;
constexpr int kColumnThreads = 256;
constexpr int64_t kRowsPerChunk = 64;

// One block per row: mean (centered), rstd, y. x, y: [M, N]; mean, rstd: [M].
template <class T>
__global__ void norm_forward_kernel(T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
                                    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                    int64_t N, double eps) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    const T* xi = x + blockIdx.x * N;
    A m = 0;
    if (mean) {
        A s = 0;
        for (int64_t j = threadIdx.x; j < N; j += blockDim.x) s += A(xi[j]);
        m = block_sum(s, shared) / A(N);
    }
    A sq = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        A d = A(xi[j]) - m;
        sq += d * d;
    }
    A r = A(1) / sqrt(block_sum(sq, shared) / A(N) + A(eps));
    if (threadIdx.x == 0) {
        if (mean) mean[blockIdx.x] = m;
        rstd[blockIdx.x] = r;
    }
    T* yi = y + blockIdx.x * N;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        A v = (A(xi[j]) - m) * r;
        if (weight) v *= A(weight[j]);
        if (bias) v += A(bias[j]);
        yi[j] = static_cast<T>(v);
    }
}

// One block per row: dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)), g = dy * weight.
template <class T>
__global__ void norm_backward_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ saved,
                                        const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                        const T* __restrict__ weight, const T* __restrict__ bias, bool centered,
                                        SavePolicy policy, int64_t N) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    int64_t i = blockIdx.x;
    const T* dyi = dy + i * N;
    const T* si = saved + i * N;
    A m = mean ? mean[i] : A(0), r = rstd[i];
    A sum_g = 0, sum_g_xhat = 0;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        A g = weight ? A(dyi[j]) * A(weight[j]) : A(dyi[j]);
        sum_g += g;
        sum_g_xhat += g * x_hat_from_saved<T, A>(policy, si[j], m, r, weight, bias, j);
    }
    A mean_g = centered ? block_sum(sum_g, shared) / A(N) : A(0);
    A mean_g_xhat = block_sum(sum_g_xhat, shared) / A(N);
    T* dxi = dx + i * N;
    for (int64_t j = threadIdx.x; j < N; j += blockDim.x) {
        A g = weight ? A(dyi[j]) * A(weight[j]) : A(dyi[j]);
        A xh = x_hat_from_saved<T, A>(policy, si[j], m, r, weight, bias, j);
        dxi[j] = static_cast<T>(r * (g - mean_g - xh * mean_g_xhat));
    }
}

// Pass 1 of dweight/dbias: for column j and chunk c of kRowsPerChunk rows, in row order:
// partial_w[c, j] = sum dy * x_hat, partial_b[c, j] = sum dy.
template <class T>
__global__ void norm_param_partials_kernel(acc_t<T>* __restrict__ partial_w, acc_t<T>* __restrict__ partial_b,
                                           const T* __restrict__ dy, const T* __restrict__ saved,
                                           const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                           const T* __restrict__ weight, const T* __restrict__ bias, SavePolicy policy,
                                           int64_t M, int64_t N) {
    using A = acc_t<T>;
    int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (j >= N) return;
    for (int64_t c = blockIdx.y; c * kRowsPerChunk < M; c += gridDim.y) {  // gridDim.y is capped at 65535
        int64_t begin = c * kRowsPerChunk, end = min(M, begin + kRowsPerChunk);
        A sw = 0, sb = 0;
        for (int64_t i = begin; i < end; ++i) {
            A d = A(dy[i * N + j]);
            if (partial_w) sw += d * x_hat_from_saved<T, A>(policy, saved[i * N + j], mean ? mean[i] : A(0), rstd[i],
                                                             weight, bias, j);
            sb += d;
        }
        if (partial_w) partial_w[c * N + j] = sw;
        if (partial_b) partial_b[c * N + j] = sb;
    }
}

}  // namespace

template <class T>
void norm_forward_reference_cuda(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* weight, const T* bias, int64_t M,
                       int64_t N, double eps, int device) {
    norm_forward_kernel<T><<<static_cast<unsigned>(M), kRowThreads, 0, cuda::stream(device)>>>(y, mean, rstd, x, weight,
                                                                                                 bias, N, eps);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void norm_backward_reference_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* saved, const acc_t<T>* mean,
                        const acc_t<T>* rstd, const T* weight, const T* bias, bool centered, SavePolicy policy,
                        int64_t M, int64_t N, int device) {
    cudaStream_t stream = cuda::stream(device);
    if (dx) {
        norm_backward_dx_kernel<T><<<static_cast<unsigned>(M), kRowThreads, 0, stream>>>(dx, dy, saved, mean, rstd, weight,
                                                                                         bias, centered, policy, N);
        CUDA_LAUNCH_CHECK();
    }
    if (!dweight && !dbias) return;
    int64_t chunks = (M + kRowsPerChunk - 1) / kRowsPerChunk;
    TensorOptions opts = TensorOptions().dtype(stat_dtype(dtype_of<T>())).device(Device::cuda(device));
    Tensor pw = dweight ? empty({chunks, N}, opts) : Tensor(), pb = dbias ? empty({chunks, N}, opts) : Tensor();
    using A = acc_t<T>;
    dim3 grid(static_cast<unsigned>((N + kColumnThreads - 1) / kColumnThreads),
              static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
    norm_param_partials_kernel<T><<<grid, kColumnThreads, 0, stream>>>(device_ptr<A>(pw), device_ptr<A>(pb), dy, saved,
                                                                       mean, rstd, weight, bias, policy, M, N);
    CUDA_LAUNCH_CHECK();
    if (dweight) column_sum_cuda<A, T>(dweight, device_ptr<A>(pw), chunks, N, device);
    if (dbias) column_sum_cuda<A, T>(dbias, device_ptr<A>(pb), chunks, N, device);
}

namespace {
// out[i, j] = x[i, j] * scale[i], in acc_t<T>, grid-stride.
template <class T>
__global__ void scale_rows_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ scale,
                                  int64_t n, int64_t N) {
    using A = acc_t<T>;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<T>(A(x[i]) * A(scale[i / N]));
}
}  // namespace

template <class T>
void scale_rows_cuda(T* out, const T* x, const T* scale, int64_t M, int64_t N, int device) {
    if (M * N == 0) return;
    scale_rows_kernel<T><<<cuda::blocks_for(M * N), cuda::kThreads, 0, cuda::stream(device)>>>(out, x, scale, M * N, N);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                          \
    template void scale_rows_cuda<T>(T*, const T*, const T*, int64_t, int64_t, int);                              \
    template void norm_forward_reference_cuda<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int64_t, \
                                                 int64_t, double, int);                                           \
    template void norm_backward_reference_cuda<T>(T*, T*, T*, const T*, const T*, const acc_t<T>*, const acc_t<T>*, \
                                                  const T*, const T*, bool, SavePolicy, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
