// core/cuda_map.cuh: 16-byte vectors (of any dtype as they are; of f32 and bf16 unpacked into floats),
// and map_cuda(), the one elementwise kernel behind every pointwise op on the GPU:
// out[i] = f(in_0[i], ..., in_N-1[i]) read and written in 16-byte vectors (8 bf16, 4 f32) wherever
// the pointers allow, with enough independent loads in flight per thread to reach copy bandwidth.
// Internal, CUDA code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/bf16.h"
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/dtype.h"

namespace normtape::detail {

// 16-byte vectors of any element type, unconverted: 16 / sizeof(U) elements (bf16 8, f32 4, f64 2),
// for kernels that mix dtypes (AdamW's and Muon's steps).

__device__ inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

__device__ inline void load16(const float* p, float* v) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ inline void load16(const double* p, double* v) {
    const double2 q = *reinterpret_cast<const double2*>(p);
    v[0] = q.x, v[1] = q.y;
}
__device__ inline void load16(const bf16* p, bf16* v) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        v[2 * k].bits = static_cast<uint16_t>(w[k] & 0xffffu);
        v[2 * k + 1].bits = static_cast<uint16_t>(w[k] >> 16);
    }
}
__device__ inline void store16(float* p, const float* v) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void store16(double* p, const double* v) {
    *reinterpret_cast<double2*>(p) = make_double2(v[0], v[1]);
}
__device__ inline void store16(bf16* p, const bf16* v) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = uint32_t(v[2 * k].bits) | (uint32_t(v[2 * k + 1].bits) << 16);
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
// N elements at p (16-byte aligned; N * sizeof(U) a multiple of 16).
template <class U, int N>
__device__ inline void load_vec(const U* p, U (&v)[N]) {
#pragma unroll
    for (int k = 0; k < N; k += 16 / int(sizeof(U))) load16(p + k, v + k);
}
template <class U, int N>
__device__ inline void store_vec(U* p, const U (&v)[N]) {
#pragma unroll
    for (int k = 0; k < N; k += 16 / int(sizeof(U))) store16(p + k, v + k);
}

// A 16-byte vector of T, unpacked into E = 16 / sizeof(T) floats.
template <class T>
struct Pack {
    static constexpr int E = 16 / sizeof(T);
};

// A 16-byte vector already in registers, unpacked (a kernel may keep rows as raw 16-byte vectors:
// 4 registers whatever the dtype, half of what unpacked bf16 would take).
__device__ inline void unpack(const uint4& q, float (&v)[4]) {
    v[0] = __uint_as_float(q.x), v[1] = __uint_as_float(q.y), v[2] = __uint_as_float(q.z), v[3] = __uint_as_float(q.w);
}
__device__ inline void unpack(const uint4& q, float (&v)[8]) {
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
// One 16-byte load at p (16-byte aligned), unpacked. f32 loads a float4, not a uint4: through a
// uint4 ptxas spilled in kernels held to 64 registers.
__device__ inline void load_pack(const float* p, float (&v)[4]) {
    float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ inline void load_pack(const bf16* p, float (&v)[8]) { unpack(*reinterpret_cast<const uint4*>(p), v); }
// E floats rounded to T and packed into a 16-byte vector in registers (bf16: to nearest even).
__device__ inline uint4 pack(const float (&v)[4]) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
}
__device__ inline uint4 pack(const float (&v)[8]) {
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {
        __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<uint32_t*>(&h);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
// One 16-byte store at p (16-byte aligned); bf16 rounds to nearest even.
__device__ inline void store_pack(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void store_pack(bf16* p, const float (&v)[8]) { *reinterpret_cast<uint4*>(p) = pack(v); }

// The inputs of a map: N pointers to n elements each (index_mod[k] > 0: input k is read at
// i % index_mod[k], a row broadcast over the leading dimensions).
template <class T, int N>
struct MapInputs {
    const T* p[N];
    int64_t index_mod[N];
};

// kMapUnroll vectors a thread per grid-stride step: that many independent 16-byte loads per input
// in flight, which is what memory-bound kernels need on Hopper to approach copy bandwidth.
constexpr int kMapUnroll = 4;

// The index of input k for element i: i, or i % index_mod[k] for a broadcast row. I: the index
// type, uint32_t where n fits (a 32-bit modulo is a few instructions, a 64-bit one dozens).
template <class I, class T, int N>
__device__ inline I map_index(const MapInputs<T, N>& in, int k, I i) {
    return in.index_mod[k] > 0 ? i % static_cast<I>(in.index_mod[k]) : i;
}

// out[v*E .. v*E+E) = f(x) for every whole vector v < vectors, E = Pack<T>::E (16-byte aligned
// pointers, index_mod multiples of E). Every input's kMapUnroll vectors are loaded raw before any is
// unpacked, so the loads are in flight together. f: a functor with `__device__ acc_t<T>
// operator()(const acc_t<T> (&x)[N]) const`.
template <class I, class T, int N, class F>
__global__ void __launch_bounds__(cuda::kThreads) map_vector_kernel(T* out, MapInputs<T, N> in, I vectors, F f) {
    constexpr int E = Pack<T>::E;
    const I step = I(gridDim.x) * blockDim.x * kMapUnroll;
    for (I first = I(blockIdx.x) * blockDim.x * kMapUnroll + threadIdx.x; first < vectors; first += step) {
        uint4 raw[kMapUnroll][N];
#pragma unroll
        for (int u = 0; u < kMapUnroll; ++u) {
            const I v = first + I(u) * blockDim.x;
            if (v >= vectors) continue;
#pragma unroll
            for (int k = 0; k < N; ++k)
                raw[u][k] = *reinterpret_cast<const uint4*>(in.p[k] + map_index(in, k, v * I(E)));
        }
#pragma unroll
        for (int u = 0; u < kMapUnroll; ++u) {
            const I v = first + I(u) * blockDim.x;
            if (v >= vectors) break;
            float x[N][E];
#pragma unroll
            for (int k = 0; k < N; ++k) unpack(raw[u][k], x[k]);
            float r[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                float xe[N];
#pragma unroll
                for (int k = 0; k < N; ++k) xe[k] = x[k][e];
                r[e] = f(xe);
            }
            store_pack(out + v * I(E), r);
        }
    }
}

// out[i] = f(x) for start <= i < n, one element a thread (any alignment; f64; a vector map's tail).
template <class I, class T, int N, class F>
__global__ void map_scalar_kernel(T* out, MapInputs<T, N> in, I start, I n, F f) {
    using A = acc_t<T>;
    for (I i = start + I(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
        A x[N];
#pragma unroll
        for (int k = 0; k < N; ++k) x[k] = A(in.p[k][map_index(in, k, i)]);
        out[i] = static_cast<T>(f(x));
    }
}

template <class I, class T, int N, class F>
void map_launch(T* out, const MapInputs<T, N>& in, int64_t n, F f, bool vector, cudaStream_t stream) {
    constexpr int E = std::is_same_v<T, double> ? 1 : Pack<T>::E;
    const int64_t vectors = vector ? n / E : 0, done = vectors * E;
    if constexpr (E > 1) {
        if (vectors > 0) {
            const int64_t per_block = int64_t(cuda::kThreads) * kMapUnroll;
            int64_t blocks = (vectors + per_block - 1) / per_block;
            blocks = blocks > 65535 * 16 ? 65535 * 16 : blocks;
            map_vector_kernel<I, T, N, F>
                <<<static_cast<unsigned>(blocks), cuda::kThreads, 0, stream>>>(out, in, static_cast<I>(vectors), f);
            CUDA_LAUNCH_CHECK();
        }
    }
    if (done < n) {
        map_scalar_kernel<I, T, N, F><<<cuda::blocks_for(n - done), cuda::kThreads, 0, stream>>>(
            out, in, static_cast<I>(done), static_cast<I>(n), f);
        CUDA_LAUNCH_CHECK();
    }
}

// out[i] = f(in...) for i < n on `device`'s stream (out may be one of the inputs: in place).
// Vectors where T is f32 or bf16, every pointer is 16-byte aligned and every index_mod a multiple
// of the vector length (the last n % E elements, if any, one at a time); scalars otherwise.
template <class T, int N, class F>
void map_cuda(T* out, MapInputs<T, N> in, int64_t n, F f, int device) {
    if (n == 0) return;
    constexpr int E = std::is_same_v<T, double> ? 1 : Pack<T>::E;
    bool vector = E > 1 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    for (int k = 0; k < N; ++k)
        vector = vector && reinterpret_cast<uintptr_t>(in.p[k]) % 16 == 0 && in.index_mod[k] % E == 0;
    cudaStream_t stream = cuda::stream(device);
    // uint32_t indices while every index, and the grid-stride loop's next one, stays below 2^32.
    if (n <= (int64_t(1) << 31)) map_launch<uint32_t>(out, in, n, f, vector, stream);
    else map_launch<int64_t>(out, in, n, f, vector, stream);
}

}  // namespace normtape::detail
