// ops/elementwise.cu: the CUDA kernels of add, mul, scale and gelu: each one map_cuda()
// (core/cuda_map.cuh) with its formula, in 16-byte vectors. Arithmetic in acc_t<T>, as on the cpu.
// Not here: the column sum behind add's (and linear's) bias gradient (column_sum_cuda,
// ops/cuda_common.cu).
#include "core/cuda_map.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

template <class A>
struct AddOp {
    __device__ A operator()(const A (&x)[2]) const { return x[0] + x[1]; }
};
template <class A>
struct MulOp {
    __device__ A operator()(const A (&x)[2]) const { return x[0] * x[1]; }
};
template <class A>
struct ScaleOp {
    A s;
    __device__ A operator()(const A (&x)[1]) const { return x[0] * s; }
};
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class A>
struct GeluOp {
    __device__ A operator()(const A (&x)[1]) const {
        const A v = x[0];
        return A(0.5) * v * (1 + tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v)));
    }
};
// dy * (0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)),
// u = sqrt(2/pi) (x + 0.044715 x^3); x = {dy, x}
template <class A>
struct GeluBackwardOp {
    __device__ A operator()(const A (&x)[2]) const {
        const A v = x[1];
        const A th = tanh(A(kSqrt2OverPi) * (v + A(kGeluCoeff) * v * v * v));
        return x[0] * (A(0.5) * (1 + th) + A(0.5) * v * (1 - th * th) * A(kSqrt2OverPi) * (1 + A(3 * kGeluCoeff) * v * v));
    }
};

}  // namespace

template <class T>
void add_forward_cuda(T* out, const T* a, const T* b, int64_t n, int64_t b_n, int device) {
    map_cuda<T, 2>(out, {{a, b}, {0, b_n == n ? 0 : b_n}}, n, AddOp<acc_t<T>>{}, device);
}

template <class T>
void mul_forward_cuda(T* out, const T* a, const T* b, int64_t n, int device) {
    map_cuda<T, 2>(out, {{a, b}, {0, 0}}, n, MulOp<acc_t<T>>{}, device);
}

template <class T>
void scale_forward_cuda(T* out, const T* a, double s, int64_t n, int device) {
    map_cuda<T, 1>(out, {{a}, {0}}, n, ScaleOp<acc_t<T>>{acc_t<T>(s)}, device);
}

template <class T>
void gelu_forward_cuda(T* out, const T* x, int64_t n, int device) {
    map_cuda<T, 1>(out, {{x}, {0}}, n, GeluOp<acc_t<T>>{}, device);
}

template <class T>
void gelu_backward_cuda(T* dx, const T* dy, const T* x, int64_t n, int device) {
    map_cuda<T, 2>(dx, {{dy, x}, {0, 0}}, n, GeluBackwardOp<acc_t<T>>{}, device);
}

template <class T>
void add_bias_rows_cuda(T* out, const T* bias, int64_t rows, int64_t N, int device) {
    map_cuda<T, 2>(out, {{out, bias}, {0, N}}, rows * N, AddOp<acc_t<T>>{}, device);
}

#define NT_INSTANTIATE(T)                                                                                     \
    template void add_forward_cuda<T>(T*, const T*, const T*, int64_t, int64_t, int);                         \
    template void mul_forward_cuda<T>(T*, const T*, const T*, int64_t, int);                                  \
    template void scale_forward_cuda<T>(T*, const T*, double, int64_t, int);                                  \
    template void gelu_forward_cuda<T>(T*, const T*, int64_t, int);                                           \
    template void gelu_backward_cuda<T>(T*, const T*, const T*, int64_t, int);                                \
    template void add_bias_rows_cuda<T>(T*, const T*, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
