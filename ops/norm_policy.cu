// ops/norm_policy.cu: the CUDA kernels of layer_norm and rms_norm, both policies.
//
// Two versions. The reference (norm_*_reference_cuda) is written to be checked by eye: one block
// per row, statistics with fixed-order block reductions, weight and bias gradients in two
// passes. The fast one (norm_*_cuda, f32 and bf16) is what the ops run; it is tested against the
// reference and the cpu (tests/test_cuda.cpp) and timed by examples/bench_norms.cpp:
// - a row is read once with 16-byte loads and held in registers as raw vectors: a group of
//   threads_per_row threads (a multiple of 32, at most 1024) owns a row, each thread VECS
//   vectors, within a register budget (forward_budget, backward_budget, fast_layout);
// - blocks are persistent (as many as fit on the GPU) and walk the rows;
// - statistics in f32, one reduction per row of the sums of x - x[row, 0] and its square (the
//   shifted-data variance; see the kernel);
// - dweight and dbias: each thread sums its own columns over the rows its group visits, in
//   order, in registers or in shared memory; a block adds its groups' sums into one partial row,
//   and the blocks' partial rows are added in order by a second kernel (no atomics);
// - x_hat as x_hat_from_saved() gives it, the one place where the policy matters, as on the cpu;
//   under SavePolicy::Output the backward works with y - bias where it can and divides by the
//   weight once per column, or per element with __fdividef (2 ulp; see the backward kernel).
// The reference kernels take f64, N not a multiple of a vector, misaligned data, and rows longer
// than the fast kernels hold (forward 32768; backward 16384, or what the GPU's shared memory
// allows).
// Determinism: the fast backward's dweight and dbias are summed per persistent block, and the
// number of blocks depends on the GPU (SM count, occupancy): the same bits run to run on one GPU
// model, not across models.
#include <cuda_bf16.h>

#include <algorithm>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
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

// Pass 2: out[j] = sum over chunks c, in order, of partial[c, j].
template <class T>
__global__ void sum_chunks_kernel(T* __restrict__ out, const acc_t<T>* __restrict__ partial, int64_t chunks, int64_t N) {
    int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (j >= N) return;
    acc_t<T> s = 0;
    for (int64_t c = 0; c < chunks; ++c) s += partial[c * N + j];
    out[j] = static_cast<T>(s);
}


// ---- the fast kernels -----------------------------------------------------------------------


// A 16-byte vector of T, unpacked into E = 16 / sizeof(T) floats.
template <class T>
struct Pack {
    static constexpr int E = 16 / sizeof(T);
};

__device__ inline void load_pack(const float* p, float (&v)[4]) {
    float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ inline void store_pack(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void load_pack(const bf16* p, float (&v)[8]) {
    uint4 q = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; ++k) {
        v[2 * k] = __uint_as_float(w[k] << 16);
        v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ inline void store_pack(bf16* p, const float (&v)[8]) {
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {  // round to nearest even, two at a time (same rounding as bf16's)
        __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}
// The same from a vector already in registers (the forward keeps its row as raw 16-byte vectors:
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

// weight or bias of one vector of columns; 1 or 0 where absent.
template <class T>
__device__ inline void load_affine(const T* p, int c, float fill, float (&v)[Pack<T>::E]) {
    if (p) load_pack(p + c * Pack<T>::E, v);
    else for (int e = 0; e < Pack<T>::E; ++e) v[e] = fill;
}

// The sums of a and b over the group of threads_per_row threads that owns a row, returned to all
// of them (identical in every lane: the butterfly adds the same pairs). Every thread of the block
// must call it the same number of times (it may use __syncthreads).
__device__ inline void group_sum2(float& a, float& b, float* shared, int threads_per_row) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, offset);
        b += __shfl_xor_sync(0xffffffffu, b, offset);
    }
    int warps_per_row = threads_per_row >> 5;
    if (warps_per_row == 1) return;
    int warp = threadIdx.x >> 5, group = threadIdx.x / threads_per_row;
    if ((threadIdx.x & 31) == 0) {
        shared[2 * warp] = a;
        shared[2 * warp + 1] = b;
    }
    __syncthreads();
    a = 0, b = 0;
    for (int w = group * warps_per_row; w < (group + 1) * warps_per_row; ++w) {
        a += shared[2 * w];
        b += shared[2 * w + 1];
    }
    __syncthreads();
}

// Register budgets, which fast_layout turns into threads per row. Rows are kept as raw 16-byte
// vectors (4 registers each, whatever the dtype) in blocks of at most 1024 threads (64 registers
// a thread, every thread of an SM resident). The forward holds one array: up to 8 vectors of f32
// or 4 of bf16 (32 floats). The backward holds two (dy and the saved tensor) and its threads'
// dweight and dbias sums: in registers up to 8 floats a thread (2 vectors of f32), else in
// shared memory (bf16 takes 3 or 2 vectors a thread: the more bytes a thread has in flight, the
// better, up to what compiles without spilling, nvcc -Xptxas -v). The longest rows take 4.
// Chosen with bench_norms on an H200 (docs/PERFORMANCE.md).
constexpr int kMaxBlock = 1024;
struct Budget {
    int vecs[3];  // vectors per thread to choose from, in order of preference; 0 ends the list
};
template <class T>
constexpr Budget forward_budget() {
    return {{std::is_same_v<T, float> ? 8 : 4, 0, 0}};
}
template <class T>
constexpr Budget backward_budget() {
    if constexpr (std::is_same_v<T, float>) return {{2, 4, 0}};
    else return {{3, 2, 4}};
}
constexpr int kRowsThreads = 256;  // a block holds as many rows as fit in this many threads, one at least

// The backward keeps each thread's dweight/dbias sums in registers when they are at most 8 floats.
template <class T, int VECS>
constexpr bool register_sums() {
    return VECS * Pack<T>::E <= 8;
}

template <class T, int VECS>
__global__ void __launch_bounds__(kMaxBlock) norm_forward_fast_kernel(
    T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, const T* __restrict__ x,
    const T* __restrict__ weight, const T* __restrict__ bias, int64_t M, int N, float eps, int threads_per_row) {
    constexpr int E = Pack<T>::E;
    extern __shared__ float shared[];
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int vecs_per_row = N / E;
    uint4 raw[VECS];  // the row's vectors of this thread, as loaded
    for (int64_t base = int64_t(blockIdx.x) * groups; base < M; base += int64_t(gridDim.x) * groups) {
        const int64_t row = base + threadIdx.x / threads_per_row;
        const bool active = row < M;
        const T* xr = x + row * N;
        // One reduction per row: sums of d = x - K and d^2 with K = x[row, 0] (LayerNorm; K = 0
        // for RMSNorm), var = mean(d^2) - mean(d)^2. The shift keeps the subtraction from
        // cancelling: mean(d) is a few standard deviations at most, unless x[row, 0] is an outlier.
        const float K = mean && active ? float(xr[0]) : 0.0f;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            raw[k] = active && c < vecs_per_row ? *reinterpret_cast<const uint4*>(xr + c * E) : make_uint4(0, 0, 0, 0);
        }
        float s = 0, sq = 0;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            if (k * threads_per_row + lane >= vecs_per_row) continue;
            float v[E];
            unpack(raw[k], v);
            for (int e = 0; e < E; ++e) {
                float d = v[e] - K;
                s += d;
                sq += d * d;
            }
        }
        group_sum2(s, sq, shared, threads_per_row);
        const float shift_mean = mean ? s / N : 0.0f;
        const float m = K + shift_mean;
        const float r = rsqrtf(fmaxf(sq / N - shift_mean * shift_mean, 0.0f) + eps);
        if (!active) continue;
        if (lane == 0) {
            if (mean) mean[row] = m;
            rstd[row] = r;
        }
        T* yr = y + row * N;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (c >= vecs_per_row) continue;
            float v[E], w[E], b[E], out[E];
            unpack(raw[k], v);
            load_affine(weight, c, 1.0f, w);
            load_affine(bias, c, 0.0f, b);
            for (int e = 0; e < E; ++e) out[e] = (v[e] - m) * r * w[e] + b[e];
            store_pack(yr + c * E, out);
        }
    }
}

// Where the dweight or dbias sum of element e of vector c lives in shared memory: the vectors'
// first four columns, then their next four (bf16), as float4s, so that the threads of a warp
// read and write neighbouring 16-byte words.
__device__ inline float4& sum_slot(float* sums, int vecs_per_row, int c, int quad) {
    return reinterpret_cast<float4*>(sums)[quad * vecs_per_row + c];
}
template <int E>
__device__ inline float sum_at(const float* sums, int vecs_per_row, int j) {
    int c = j / E, e = j % E;
    return sums[((e / 4) * vecs_per_row + c) * 4 + e % 4];
}
__device__ inline void add4(float4& s, const float* v) { s.x += v[0], s.y += v[1], s.z += v[2], s.w += v[3]; }

// dx per row, and this block's partial row [blockIdx.x] of dweight and dbias. A thread owns the
// same columns in every row its group visits, so it sums dy * x_hat and dy of its columns over
// those rows, in row order: in registers (register_sums) or in shared memory ([groups][2][N]
// floats, laid out by sum_slot). At the end the groups' sums are added in group order. OUTPUT:
// SavePolicy::Output, where x_hat = (y - bias) / weight: the first pass and the dweight sums work
// with y - bias and divide once per column, the second pass multiplies by 1 / weight computed
// once per column where the sums are in registers, and divides with __fdividef (2 ulp) elsewhere.
template <class T, int VECS, bool OUTPUT>
__global__ void __launch_bounds__(kMaxBlock) norm_backward_fast_kernel(
    T* __restrict__ dx, float* __restrict__ partial_w, float* __restrict__ partial_b, const T* __restrict__ dy,
    const T* __restrict__ saved, const float* __restrict__ mean, const float* __restrict__ rstd,
    const T* __restrict__ weight, const T* __restrict__ bias, bool centered, int64_t M, int N, int threads_per_row) {
    constexpr int E = Pack<T>::E, Q = E / 4;
    constexpr bool kRegisterSums = register_sums<T, VECS>();
    extern __shared__ float4 shared4[];
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int group = threadIdx.x / threads_per_row, vecs_per_row = N / E;
    float* sums = reinterpret_cast<float*>(shared4);                      // [groups][2][N], or [2][N]
    float* reduce = sums + (kRegisterSums ? 1 : groups) * 2 * N;         // 2 per warp
    float* sums_w = sums + (kRegisterSums ? 0 : group * 2 * N);
    float* sums_b = sums_w + N;
    float reg_w[kRegisterSums ? VECS : 1][E] = {}, reg_b[kRegisterSums ? VECS : 1][E] = {};
    float inv_w[kRegisterSums && OUTPUT ? VECS : 1][E];
    for (int k = 0; k < VECS; ++k) {
        int c = k * threads_per_row + lane;
        if (c >= vecs_per_row) continue;
        if constexpr (!kRegisterSums) {
            for (int q = 0; q < Q; ++q)
                sum_slot(sums_w, vecs_per_row, c, q) = sum_slot(sums_b, vecs_per_row, c, q) = float4{0, 0, 0, 0};
        } else if constexpr (OUTPUT) {
            float w[E];
            load_affine(weight, c, 1.0f, w);
            for (int e = 0; e < E; ++e) inv_w[k][e] = 1.0f / w[e];
        }
    }
    uint4 raw_dy[VECS], raw_saved[VECS];  // this thread's vectors of the row, as loaded
    for (int64_t base = int64_t(blockIdx.x) * groups; base < M; base += int64_t(gridDim.x) * groups) {
        const int64_t row = base + group;
        const bool active = row < M;
        const float m = active && mean ? mean[row] : 0.0f, r = active ? rstd[row] : 0.0f;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            bool in = active && c < vecs_per_row;
            raw_dy[k] = in ? *reinterpret_cast<const uint4*>(dy + row * N + c * E) : make_uint4(0, 0, 0, 0);
            raw_saved[k] = in ? *reinterpret_cast<const uint4*>(saved + row * N + c * E) : make_uint4(0, 0, 0, 0);
        }
        // From the raw vectors: d = dy, g = dy * weight, and s = x_hat (Input) or y - bias =
        // x_hat * weight (Output: x_hat_from_saved of ops/norm_policy.h without its division).
        auto terms = [&](int k, int c, float (&d)[E], float (&g)[E], float (&s)[E], float (&w)[E]) {
            unpack(raw_dy[k], d);
            unpack(raw_saved[k], s);
            load_affine(weight, c, 1.0f, w);
            if constexpr (OUTPUT) {
                float b[E];
                load_affine(bias, c, 0.0f, b);
                for (int e = 0; e < E; ++e) s[e] -= b[e];
            } else {
                for (int e = 0; e < E; ++e) s[e] = (s[e] - m) * r;
            }
            for (int e = 0; e < E; ++e) g[e] = d[e] * w[e];
        };
        // Pass 1 needs no division: g * x_hat = dy * s under Output, and the dweight sums add
        // dy * s, divided by the weight once per column at the end.
        float sum_g = 0, sum_gx = 0;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (!active || c >= vecs_per_row) continue;
            float d[E], g[E], sv[E], w[E], ds[E];
            terms(k, c, d, g, sv, w);
            for (int e = 0; e < E; ++e) {
                ds[e] = d[e] * sv[e];
                sum_g += g[e];
                sum_gx += OUTPUT ? ds[e] : g[e] * sv[e];
            }
            if constexpr (kRegisterSums) {
                for (int e = 0; e < E; ++e) reg_w[k][e] += ds[e], reg_b[k][e] += d[e];
            } else {
                for (int q = 0; q < Q; ++q) {
                    add4(sum_slot(sums_w, vecs_per_row, c, q), ds + 4 * q);
                    add4(sum_slot(sums_b, vecs_per_row, c, q), d + 4 * q);
                }
            }
        }
        group_sum2(sum_g, sum_gx, reduce, threads_per_row);
        if (!active || !dx) continue;
        const float mean_g = centered ? sum_g / N : 0.0f, mean_gx = sum_gx / N;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (c >= vecs_per_row) continue;
            float d[E], g[E], xh[E], w[E], out[E];
            terms(k, c, d, g, xh, w);  // again: cheaper than holding them through the reduction
            if constexpr (OUTPUT) {
                for (int e = 0; e < E; ++e) xh[e] = kRegisterSums ? xh[e] * inv_w[k][e] : __fdividef(xh[e], w[e]);
            }
            for (int e = 0; e < E; ++e) out[e] = r * (g[e] - mean_g - xh[e] * mean_gx);
            store_pack(dx + row * N + c * E, out);
        }
    }
    if constexpr (kRegisterSums) {  // the groups' sums into sums_w and sums_b, in group order
        for (int g = 0; g < groups; ++g) {
            if (group == g)
                for (int k = 0; k < VECS; ++k) {
                    int c = k * threads_per_row + lane;
                    if (c >= vecs_per_row) continue;
                    for (int q = 0; q < Q; ++q) {
                        float4& w = sum_slot(sums_w, vecs_per_row, c, q);
                        float4& b = sum_slot(sums_b, vecs_per_row, c, q);
                        if (g == 0) w = b = float4{0, 0, 0, 0};
                        add4(w, reg_w[k] + 4 * q);
                        add4(b, reg_b[k] + 4 * q);
                    }
                }
            __syncthreads();
        }
    } else {
        __syncthreads();
    }
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
        float sw = 0, sb = 0;
        for (int g = 0; g < (kRegisterSums ? 1 : groups); ++g) {
            sw += sum_at<E>(sums + g * 2 * N, vecs_per_row, j);
            sb += sum_at<E>(sums + g * 2 * N + N, vecs_per_row, j);
        }
        if (OUTPUT && weight) sw /= float(weight[j]);
        if (partial_w) partial_w[int64_t(blockIdx.x) * N + j] = sw;
        if (partial_b) partial_b[int64_t(blockIdx.x) * N + j] = sb;
    }
}

// out[j] = sum over r < rows of partial[r, j]: a block of 32 x 32 threads takes 32 columns; thread
// (x, y) adds rows y, y + 32, ... of column x, then the 32 sums of a column are added in order.
// Deterministic, and each row of 32 columns read by a warp at once.
template <class T>
__global__ void sum_partial_rows_kernel(T* __restrict__ out, const float* __restrict__ partial, int64_t rows, int64_t N) {
    __shared__ float sums[32][33];
    int64_t j = blockIdx.x * int64_t(32) + threadIdx.x;
    float s = 0;
    if (j < N)
        for (int64_t r = threadIdx.y; r < rows; r += 32) s += partial[r * N + j];
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < N) {
        float total = 0;
        for (int y = 0; y < 32; ++y) total += sums[y][threadIdx.x];
        out[j] = static_cast<T>(total);
    }
}

// How a row is spread over threads, or vecs == 0 when the fast kernels do not apply.
struct FastLayout {
    int vecs = 0, threads_per_row = 0, block = 0;  // vecs: 16-byte vectors per thread and row
};

// Threads per row: a multiple of 32, at most kMaxBlock, each with at most one of the budget's
// numbers of vectors of the row; of the candidates, the one that leaves the fewest vector slots idle (N =
// 3000 is 375 vectors of bf16: 128 threads x 3), the earlier on a tie. Fewer threads per row
// mean more rows in flight at once, and a row of one warp needs no barrier.
template <class T>
FastLayout fast_layout(Budget budget, int64_t N, std::initializer_list<const void*> ptrs) {
    FastLayout l;
    constexpr int E = Pack<T>::E;
    if (std::is_same_v<T, double> || N % E != 0) return l;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return l;
    const int64_t vecs_per_row = N / E;
    int64_t best_idle = -1;
    for (int candidate : budget.vecs) {
        if (candidate == 0) break;
        int64_t threads = (vecs_per_row + candidate - 1) / candidate;
        threads = (threads + 31) / 32 * 32;
        if (threads > kMaxBlock) continue;
        int64_t vecs = (vecs_per_row + threads - 1) / threads, idle = vecs * threads - vecs_per_row;
        if (best_idle >= 0 && idle >= best_idle) continue;
        best_idle = idle;
        l.threads_per_row = static_cast<int>(threads);
        l.vecs = static_cast<int>(vecs);
        l.block = l.threads_per_row * std::max(1, kRowsThreads / l.threads_per_row);
    }
    return l;
}

// Persistent grid: as many blocks as can be resident at once, at most one per group of rows.
// The occupancy query is asked once per kernel, block, shared size and device.
template <class Kernel>
unsigned persistent_grid(Kernel kernel, int block, size_t shared_bytes, int64_t rows, int rows_per_block, int device) {
    struct Key {
        const void* kernel;
        int block;
        size_t shared;
        int device;
        bool operator==(const Key& o) const {
            return kernel == o.kernel && block == o.block && shared == o.shared && device == o.device;
        }
    };
    static std::mutex mutex;
    static std::vector<std::pair<Key, int>> resident;  // blocks that fit on the GPU at once
    const Key key{reinterpret_cast<const void*>(kernel), block, shared_bytes, device};
    int capacity = 0;
    {
        std::lock_guard<std::mutex> lock(mutex);
        for (const auto& [k, n] : resident)
            if (k == key) capacity = n;
        if (capacity == 0) {
            int per_sm = 0, sms = 0;
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, shared_bytes));
            CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
            capacity = std::max(per_sm, 1) * sms;
            resident.push_back({key, capacity});
        }
    }
    int64_t needed = (rows + rows_per_block - 1) / rows_per_block;
    return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(needed, capacity)));
}

template <class T, int VECS>
void norm_forward_fast(const FastLayout& l, T* y, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                       int64_t M, int64_t N, double eps, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    auto kernel = norm_forward_fast_kernel<T, VECS>;
    size_t shared = 2 * sizeof(float) * (l.block / 32);
    unsigned grid = persistent_grid(kernel, l.block, shared, M, l.block / l.threads_per_row, device);
    kernel<<<grid, l.block, shared, stream>>>(y, mean, rstd, x, weight, bias, M, static_cast<int>(N),
                                              static_cast<float>(eps), l.threads_per_row);
    CUDA_LAUNCH_CHECK();
}

// Shared memory of the backward: 2 floats per warp for the row sums, and the dweight/dbias sums.
template <class T, int VECS>
size_t backward_shared_bytes(const FastLayout& l, int64_t N) {
    size_t sums = register_sums<T, VECS>() ? 1 : size_t(l.block / l.threads_per_row);
    return sizeof(float) * (2 * size_t(l.block / 32) + sums * 2 * size_t(N));
}

template <class T, int VECS>
void norm_backward_fast(const FastLayout& l, T* dx, T* dweight, T* dbias, const T* dy, const T* saved,
                        const float* mean, const float* rstd, const T* weight, const T* bias, bool centered,
                        SavePolicy policy, int64_t M, int64_t N, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    auto kernel = policy == SavePolicy::Output ? norm_backward_fast_kernel<T, VECS, true>
                                               : norm_backward_fast_kernel<T, VECS, false>;
    size_t shared = backward_shared_bytes<T, VECS>(l, N);
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    unsigned grid = persistent_grid(kernel, l.block, shared, M, l.block / l.threads_per_row, device);
    int64_t partial_rows = grid;
    TensorOptions opts = TensorOptions().dtype(DType::F32).device(Device::cuda(device));
    Tensor pw = dweight ? empty({partial_rows, N}, opts) : Tensor(), pb = dbias ? empty({partial_rows, N}, opts) : Tensor();
    auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<float*>(t.storage()->data()) : nullptr; };
    kernel<<<grid, l.block, shared, stream>>>(dx, ptr(pw), ptr(pb), dy, saved, mean, rstd, weight, bias, centered, M,
                                              static_cast<int>(N), l.threads_per_row);
    CUDA_LAUNCH_CHECK();
    unsigned blocks = static_cast<unsigned>((N + 31) / 32);
    if (dweight) {
        sum_partial_rows_kernel<T><<<blocks, dim3(32, 32), 0, stream>>>(dweight, ptr(pw), partial_rows, N);
        CUDA_LAUNCH_CHECK();
    }
    if (dbias) {
        sum_partial_rows_kernel<T><<<blocks, dim3(32, 32), 0, stream>>>(dbias, ptr(pb), partial_rows, N);
        CUDA_LAUNCH_CHECK();
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
    auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<acc_t<T>*>(t.storage()->data()) : nullptr; };
    dim3 grid(static_cast<unsigned>((N + kColumnThreads - 1) / kColumnThreads),
              static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
    norm_param_partials_kernel<T><<<grid, kColumnThreads, 0, stream>>>(ptr(pw), ptr(pb), dy, saved, mean, rstd, weight,
                                                                       bias, policy, M, N);
    CUDA_LAUNCH_CHECK();
    unsigned blocks = static_cast<unsigned>((N + kColumnThreads - 1) / kColumnThreads);
    if (dweight) {
        sum_chunks_kernel<T><<<blocks, kColumnThreads, 0, stream>>>(dweight, ptr(pw), chunks, N);
        CUDA_LAUNCH_CHECK();
    }
    if (dbias) {
        sum_chunks_kernel<T><<<blocks, kColumnThreads, 0, stream>>>(dbias, ptr(pb), chunks, N);
        CUDA_LAUNCH_CHECK();
    }
}


// The fast kernels where they apply (f32 and bf16, see the file comment), else the reference.
template <class T>
void norm_forward_cuda(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* weight, const T* bias, int64_t M,
                       int64_t N, double eps, int device) {
    if constexpr (!std::is_same_v<T, double>) {
        constexpr int kMaxVecs = forward_budget<T>().vecs[0];  // the forward's only candidate
        FastLayout l = fast_layout<T>(forward_budget<T>(), N, {y, x, weight, bias});
        auto run = [&](auto vecs) {
            if constexpr (vecs() <= kMaxVecs) {
                norm_forward_fast<T, vecs()>(l, y, mean, rstd, x, weight, bias, M, N, eps, device);
                return true;
            }
            return false;
        };
        bool done = false;
        switch (l.vecs) {
            case 1: done = run(std::integral_constant<int, 1>()); break;
            case 2: done = run(std::integral_constant<int, 2>()); break;
            case 3: done = run(std::integral_constant<int, 3>()); break;
            case 4: done = run(std::integral_constant<int, 4>()); break;
            case 5: done = run(std::integral_constant<int, 5>()); break;
            case 6: done = run(std::integral_constant<int, 6>()); break;
            case 7: done = run(std::integral_constant<int, 7>()); break;
            case 8: done = run(std::integral_constant<int, 8>()); break;
            default: break;
        }
        if (done) return;
    }
    norm_forward_reference_cuda<T>(y, mean, rstd, x, weight, bias, M, N, eps, device);
}

template <class T>
void norm_backward_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* saved, const acc_t<T>* mean,
                        const acc_t<T>* rstd, const T* weight, const T* bias, bool centered, SavePolicy policy,
                        int64_t M, int64_t N, int device) {
    if constexpr (!std::is_same_v<T, double>) {
        constexpr int kMaxVecs = 4;  // the largest of backward_budget's candidates
        FastLayout l = fast_layout<T>(backward_budget<T>(), N, {dx, dweight, dbias, dy, saved, weight, bias});
        // The dweight/dbias sums must fit in shared memory (up to 128 KiB at N = 16384 where they
        // are not in registers; GPUs before Hopper allow less and take the reference).
        int optin = 0;
        cuda::stream(device);
        CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        auto run = [&](auto vecs) {
            if constexpr (vecs() <= kMaxVecs) {
                if (backward_shared_bytes<T, vecs()>(l, N) > size_t(optin)) return false;
                norm_backward_fast<T, vecs()>(l, dx, dweight, dbias, dy, saved, mean, rstd, weight, bias, centered,
                                              policy, M, N, device);
                return true;
            }
            return false;
        };
        bool done = false;
        switch (l.vecs) {
            case 1: done = run(std::integral_constant<int, 1>()); break;
            case 2: done = run(std::integral_constant<int, 2>()); break;
            case 3: done = run(std::integral_constant<int, 3>()); break;
            case 4: done = run(std::integral_constant<int, 4>()); break;
            default: break;
        }
        if (done) return;
    }
    norm_backward_reference_cuda<T>(dx, dweight, dbias, dy, saved, mean, rstd, weight, bias, centered, policy, M, N,
                                    device);
}

#define NT_INSTANTIATE(T)                                                                                          \
    template void norm_forward_cuda<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int64_t, int64_t,  \
                                       double, int);                                                              \
    template void norm_backward_cuda<T>(T*, T*, T*, const T*, const T*, const acc_t<T>*, const acc_t<T>*, const T*, \
                                        const T*, bool, SavePolicy, int64_t, int64_t, int);                       \
    template void norm_forward_reference_cuda<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int64_t, \
                                                 int64_t, double, int);                                           \
    template void norm_backward_reference_cuda<T>(T*, T*, T*, const T*, const T*, const acc_t<T>*, const acc_t<T>*, \
                                                  const T*, const T*, bool, SavePolicy, int64_t, int64_t, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
