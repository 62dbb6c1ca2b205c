// ops/linear_cross_entropy.cu: the CUDA row kernels of linear_cross_entropy (ops/linear_cross_entropy.h)
// and their launchers; the products are cuBLAS's (ops/matmul.cu). One block of 256 threads per
// row of a chunk's logits [rows, V], each thread walking the columns threadIdx.x, + 256, ...
// (coalesced), in 16-byte vectors where every row is whole vectors on 16-byte boundaries.
// Forward: each thread keeps a running maximum and a sum of exponentials scaled to it (online
// log-sum-exp, Milakov & Gimelshein 2018, arXiv:1805.02867) and the sum of z; the block combines
// them in a fixed order (block_max, block_sum: no atomics). Backward: each element's gradient,
// formed in acc_t and written over its logit. In f32: exp __expf (ex2.approx), log logf, tanh
// tanhf; in f64 exp, log, tanh.
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr int kRowThreads = 256;

__device__ inline float exp_of(float x) { return __expf(x); }  // ex2.approx: 2 ulp for the arguments here (<= 0)
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

// Adds z to the thread's running pair (m, s) and to zsum (scalar path).
template <class A>
__device__ inline void add_logit(A z, A& m, A& s, A& zsum) {
    zsum += z;
    if (z > m) {
        s = s * exp_of(m - z) + A(1);
        m = z;
    } else {
        s += exp_of(z - m);
    }
}

// VEC: rows of whole, 16-byte aligned vectors (f32 and bf16 only), read with one load per
// Pack<T>::E elements, whose maximum is taken first so that the running sum is rescaled once per
// vector; otherwise one element at a time.
template <class T, bool VEC>
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
    if constexpr (VEC) {
        constexpr int E = Pack<T>::E;
        for (int64_t k = threadIdx.x; k < V / E; k += blockDim.x) {
            float v[E];
            load_pack(row + k * E, v);
            A top = m;
            for (int e = 0; e < E; ++e) {
                v[e] = soft_cap(v[e], cap);
                top = max(top, v[e]);
            }
            A add = 0;
            for (int e = 0; e < E; ++e) {
                add += exp_of(v[e] - top);
                zsum += v[e];
            }
            s = s * exp_of(m - top) + add;
            m = top;
        }
    } else {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) add_logit(soft_cap(A(row[v]), cap), m, s, zsum);
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

// The gradient of one logit x of column v in a row of target t, lse l: see the launcher.
template <class A>
__device__ inline A logit_grad(A x, int64_t v, int64_t t, A l, A g, A cap, A smoothing, A uniform) {
    A z = x, dz = A(1);
    if (cap > A(0)) {
        const A th = tanh_of(x / cap);
        z = cap * th;
        dz = A(1) - th * th;
    }
    const A target = v == t ? A(1) - smoothing : A(0);
    return (exp_of(z - l) - target - uniform) * g * dz;
}

template <class T, bool VEC>
__global__ void rows_backward_kernel(T* logits, const acc_t<T>* lse, const int64_t* targets, const T* grad,
                                     acc_t<T> scale, int64_t V, acc_t<T> cap, acc_t<T> smoothing,
                                     int64_t ignore_index) {
    using A = acc_t<T>;
    const int64_t i = blockIdx.x;
    const int64_t t = targets[i];
    T* row = logits + i * V;
    const bool ignored = t == ignore_index;
    const A g = ignored ? A(0) : A(grad[0]) * scale, l = lse[i], uniform = smoothing / A(V);
    if constexpr (VEC) {
        constexpr int E = Pack<T>::E;
        for (int64_t k = threadIdx.x; k < V / E; k += blockDim.x) {
            float v[E];
            load_pack(row + k * E, v);
            for (int e = 0; e < E; ++e)
                v[e] = ignored ? 0.0f : logit_grad<A>(v[e], k * E + e, t, l, g, cap, smoothing, uniform);
            store_pack(row + k * E, v);
        }
    } else {
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
            row[v] = ignored ? T(0) : static_cast<T>(logit_grad<A>(A(row[v]), v, t, l, g, cap, smoothing, uniform));
    }
}

// Whether every row of logits [rows, V] is whole 16-byte vectors on 16-byte boundaries (f32 and
// bf16: the vector kernels' types).
template <class T>
bool vector_rows(const T* logits, int64_t V) {
    return reinterpret_cast<uintptr_t>(logits) % 16 == 0 && (V * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

}  // namespace

template <class T>
void linear_cross_entropy_rows_cuda(acc_t<T>* lse, acc_t<T>* loss, const T* logits, const int64_t* targets,
                                    int64_t rows, int64_t V, double softcap, double smoothing, int64_t ignore_index,
                                    int device) {
    if (rows == 0) return;
    using A = acc_t<T>;
    auto kernel = rows_forward_kernel<T, false>;
    if constexpr (!std::is_same_v<T, double>)
        if (vector_rows(logits, V)) kernel = rows_forward_kernel<T, true>;
    kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, cuda::stream(device)>>>(
        lse, loss, logits, targets, V, static_cast<A>(softcap), static_cast<A>(smoothing), ignore_index);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void linear_cross_entropy_grad_cuda(T* logits, const acc_t<T>* lse, const int64_t* targets, const T* grad,
                                    double scale, int64_t rows, int64_t V, double softcap, double smoothing,
                                    int64_t ignore_index, int device) {
    if (rows == 0) return;
    using A = acc_t<T>;
    auto kernel = rows_backward_kernel<T, false>;
    if constexpr (!std::is_same_v<T, double>)
        if (vector_rows(logits, V)) kernel = rows_backward_kernel<T, true>;
    kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, cuda::stream(device)>>>(
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
