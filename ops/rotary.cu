// ops/rotary.cu: rotary_embedding's CUDA kernel, forward and backward (the inverse rotation). A
// thread owns one pair column (b, t, d) and rotates it in every head, so that the angle's power,
// cos and sin are computed once per H elements. Arithmetic in acc_t<T>, as on the cpu
// (ops/rotary.cpp), with the products and sums rounded one by one (__fmul_rn, __fadd_rn: nvcc
// would otherwise fuse them into multiply-adds, which transformers' separate ops do not do).
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

__device__ inline float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ inline float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ inline double sub_rn(double a, double b) { return __dsub_rn(a, b); }

// cos and sin of position p's angle for the pair (d, d + hs/2), as rotary_cos_sin in
// ops/rotary.cpp computes them (ops/rotary.h): f32 and bf16 in f32, the power evaluated in double
// and rounded once; cosf and sinf, not the fast intrinsics __cosf and __sinf.
__device__ inline void rotary_cos_sin(int64_t p, int64_t d, int64_t hs, double theta, float& c, float& s) {
    const float exponent = __fdiv_rn(static_cast<float>(2 * d), static_cast<float>(hs));
    const float r = static_cast<float>(pow(static_cast<double>(static_cast<float>(theta)), double(exponent)));
    const float angle = __fmul_rn(static_cast<float>(p), __fdiv_rn(1.0f, r));
    c = cosf(angle);
    s = sinf(angle);
}
__device__ inline void rotary_cos_sin(int64_t p, int64_t d, int64_t hs, double theta, double& c, double& s) {
    const double exponent = __ddiv_rn(static_cast<double>(2 * d), static_cast<double>(hs));
    const double angle = __dmul_rn(static_cast<double>(p), __ddiv_rn(1.0, pow(theta, exponent)));
    c = cos(angle);
    s = sin(angle);
}

// For every k = bt * half + d < BT * half (bt = b * Tn + t): the pair (d, d + half) of each of the
// H heads of row bt of x [BT, H, 2 * half] rotated by position position_offset + t's angle
// (inverse: by minus it) into out. Consecutive threads take consecutive d: coalesced per head.
template <class T>
__global__ void rotary_embedding_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t BT, int64_t Tn,
                                        int64_t H, int64_t half, int64_t position_offset, double theta,
                                        bool inverse) {
    using A = acc_t<T>;
    const int64_t hs = 2 * half;
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < BT * half;
         k += int64_t(gridDim.x) * blockDim.x) {
        const int64_t bt = k / half, d = k % half;
        A c, s;
        rotary_cos_sin(position_offset + bt % Tn, d, hs, theta, c, s);
        if (inverse) s = -s;  // x1 c - x2 (-s) has the bits of x1 c + x2 s
        const T* xr = x + bt * H * hs + d;
        T* o = out + bt * H * hs + d;
#pragma unroll 4
        for (int64_t h = 0; h < H; ++h) {
            const A x1 = A(xr[h * hs]), x2 = A(xr[h * hs + half]);
            o[h * hs] = static_cast<T>(sub_rn(mul_rn(x1, c), mul_rn(x2, s)));
            o[h * hs + half] = static_cast<T>(add_rn(mul_rn(x2, c), mul_rn(x1, s)));
        }
    }
}

}  // namespace

template <class T>
void rotary_embedding_cuda(T* out, const T* x, int64_t B, int64_t T_, int64_t H, int64_t hs, int64_t position_offset,
                           double theta, bool inverse, int device) {
    const int64_t pairs = B * T_ * (hs / 2);
    if (pairs == 0 || H == 0) return;
    rotary_embedding_kernel<T><<<cuda::blocks_for(pairs), cuda::kThreads, 0, cuda::stream(device)>>>(
        out, x, B * T_, T_, H, hs / 2, position_offset, theta, inverse);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                           \
    template void rotary_embedding_cuda<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, double, bool, \
                                           int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
