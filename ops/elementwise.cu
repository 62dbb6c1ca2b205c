// ops/elementwise.cu: the CUDA kernels of add, mul, scale and gelu. Arithmetic in acc_t<T>, as on
// the cpu. Not here: the column sum behind add's (and linear's) bias gradient (column_sum_cuda,
// ops/cuda_common.cu).
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

// out[i] = a[i] + b[i % b_n]; out, a: [n], b: [b_n].
template <class T>
__global__ void add_forward_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n,
                                   int64_t b_n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<T>(acc_t<T>(a[i]) + acc_t<T>(b[i % b_n]));
}

// out[i] = a[i] * b[i]; all [n].
template <class T>
__global__ void mul_forward_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<T>(acc_t<T>(a[i]) * acc_t<T>(b[i]));
}

// out[i] = a[i] * s; both [n].
template <class T>
__global__ void scale_forward_kernel(T* __restrict__ out, const T* __restrict__ a, acc_t<T> s, int64_t n) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = static_cast<T>(acc_t<T>(a[i]) * s);
}

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = x[i]; both [n].
template <class T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n) {
    using A = acc_t<T>;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        A v = x[i];
        out[i] = static_cast<T>(A(0.5) * v * (1 + tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v))));
    }
}

// dx[i] = dy[i] * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),
// u = sqrt(2/pi) (x + 0.044715 x^3), x = x[i]; all [n].
template <class T>
__global__ void gelu_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x, int64_t n) {
    using A = acc_t<T>;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        A v = x[i];
        A th = tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v));
        A d = A(0.5) * (1 + th) + A(0.5) * v * (1 - th * th) * A(kSqrt2OverPi) * (1 + A(3 * kGeluCoeff) * v * v);
        dx[i] = static_cast<T>(A(dy[i]) * d);
    }
}

}  // namespace

template <class T>
void add_forward_cuda(T* out, const T* a, const T* b, int64_t n, int64_t b_n, int device) {
    add_forward_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(out, a, b, n, b_n);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void mul_forward_cuda(T* out, const T* a, const T* b, int64_t n, int device) {
    mul_forward_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(out, a, b, n);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void scale_forward_cuda(T* out, const T* a, double s, int64_t n, int device) {
    scale_forward_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(out, a, acc_t<T>(s), n);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void gelu_forward_cuda(T* out, const T* x, int64_t n, int device) {
    gelu_forward_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(out, x, n);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void gelu_backward_cuda(T* dx, const T* dy, const T* x, int64_t n, int device) {
    gelu_backward_kernel<T><<<cuda::blocks_for(n), cuda::kThreads, 0, cuda::stream(device)>>>(dx, dy, x, n);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                     \
    template void add_forward_cuda<T>(T*, const T*, const T*, int64_t, int64_t, int);                         \
    template void mul_forward_cuda<T>(T*, const T*, const T*, int64_t, int);                                  \
    template void scale_forward_cuda<T>(T*, const T*, double, int64_t, int);                                  \
    template void gelu_forward_cuda<T>(T*, const T*, int64_t, int);                                           \
    template void gelu_backward_cuda<T>(T*, const T*, const T*, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
