// ops/linear_cross_entropy.cu: the CUDA row kernels of linear_cross_entropy (ops/linear_cross_entropy.h)
// and their launchers; the products are cuBLAS's (ops/matmul.cu). One block of 256 threads per
// row of a chunk's logits [rows, V], each thread walking the columns threadIdx.x, + 256, ...
// (coalesced). Forward: each thread keeps a running maximum and a sum of exponentials scaled to it
// (online log-sum-exp, Milakov & Gimelshein 2018, arXiv:1805.02867) and the sum of z; the block
// combines them in a fixed order (block_max, block_sum: no atomics). Backward: each element's
// gradient, formed in acc_t and written over its logit. exp and log are expf/logf (exp, log for
// f64), tanh tanhf.
#include <cfloat>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr int kRowThreads = 256;

__device__ inline float exp_of(float x) { return expf(x); }
__device__ inline double exp_of(double x) { return exp(x); }
__device__ inline float log_of(float x) { return logf(x); }
__device__ inline double log_of(double x) { return log(x); }
__device__ inline float tanh_of(float x) { return tanhf(x); }
__device__ inline double tanh_of(double x) { return tanh(x); }

// The lowest finite value: a running maximum starts there, not at -inf, so that m - max never
// reads -inf - -inf (a row of -inf logits gives sum 0 and lse -inf, as on the cpu).
template <class A>
__device__ inline A lowest() {
    if constexpr (std::is_same_v<A, double>) return -DBL_MAX;
    else return -FLT_MAX;
}

// The logit the loss sees: x, or c * tanh(x / c) when c > 0.
template <class A>
__device__ inline A soft_cap(A x, A c) {
    return c > A(0) ? c * tanh_of(x / c) : x;
}

template <class T>
__global__ void rows_forward_kernel(acc_t<T>* lse, acc_t<T>* loss, const T* logits, const int64_t* targets, int64_t V,
                                    acc_t<T> cap, acc_t<T> smoothing, int64_t ignore_index) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    const int64_t i = blockIdx.x;
    const int64_t t = targets[i];
    if (t == ignore_index) {  // the whole block leaves together: no barrier is left waiting
        if (threadIdx.x == 0) lse[i] = loss[i] = A(0);
        return;
    }
    const T* row = logits + i * V;
    A m = lowest<A>(), s = 0, zsum = 0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const A z = soft_cap(A(row[v]), cap);
        zsum += z;
        if (z > m) {
            s = s * exp_of(m - z) + A(1);
            m = z;
        } else {
            s += exp_of(z - m);
        }
    }
    const A top = block_max(m, shared);
    const A sum = block_sum(s * exp_of(m - top), shared);
    const A zs = block_sum(zsum, shared);
    if (threadIdx.x == 0) {
        const A l = top + log_of(sum);
        lse[i] = l;
        loss[i] = l - (A(1) - smoothing) * soft_cap(A(row[t]), cap) - smoothing / A(V) * zs;
    }
}

template <class T>
__global__ void rows_backward_kernel(T* logits, const acc_t<T>* lse, const int64_t* targets, const T* grad,
                                     acc_t<T> scale, int64_t V, acc_t<T> cap, acc_t<T> smoothing,
                                     int64_t ignore_index) {
    using A = acc_t<T>;
    const int64_t i = blockIdx.x;
    const int64_t t = targets[i];
    T* row = logits + i * V;
    if (t == ignore_index) {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) row[v] = T(0);
        return;
    }
    const A g = A(grad[0]) * scale, l = lse[i], uniform = smoothing / A(V);
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        A z = A(row[v]), dz = A(1);
        if (cap > A(0)) {
            const A th = tanh_of(z / cap);
            z = cap * th;
            dz = A(1) - th * th;
        }
        const A target = v == t ? A(1) - smoothing : A(0);
        row[v] = static_cast<T>((exp_of(z - l) - target - uniform) * g * dz);
    }
}

}  // namespace

template <class T>
void linear_cross_entropy_rows_cuda(acc_t<T>* lse, acc_t<T>* loss, const T* logits, const int64_t* targets,
                                    int64_t rows, int64_t V, double softcap, double smoothing, int64_t ignore_index,
                                    int device) {
    if (rows == 0) return;
    using A = acc_t<T>;
    rows_forward_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, cuda::stream(device)>>>(
        lse, loss, logits, targets, V, static_cast<A>(softcap), static_cast<A>(smoothing), ignore_index);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void linear_cross_entropy_grad_cuda(T* logits, const acc_t<T>* lse, const int64_t* targets, const T* grad,
                                    double scale, int64_t rows, int64_t V, double softcap, double smoothing,
                                    int64_t ignore_index, int device) {
    if (rows == 0) return;
    using A = acc_t<T>;
    rows_backward_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, cuda::stream(device)>>>(
        logits, lse, targets, grad, static_cast<A>(scale), V, static_cast<A>(softcap), static_cast<A>(smoothing),
        ignore_index);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                              \
    template void linear_cross_entropy_rows_cuda<T>(acc_t<T>*, acc_t<T>*, const T*, const int64_t*, int64_t, int64_t, \
                                                    double, double, int64_t, int);                                    \
    template void linear_cross_entropy_grad_cuda<T>(T*, const acc_t<T>*, const int64_t*, const T*, double, int64_t,   \
                                                    int64_t, double, double, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
