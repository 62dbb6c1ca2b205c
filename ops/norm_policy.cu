// ops/norm_policy.cu: the CUDA kernels of layer_norm and rms_norm, both policies.
//
// Two versions. The reference (norm_*_reference_cuda) is written to be checked by eye: one block
// per row, statistics with fixed-order block reductions, weight and bias gradients in two
// passes. The fast one (norm_*_cuda, f32 and bf16) is what the ops run; it is tested against the
// reference and the cpu (tests/test_cuda.cpp) and timed by examples/bench_norms.cpp:
// - a row is read once with 16-byte loads: a group of threads_per_row threads (a multiple of
//   32, at most 1024) owns a row, each thread VECS vectors of it (forward_budget,
//   backward_budget, fast_layout); the forward holds its row in registers (bf16 at N > 8192 the
//   next row too), the backward brings its rows into shared memory with cp.async, one row ahead
//   of the one it works on; the backward, and the bf16 forward up to N = 8192, read the weight
//   and bias from shared memory, copied there once per block;
// - the backward's blocks are persistent (as many as fit on the GPU) and walk the rows; the
//   forward's take a few rows a group (f32 one, bf16 four) and retire, new blocks taking their
//   place; a row of several warps synchronizes only its own warps (named barriers);
// - statistics in f32, one reduction per row of the sums of x - x[row, 0] and its square (the
//   shifted-data variance; see the kernel);
// - dweight and dbias: each thread sums its own columns over the rows its group visits, in
//   order, in registers; a block adds its groups' sums into one partial row,
//   and the blocks' partial rows are added in order by a second kernel (no atomics);
// - x_hat as x_hat_from_saved() gives it, the one place where the policy matters, as on the cpu;
//   under SavePolicy::Output the backward works with y - bias where it can and divides by the
//   weight once per column, and per element with an approximate division (2 ulp) where
//   1 / weight does not fit in registers (divide_approx; see the backward kernel).
// The reference kernels take f64, N not a multiple of a vector, misaligned data, and rows longer
// than the fast kernels hold (forward 32768, backward 16384), or rows whose backward does not
// fit in the GPU's shared memory.
// Determinism: the fast backward's dweight and dbias are summed per persistent block (or
// cluster), and the number of blocks depends on the GPU (SM count, occupancy): the same bits run
// to run on one GPU model, not across models.
#include <cooperative_groups.h>
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

// A 16-byte vector already in registers, unpacked (the forward keeps its row as raw 16-byte
// vectors: 4 registers whatever the dtype, half of what unpacked bf16 would take).
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
// One 16-byte load at p, unpacked. (f32 loads a float4: through a uint4, ptxas spilled 12-24
// bytes in the kernels at their 64 registers.)
__device__ inline void load_pack(const float* p, float (&v)[4]) {
    float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ inline void load_pack(const bf16* p, float (&v)[8]) { unpack(*reinterpret_cast<const uint4*>(p), v); }
__device__ inline void store_pack(float* p, const float (&v)[4]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void store_pack(bf16* p, const float (&v)[8]) {
    uint32_t w[4];
    for (int k = 0; k < 4; ++k) {  // round to nearest even, two at a time (same rounding as bf16's)
        __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
        w[k] = *reinterpret_cast<uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// weight or bias of one vector of columns; 1 or 0 where absent.
template <class T>
__device__ inline void load_affine(const T* p, int c, float fill, float (&v)[Pack<T>::E]) {
    if (p) load_pack(p + c * Pack<T>::E, v);
    else for (int e = 0; e < Pack<T>::E; ++e) v[e] = fill;
}

// Copies the weight (1 where absent) to shared memory `to`, and the bias (0 where absent) after it
// if `bias_too`: [N] elements each, 16 bytes a thread at a time. The caller synchronizes the block
// before reading them.
template <class T>
__device__ inline void copy_affine_to_shared(T* to, int N, const T* weight, const T* bias, bool bias_too) {
    constexpr int E = Pack<T>::E;
    float ones[E];
    for (int e = 0; e < E; ++e) ones[e] = 1.0f;
    for (int c = threadIdx.x; c < N / E; c += blockDim.x) {
        if (weight) *reinterpret_cast<uint4*>(to + c * E) = *reinterpret_cast<const uint4*>(weight + c * E);
        else store_pack(to + c * E, ones);
        if (bias_too)
            *reinterpret_cast<uint4*>(to + N + c * E) =
                bias ? *reinterpret_cast<const uint4*>(bias + c * E) : make_uint4(0, 0, 0, 0);
    }
}

// Synchronizes the `threads` threads of row group `group` (0 to 3) on named barrier 1 + group.
// A barrier number in a register makes ptxas reserve all 16 barriers for the block, and an SM
// holds 4 such blocks at most (ncu's "Block Limit Barriers": the bf16 forward at N = 3000 ran 4
// blocks of 192 threads where its registers allowed 6). IMMEDIATE names the barrier with an
// immediate under a predicate instead (5 barriers reserved), for kernels whose registers let
// more than 4 blocks in; it costs a register, which spilled in the kernels already at 64.
template <bool IMMEDIATE>
__device__ inline void row_barrier(int group, int threads) {
    if constexpr (!IMMEDIATE) {
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + group), "r"(threads) : "memory");
        return;
    }
    asm volatile(
        "{\n .reg .pred p;\n"
        " setp.eq.s32 p, %0, 0;\n @p bar.sync 1, %1;\n"
        " setp.eq.s32 p, %0, 1;\n @p bar.sync 2, %1;\n"
        " setp.eq.s32 p, %0, 2;\n @p bar.sync 3, %1;\n"
        " setp.eq.s32 p, %0, 3;\n @p bar.sync 4, %1;\n}\n" ::"r"(group),
        "r"(threads)
        : "memory");
}

// The sums of a and b over the group of threads_per_row threads that owns a row, returned to all
// of them (identical in every lane: the butterfly adds the same pairs). A row of several warps
// adds its warps' sums through shared memory behind a barrier of its own warps only (named
// barrier 1 + group; 0 is __syncthreads'; row_barrier), so that the block's other rows do not
// wait for it; a block holds at most 4 such rows (fast_layout). Every thread of a group must call
// it the same number of times.
template <bool IMMEDIATE>
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
    row_barrier<IMMEDIATE>(group, threads_per_row);
    a = 0, b = 0;
    for (int w = group * warps_per_row; w < (group + 1) * warps_per_row; ++w) {
        a += shared[2 * w];
        b += shared[2 * w + 1];
    }
    row_barrier<IMMEDIATE>(group, threads_per_row);
}

// How the fast kernels spread a row over threads. A Shape is the number of 16-byte vectors of a
// row a thread holds (VECS), the largest block its kernel is compiled for (MAX_BLOCK, its
// __launch_bounds__: at most 64 registers a thread at 1024 threads, 128 at 512), the most
// threads a row may take with it, whether the forward loads a group's next row ahead
// (next_row), whether the kernel reads the weight and bias from shared memory (shared_affine),
// and how many rows a group of the forward takes before its block retires (rows_per_group). A
// Budget lists the shapes to choose from, which fast_layout turns into threads per row.
// - The forward holds its row in registers as raw 16-byte vectors (4 registers each, whatever the
//   dtype): 8 vectors of f32 or 4 of bf16, in blocks of up to 1024 threads. Its blocks are not
//   persistent: a group takes rows_per_group rows, gridDim.x * groups apart, and its block
//   retires, new blocks taking its place. Against persistent blocks (as many as fit, walking all
//   the rows) this measured +2 to +12 points in f32 with one row a group, and +2 to +8 in bf16
//   with 4 (where one row a group lost up to 7 points at N = 8192: each block also pays for its
//   copy of the weight and bias, below). Why is not settled: the occupancy is the same.
//   bf16 rows of more than 256 threads (N > 8192) load the group's next row into registers
//   before this row's reduction, so that loads stay in flight across the barrier of a row of 16
//   warps (+5-7 points at N = 16384; at N <= 8192 0-5 points slower). bf16 rows of up to 256
//   threads read their weight and bias from shared memory, copied there once per block (+1-3
//   points at N = 768, 2048, 3000 and 8192); not f32, whose 2 x 4N bytes a block would cost
//   blocks at N >= 8192, nor beside the next row in registers (1.5-2 points slower at 16384).
// - The backward reads its rows from shared memory (see its kernel) and holds in registers the
//   dweight and dbias sums of its columns (2 floats a column). The more columns a thread owns, the
//   fewer threads share a row's fixed costs (its reduction, its loads of mean and rstd, the loop),
//   which measured faster than more threads with fewer registers: 4 vectors a thread (32 columns of
//   bf16, 16 of f32) in blocks of up to 512 threads, 128 registers a thread. Except bf16 under
//   SavePolicy::Output, whose rows of up to 1024 columns take 2 vectors (two warps at N = 1024, not
//   one), so that the bias and 1 / weight of a thread's 16 columns fit in registers
//   (affine_in_registers: at N = 1024 97-99% of copy against 92-94%, no difference at 768; at 2048
//   and above 2 vectors measured slower), and f32: short rows (up to 128 threads, N <= 1024)
//   measured faster with 2 vectors in 64 registers, and rows of more than 2048 vectors
//   (8192 < N <= 16384; 8 vectors of f32 spill) are split over a thread-block cluster of two blocks
//   of 512 threads (sm_90 and later; see the kernel). Without clusters such rows take 4 vectors in
//   blocks of 1024 threads, at 64 registers and without the weight in shared memory, where the
//   LayerNorm's save-output backward at N = 16384 measured 76% of copy against 91% split. The
//   weight (and the bias under SavePolicy::Output, where it is not in registers) is copied into
//   shared memory once per block, ahead of the ring, so that a row's pass reads it there with one
//   16-byte load a vector instead of a global load, its address and its null-pointer test (bf16
//   backward +3-19 points, save-output the most; f32 +1-15); all shapes but the 1024-thread one,
//   whose one-slot ring leaves no room for two more rows of f32.
// Chosen with bench_norms on an H200 (docs/PERFORMANCE.md).
struct Shape {
    int vecs, max_block, max_row_threads;
    bool next_row;       // forward: the group's next row is loaded into registers before this row's reduction
    bool shared_affine;  // the weight and bias are read from shared memory, copied there once per block
    int rows_per_group;  // forward: rows a group takes before its block retires (0: the backward's persistent blocks)
    int cluster;         // backward: blocks of a thread-block cluster that share a row, each holding a slice of it
};
struct Budget {
    Shape shapes[4];
    int count;
};
template <class T>
constexpr Budget forward_budget() {
    if constexpr (std::is_same_v<T, float>) return {{{8, 1024, 1024, false, false, 1, 1}}, 1};
    else return {{{4, 1024, 256, false, true, 4, 1}, {4, 1024, 1024, true, false, 4, 1}}, 2};
}
template <class T, bool OUTPUT>
constexpr Budget backward_budget() {
    if constexpr (std::is_same_v<T, float>)
        return {{{2, 1024, 128, false, true, 0, 1},
                 {4, 512, 512, false, true, 0, 1},
                 {4, 512, 512, false, true, 0, 2},
                 {4, 1024, 1024, false, false, 0, 1}},
                4};
    else if constexpr (OUTPUT) return {{{2, 512, 64, false, true, 0, 1}, {4, 512, 512, false, true, 0, 1}}, 2};
    else return {{{4, 512, 512, false, true, 0, 1}}, 1};
}
constexpr int kRowsThreads = 256;  // a block holds as many rows as fit in this many threads, one at least
constexpr int kReduceFloat4s = 16;  // 2 floats per warp of the row reduction, at the start of shared memory
// The backward's head: the reduction's floats, then cluster_sum2's two slots, padded to 128 bytes
// so that the rows behind it stay 128-byte aligned (16 bytes off, every backward measured 10
// points slower).
constexpr int kBackwardHeadFloat4s = kReduceFloat4s + 8;
// y, mean and rstd per row, each row's group of threads walking the rows gridDim.x * groups apart.
template <class T, int VECS, int MAX_BLOCK, bool NEXT_ROW, bool SHARED_AFFINE>
__global__ void __launch_bounds__(MAX_BLOCK) norm_forward_fast_kernel(
    T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, const T* __restrict__ x,
    const T* __restrict__ weight, const T* __restrict__ bias, int64_t M, int N, float eps, int threads_per_row) {
    constexpr int E = Pack<T>::E;
    extern __shared__ float4 shared4[];
    float* shared = reinterpret_cast<float*>(shared4);
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int group = threadIdx.x / threads_per_row, vecs_per_row = N / E;
    T* affine = reinterpret_cast<T*>(shared4 + kReduceFloat4s);  // SHARED_AFFINE: weight, then bias
    if constexpr (SHARED_AFFINE) copy_affine_to_shared(affine, N, weight, bias, true);
    uint4 raw[VECS];  // the row's vectors of this thread, as loaded
    uint4 next[NEXT_ROW ? VECS : 1];  // those of the group's next row
    float K_next = 0;
    // Loads row `row` (zeros past M) into `to`, and K = x[row, 0] (LayerNorm) into K.
    auto load_row = [&](int64_t row, uint4 (&to)[VECS], float& K) {
        const bool active = row < M;
        const T* xr = x + row * N;
        K = mean && active ? float(xr[0]) : 0.0f;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            to[k] = active && c < vecs_per_row ? *reinterpret_cast<const uint4*>(xr + c * E) : make_uint4(0, 0, 0, 0);
        }
    };
    const int64_t stride = int64_t(gridDim.x) * groups;
    if constexpr (NEXT_ROW) load_row(int64_t(blockIdx.x) * groups + group, next, K_next);
    for (int64_t base = int64_t(blockIdx.x) * groups; base < M; base += stride) {
        const int64_t row = base + group;
        const bool active = row < M;
        // One reduction per row: sums of d = x - K and d^2 with K = x[row, 0] (LayerNorm; K = 0
        // for RMSNorm), var = mean(d^2) - mean(d)^2. The shift keeps the subtraction from
        // cancelling: mean(d) is a few standard deviations at most, unless x[row, 0] is an outlier.
        float K;
        if constexpr (NEXT_ROW) {
            K = K_next;
#pragma unroll
            for (int k = 0; k < VECS; ++k) raw[k] = next[k];
            if (row + stride < M) load_row(row + stride, next, K_next);
        } else {
            load_row(row, raw, K);
        }
        if (SHARED_AFFINE && base == int64_t(blockIdx.x) * groups) __syncthreads();  // the weight and bias, once
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
        // Immediate barrier numbers where registers let more than 4 blocks in: bf16 without a next row.
        group_sum2<!NEXT_ROW && !std::is_same_v<T, float>>(s, sq, shared, threads_per_row);
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
            if constexpr (SHARED_AFFINE) {
                unpack(reinterpret_cast<const uint4*>(affine)[c], w);
                unpack(reinterpret_cast<const uint4*>(affine + N)[c], b);
            } else {
                load_affine(weight, c, 1.0f, w);
                load_affine(bias, c, 0.0f, b);
            }
            for (int e = 0; e < E; ++e) out[e] = (v[e] - m) * r * w[e] + b[e];
            store_pack(yr + c * E, out);
        }
    }
}

// Where the dweight or dbias sum of element e of vector c lives in shared memory at the end of the
// backward: the vectors' first four columns, then their next four (bf16), as float4s, so that the
// threads of a warp write neighbouring 16-byte words.
__device__ inline float4& sum_slot(float* sums, int vecs_per_row, int c, int quad) {
    return reinterpret_cast<float4*>(sums)[quad * vecs_per_row + c];
}
template <int E>
__device__ inline float sum_at(const float* sums, int vecs_per_row, int j) {
    int c = j / E, e = j % E;
    return sums[((e / 4) * vecs_per_row + c) * 4 + e % 4];
}
__device__ inline void add4(float4& s, const float* v) { s.x += v[0], s.y += v[1], s.z += v[2], s.w += v[3]; }

// a / b to 2 ulp for |b| in [2^-126, 2^126] (under SavePolicy::Output, |weight| >= 1e-3:
// ops/norm_policy.h). FLUSH: div.approx.ftz.f32, a reciprocal and a multiply, which reads a
// subnormal a (|y - bias| < 2^-126) as 0; else __fdividef, which under the default -ftz=false
// also rescales subnormal operands: 6 instructions an element in the SASS instead of 2.
template <bool FLUSH>
__device__ inline float divide_approx(float a, float b) {
    if constexpr (!FLUSH) return __fdividef(a, b);
    float q;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
    return q;
}

// cp.async (sm_80 and later): 16 bytes from global to shared memory without passing through
// registers, and past L1 (.cg). A thread's copies are committed as a group; wait(n) returns
// when at most n of its groups are still in flight. Earlier GPUs copy through a register.
__device__ inline void copy_async16(void* to_shared, const void* from_global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(to_shared));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(from_global) : "memory");
#else
    *static_cast<uint4*>(to_shared) = *static_cast<const uint4*>(from_global);
#endif
}
__device__ inline void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ inline void copy_async_wait(int pending) {  // pending: 0 or 1
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (pending == 0) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#else
    (void)pending;
#endif
}

// dx per row, and this block's partial row [blockIdx.x] of dweight and dbias.
// - The rows come in through a ring of `stages` slots (2, or 1 where 2 do not fit in shared
//   memory) per group, each [dy, saved] of N elements: a thread copies its own vectors of the
//   next row with cp.async while it works on the current one, and reads back only what it copied
//   itself, so the ring needs no barrier. The bytes in flight are the ring's, not the registers'.
//   Both passes over a row read it from the ring, so no row is held in registers; a vector is read
//   into a register first, so that it takes one 16-byte shared load, not four narrow ones.
// - SHARED_AFFINE: the weight (and the bias under OUTPUT) sits in shared memory ahead of the ring,
//   copied there once per block (1 and 0 where absent); else each pass loads it from global memory.
// - A thread owns the same columns in every row its group visits, and sums dy * x_hat and dy of
//   them over those rows, in row order, in registers (VECS vectors of columns: backward_budget).
//   At the end the block's groups add their sums in group order into the ring's memory, and the
//   block writes its partial row.
// - CLUSTER = 2: a thread-block cluster of two blocks shares each of its rows, block r taking
//   columns [r * N / 2, (r + 1) * N / 2) as if they were a row of its own, except that the row's
//   two sums add the other block's through distributed shared memory (cluster_sum2) and each
//   block writes its half of the cluster's partial row. For f32 rows too long for one block of
//   512 threads (backward_budget).
// - __launch_bounds__(MAX_BLOCK, 1): without the 1, ptxas held the cluster kernel to 64
//   registers and spilled.
// - OUTPUT: SavePolicy::Output, where x_hat = (y - bias) / weight. The first pass and the dweight
//   sums work with y - bias (no division: g * x_hat = dy * (y - bias)), and the partial dweight is
//   divided by the weight once per column. Where a thread has at most 16 columns (8 at 64
//   registers: affine_in_registers), it holds their bias and 1 / weight in registers and the
//   second pass multiplies (f32 N = 16384: 95-96% of copy against 91-92%); elsewhere the bias
//   comes from shared memory and the second pass divides with divide_approx<FLUSH> (2 ulp;
//   FLUSH: see norm_backward_fast).
constexpr int kMaxStages = 2;  // a third slot measured slower (fewer groups fit)
// Whether a thread of the backward under SavePolicy::Output holds 1 / weight and the bias of its
// VECS vectors of columns in registers: at most 16 columns, 8 in kernels of 1024 threads (64
// registers). More spilled.
template <class T, int VECS, int MAX_BLOCK>
constexpr bool affine_in_registers() {
    return VECS * Pack<T>::E <= (MAX_BLOCK > 512 ? 8 : 16);
}
// Arrays of a block's columns that the backward keeps in shared memory ahead of its ring (with
// SHARED_AFFINE): the weight, and under SavePolicy::Output the bias unless it is in registers.
template <class T, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, bool OUTPUT>
constexpr int affine_arrays() {
    return SHARED_AFFINE ? (OUTPUT && !affine_in_registers<T, VECS, MAX_BLOCK>() ? 2 : 1) : 0;
}

// The block's rank in its thread-block cluster of CLUSTER blocks (0 without one).
template <int CLUSTER>
__device__ inline int cluster_rank() {
    if constexpr (CLUSTER == 1) return 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
    __trap();  // the host launches clusters only where the device supports them (sm_90 and later)
    return 0;
#endif
}
__device__ inline void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();
#endif
}
// Adds to a and b, each the same in every thread of the block, those of the other block of a
// cluster of two, through its shared memory (`exchange`: two float2 slots, alternated row by
// row, so that a block writing the next row's sums never overwrites sums its peer has yet to
// read: it would first have to pass the next row's cluster barrier, which the peer reaches
// only after reading). Both blocks get the same bits (a + b == b + a). Every thread of both
// blocks calls it, once per row.
__device__ inline void cluster_sum2(float& a, float& b, float2* exchange, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (threadIdx.x == 0) *cluster.map_shared_rank(exchange + parity, cluster.block_rank() ^ 1) = make_float2(a, b);
    cluster.sync();
    const float2 peer = exchange[parity];
    a += peer.x, b += peer.y;
#else
    (void)a, (void)b, (void)exchange, (void)parity;
    __trap();
#endif
}

template <class T, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, int CLUSTER, bool OUTPUT, bool FLUSH>
__global__ void __launch_bounds__(MAX_BLOCK, 1) norm_backward_fast_kernel(
    T* __restrict__ dx, float* __restrict__ partial_w, float* __restrict__ partial_b, const T* __restrict__ dy,
    const T* __restrict__ saved, const float* __restrict__ mean, const float* __restrict__ rstd,
    const T* __restrict__ weight, const T* __restrict__ bias, bool centered, int64_t M, int N, int threads_per_row,
    int stages) {
    static_assert(CLUSTER == 1 || CLUSTER == 2);
    constexpr int E = Pack<T>::E, Q = E / 4;
    constexpr bool kInRegisters = OUTPUT && affine_in_registers<T, VECS, MAX_BLOCK>();
    extern __shared__ float4 shared4[];
    // Block `rank` of a cluster takes columns [rank * cols, (rank + 1) * cols) of the cluster's rows.
    const int cols = N / CLUSTER, rank = cluster_rank<CLUSTER>();
    const int64_t cluster = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
    dy += rank * cols, saved += rank * cols;
    if (dx) dx += rank * cols;
    if (weight) weight += rank * cols;
    if (bias) bias += rank * cols;
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int group = threadIdx.x / threads_per_row, vecs_per_row = cols / E;
    float* reduce = reinterpret_cast<float*>(shared4);
    float2* exchange = reinterpret_cast<float2*>(shared4 + kReduceFloat4s);  // cluster_sum2's slots
    constexpr int kAffine = affine_arrays<T, VECS, MAX_BLOCK, SHARED_AFFINE, OUTPUT>();
    T* affine = reinterpret_cast<T*>(shared4 + kBackwardHeadFloat4s);  // weight, then bias (OUTPUT)
    T* ring = affine + kAffine * cols + size_t(group) * stages * 2 * cols;
    if constexpr (kAffine > 0) copy_affine_to_shared(affine, cols, weight, bias, kAffine > 1);
    float sum_w[VECS][E] = {}, sum_b[VECS][E] = {};
    float inv_w[kInRegisters ? VECS : 1][E], bias_r[kInRegisters ? VECS : 1][E];
    if constexpr (kInRegisters) {
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            c = c < vecs_per_row ? c : 0;
            float w[E];
            load_affine(weight, c, 1.0f, w);
            for (int e = 0; e < E; ++e) inv_w[k][e] = 1.0f / w[e];
            load_affine(bias, c, 0.0f, bias_r[k]);
        }
    }
    // Queues this group's row `row` (none past M) into slot `slot`, as one commit group.
    auto fetch = [&](int64_t row, int slot) {
        if (row < M) {
            T* to = ring + size_t(slot) * 2 * cols;
#pragma unroll
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (c >= vecs_per_row) break;
                copy_async16(to + c * E, dy + row * N + c * E);
                copy_async16(to + cols + c * E, saved + row * N + c * E);
            }
        }
        copy_async_commit();
    };
    const int64_t stride = clusters * groups;
    for (int ahead = 0; ahead < stages - 1; ++ahead) fetch(cluster * groups + group + ahead * stride, ahead);
    if constexpr (kAffine > 0) __syncthreads();
    if constexpr (CLUSTER > 1) cluster_sync();  // the peer block has started before its shared memory is written
    int slot = 0, parity = 0;
    for (int64_t base = cluster * groups; base < M; base += stride) {
        const int64_t row = base + group;
        const bool active = row < M;
        const float m = active && mean ? mean[row] : 0.0f, r = active ? rstd[row] : 0.0f;  // their latency overlaps the wait
        fetch(row + (stages - 1) * stride, (slot + stages - 1) % stages);
        copy_async_wait(stages - 1);
        const T* row_dy = ring + size_t(slot) * 2 * cols;
        const T* row_saved = row_dy + cols;
        slot = slot + 1 == stages ? 0 : slot + 1;
        // From the row's vectors: d = dy, g = dy * weight, and s = x_hat (Input) or y - bias =
        // x_hat * weight (Output: x_hat_from_saved of ops/norm_policy.h without its division).
        auto terms = [&](int k, int c, float (&d)[E], float (&g)[E], float (&s)[E], float (&w)[E]) {
            const uint4 qd = *reinterpret_cast<const uint4*>(row_dy + c * E);
            const uint4 qs = *reinterpret_cast<const uint4*>(row_saved + c * E);
            unpack(qd, d);
            unpack(qs, s);
            if constexpr (kAffine > 0) unpack(reinterpret_cast<const uint4*>(affine)[c], w);
            else load_affine(weight, c, 1.0f, w);
            if constexpr (kInRegisters) {
                for (int e = 0; e < E; ++e) s[e] -= bias_r[k][e];
            } else if constexpr (OUTPUT) {
                float b[E];
                if constexpr (kAffine > 1) unpack(reinterpret_cast<const uint4*>(affine + cols)[c], b);
                else load_affine(bias, c, 0.0f, b);
                for (int e = 0; e < E; ++e) s[e] -= b[e];
            } else {
                for (int e = 0; e < E; ++e) s[e] = (s[e] - m) * r;
            }
            for (int e = 0; e < E; ++e) g[e] = d[e] * w[e];
        };
        float sum_g = 0, sum_gx = 0;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (!active || c >= vecs_per_row) continue;
            float d[E], g[E], s[E], w[E];
            terms(k, c, d, g, s, w);
            for (int e = 0; e < E; ++e) {
                float ds = d[e] * s[e];
                sum_g += g[e];
                sum_gx += OUTPUT ? ds : g[e] * s[e];
                sum_w[k][e] += ds;
                sum_b[k][e] += d[e];
            }
        }
        group_sum2<false>(sum_g, sum_gx, reduce, threads_per_row);
        if constexpr (CLUSTER > 1) cluster_sum2(sum_g, sum_gx, exchange, parity), parity ^= 1;
        if (!active || !dx) continue;
        const float mean_g = centered ? sum_g / N : 0.0f, mean_gx = sum_gx / N;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (c >= vecs_per_row) continue;
            float d[E], g[E], xh[E], w[E], out[E];
            terms(k, c, d, g, xh, w);  // again, from shared memory: cheaper than holding them in registers
            if constexpr (OUTPUT) {
                for (int e = 0; e < E; ++e)
                    xh[e] = kInRegisters ? xh[e] * inv_w[k][e] : divide_approx<FLUSH>(xh[e], w[e]);
            }
            for (int e = 0; e < E; ++e) out[e] = r * (g[e] - mean_g - xh[e] * mean_gx);
            store_pack(dx + row * N + c * E, out);
        }
    }
    // The groups' sums, in group order, into [2][cols] floats where the ring was.
    copy_async_wait(0);
    __syncthreads();
    float* sums_w = reinterpret_cast<float*>(shared4 + kBackwardHeadFloat4s);
    float* sums_b = sums_w + cols;
    for (int g = 0; g < groups; ++g) {
        if (group == g)
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (c >= vecs_per_row) continue;
                for (int q = 0; q < Q; ++q) {
                    float4& w = sum_slot(sums_w, vecs_per_row, c, q);
                    float4& b = sum_slot(sums_b, vecs_per_row, c, q);
                    if (g == 0) w = b = float4{0, 0, 0, 0};
                    add4(w, sum_w[k] + 4 * q);
                    add4(b, sum_b[k] + 4 * q);
                }
            }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float sw = sum_at<E>(sums_w, vecs_per_row, j), sb = sum_at<E>(sums_b, vecs_per_row, j);
        if (OUTPUT && weight) sw /= float(weight[j]);
        if (partial_w) partial_w[cluster * N + rank * cols + j] = sw;
        if (partial_b) partial_b[cluster * N + rank * cols + j] = sb;
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

// How a row is spread over threads: the budget's shape, or -1 where the fast kernels do not apply.
struct FastLayout {
    int shape = -1, threads_per_row = 0, block = 0, cluster = 1;  // threads_per_row: of one block's slice
};

// Threads per row: a multiple of 32, at most the shape's max_row_threads, each with at most the
// shape's vectors of the row; of the budget's shapes, the one that leaves the fewest vector slots
// idle, the earlier on a tie. A block holds as many rows as fit in kRowsThreads threads (at
// most 4 rows of several warps: row_barrier's named barriers). A shape of cluster > 1 splits the
// row into that many equal slices, one a block (threads_per_row is then a slice's); it is taken
// only where `clusters` (DeviceLimits) and no single-block shape before it holds the row.
template <class T>
FastLayout fast_layout(const Budget& budget, int64_t N, std::initializer_list<const void*> ptrs,
                       bool clusters = false) {
    static_assert(kRowsThreads / 64 <= 4);
    FastLayout l;
    constexpr int E = Pack<T>::E;
    if (std::is_same_v<T, double> || N % E != 0) return l;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return l;
    const int64_t vecs_per_row = N / E;
    int64_t best_idle = -1;
    for (int i = 0; i < budget.count; ++i) {
        const Shape& shape = budget.shapes[i];
        if (shape.cluster > 1 && (!clusters || best_idle >= 0 || vecs_per_row % shape.cluster != 0)) continue;
        const int64_t vecs = vecs_per_row / shape.cluster;  // of a block's slice of the row
        int64_t threads = (vecs + shape.vecs - 1) / shape.vecs;
        threads = (threads + 31) / 32 * 32;
        if (threads > shape.max_row_threads) continue;
        int64_t idle = ((vecs + threads - 1) / threads * threads - vecs) * shape.cluster;
        if (best_idle >= 0 && idle >= best_idle) continue;
        best_idle = idle;
        l.shape = i;
        l.cluster = shape.cluster;
        l.threads_per_row = static_cast<int>(threads);
        l.block = l.threads_per_row * std::max(1, kRowsThreads / l.threads_per_row);
    }
    return l;
}

// run(std::integral_constant<int, shape>()) for 0 <= shape < 4, and what it returns; false for other shapes.
template <class Run, int... I>
bool with_shape(int shape, Run& run, std::integer_sequence<int, I...>) {
    bool done = false;
    ((void)(shape == I && (done = run(std::integral_constant<int, I>()))), ...);
    return done;
}
template <class Run>
bool with_shape(int shape, Run run) {
    return with_shape(shape, run, std::make_integer_sequence<int, 4>());
}

// The launch configuration of `block` threads and `shared` bytes of dynamic shared memory a block,
// in clusters of `cluster` blocks where cluster > 1. `attribute` holds the cluster's size.
cudaLaunchConfig_t launch_config(dim3 grid, int block, size_t shared, int cluster, cudaStream_t stream,
                                 cudaLaunchAttribute& attribute) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid, config.blockDim = dim3(block), config.dynamicSmemBytes = shared, config.stream = stream;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = cluster, attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
    config.attrs = &attribute, config.numAttrs = cluster > 1 ? 1 : 0;
    return config;
}

// Blocks of `kernel` that fit on the GPU at once (in whole clusters of `cluster` blocks). The
// occupancy query is asked once per kernel, block, shared size, cluster and device.
template <class Kernel>
int64_t resident_blocks(Kernel kernel, int block, size_t shared_bytes, int device, int cluster = 1) {
    struct Key {
        const void* kernel;
        int block;
        size_t shared;
        int device, cluster;
        bool operator==(const Key& o) const {
            return kernel == o.kernel && block == o.block && shared == o.shared && device == o.device &&
                   cluster == o.cluster;
        }
    };
    static std::mutex mutex;
    static std::vector<std::pair<Key, int64_t>> resident;
    const Key key{reinterpret_cast<const void*>(kernel), block, shared_bytes, device, cluster};
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [k, n] : resident)
        if (k == key) return n;
    int64_t blocks = 0;
    if (cluster == 1) {
        int per_sm = 0, sms = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, shared_bytes));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        blocks = int64_t(std::max(per_sm, 1)) * sms;
    } else {
        cudaLaunchAttribute attribute;
        cudaLaunchConfig_t config = launch_config(dim3(cluster), block, shared_bytes, cluster, nullptr, attribute);
        int n = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
        blocks = int64_t(std::max(n, 1)) * cluster;
    }
    resident.push_back({key, blocks});
    return blocks;
}

// The grid for `rows` rows, `rows_per_block` a sweep of a block: a block per sweep, but at most
// `most` blocks (the kernels walk the rows gridDim.x * rows_per_block apart, so fewer blocks
// cover them all), at least 1, and within CUDA's 2^31 - 1.
unsigned grid_size(int64_t rows, int64_t rows_per_block, int64_t most) {
    int64_t sweeps = (rows + rows_per_block - 1) / rows_per_block;
    return static_cast<unsigned>(std::clamp<int64_t>(std::min(sweeps, most), 1, (int64_t(1) << 31) - 1));
}

// Launches the forward of one shape. Its blocks take ROWS_PER_GROUP rows a group and retire,
// new blocks taking their place (see Shape), except where that would leave the GPU emptier than
// one row a group in as many blocks as fit at once (small M).
template <class T, int VECS, int MAX_BLOCK, bool NEXT_ROW, bool SHARED_AFFINE, int ROWS_PER_GROUP>
void norm_forward_fast(const FastLayout& l, T* y, float* mean, float* rstd, const T* x, const T* weight, const T* bias,
                       int64_t M, int64_t N, double eps, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    auto kernel = norm_forward_fast_kernel<T, VECS, MAX_BLOCK, NEXT_ROW, SHARED_AFFINE>;
    size_t shared = sizeof(float4) * kReduceFloat4s + (SHARED_AFFINE ? 2 * N * sizeof(T) : 0);
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    const int64_t groups = l.block / l.threads_per_row, rows_per_block = groups * ROWS_PER_GROUP;
    const int64_t resident = resident_blocks(kernel, l.block, shared, device);
    unsigned grid = grid_size(M, groups, std::max(resident, (M + rows_per_block - 1) / rows_per_block));
    kernel<<<grid, l.block, shared, stream>>>(y, mean, rstd, x, weight, bias, M, static_cast<int>(N),
                                              static_cast<float>(eps), l.threads_per_row);
    CUDA_LAUNCH_CHECK();
}

// Shared memory of the backward: the row reduction's floats and cluster_sum2's slots, then
// `affine` arrays of a block's cols = N / cluster columns (weight, bias) and the ring of `stages`
// slots of [dy, saved] per group, or the block's dweight/dbias sums ([2][cols] floats) where larger.
template <class T>
size_t backward_shared_bytes(const FastLayout& l, int64_t N, int affine, int stages) {
    const size_t cols = N / l.cluster;
    size_t rows = (affine + size_t(l.block / l.threads_per_row) * stages * 2) * cols * sizeof(T);
    return sizeof(float4) * kBackwardHeadFloat4s + std::max(rows, 2 * cols * sizeof(float));
}

// What the backward needs to know of a device, asked once per device: the shared memory a block
// may opt in to (bytes), and whether rows may be split over thread-block clusters, which needs a
// device that launches them (sm_90 and later) running this file's kernels from code built for
// sm_90 or later (a build for an earlier architecture, run through its PTX, has no cluster code
// and would trap).
struct DeviceLimits {
    int shared_optin = 0;
    bool clusters = false;
};
DeviceLimits device_limits(int device) {
    static std::mutex mutex;
    static std::vector<std::pair<int, DeviceLimits>> known;
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [d, limits] : known)
        if (d == device) return limits;
    (void)cuda::stream(device);  // makes `device` current for the kernel's attributes
    DeviceLimits limits;
    int launch = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&limits.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, device));
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, sum_partial_rows_kernel<float>));
    limits.clusters = launch != 0 && attributes.ptxVersion >= 90;
    known.push_back({device, limits});
    return limits;
}

// Launches the backward of one shape; false where its shared memory does not fit on the GPU. The
// ring takes two slots a row where they fit, else one (the f32 1024-thread shape at N = 16384:
// 2 x 64 KiB a slot).
template <class T, bool OUTPUT, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, int CLUSTER>
bool norm_backward_fast(const FastLayout& l, const DeviceLimits& limits, T* dx, T* dweight, T* dbias, const T* dy,
                        const T* saved, const float* mean, const float* rstd, const T* weight, const T* bias,
                        bool centered, int64_t M, int64_t N, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    // Under SavePolicy::Output, where 1 / weight is not in registers, the second pass divides by
    // the weight with subnormals flushed (divide_approx<true>), except in bf16 rows of two warps
    // (1024 < N <= 2048 here), where __fdividef measured faster in bench_norms on the H200
    // (N = 768-2048, when those rows took one or two warps: 91-96% of copy against 87-92%), though
    // not alone: under ncu, with the caches flushed, the two took the same time at N = 768. In rows
    // of three warps or more the flushing division gained (N = 3000 +5-6 points, 8192 +0-2, 16384
    // +4-7; 4096 -1-2). docs/PERFORMANCE.md.
    auto kernel = norm_backward_fast_kernel<T, VECS, MAX_BLOCK, SHARED_AFFINE, CLUSTER, OUTPUT, OUTPUT>;
    if constexpr (OUTPUT && std::is_same_v<T, bf16> && !affine_in_registers<T, VECS, MAX_BLOCK>())
        if (l.threads_per_row <= 64)
            kernel = norm_backward_fast_kernel<T, VECS, MAX_BLOCK, SHARED_AFFINE, CLUSTER, true, false>;
    const int affine = affine_arrays<T, VECS, MAX_BLOCK, SHARED_AFFINE, OUTPUT>();
    int stages = kMaxStages;
    while (stages > 0 && backward_shared_bytes<T>(l, N, affine, stages) > size_t(limits.shared_optin)) --stages;
    if (stages == 0) return false;
    size_t shared = backward_shared_bytes<T>(l, N, affine, stages);
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    // A block per group of rows, or a cluster of CLUSTER blocks sharing them; each writes its
    // columns of one partial row of dweight and dbias.
    const int64_t partial_rows =
        grid_size(M, l.block / l.threads_per_row, resident_blocks(kernel, l.block, shared, device, CLUSTER) / CLUSTER);
    TensorOptions opts = TensorOptions().dtype(DType::F32).device(Device::cuda(device));
    Tensor pw = dweight ? empty({partial_rows, N}, opts) : Tensor(), pb = dbias ? empty({partial_rows, N}, opts) : Tensor();
    auto ptr = [](const Tensor& t) { return t.defined() ? static_cast<float*>(t.storage()->data()) : nullptr; };
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(partial_rows * CLUSTER)), l.block, shared,
                                              CLUSTER, stream, attribute);
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, dx, ptr(pw), ptr(pb), dy, saved, mean, rstd, weight, bias, centered,
                                  M, static_cast<int>(N), l.threads_per_row, stages));
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
    return true;
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
        FastLayout l = fast_layout<T>(forward_budget<T>(), N, {y, x, weight, bias});
        auto run = [&](auto shape) {
            if constexpr (shape() < forward_budget<T>().count) {
                constexpr Shape s = forward_budget<T>().shapes[shape()];
                norm_forward_fast<T, s.vecs, s.max_block, s.next_row, s.shared_affine, s.rows_per_group>(
                    l, y, mean, rstd, x, weight, bias, M, N, eps, device);
                return true;
            }
            return false;
        };
        if (with_shape(l.shape, run)) return;
    }
    norm_forward_reference_cuda<T>(y, mean, rstd, x, weight, bias, M, N, eps, device);
}

template <class T>
void norm_backward_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* saved, const acc_t<T>* mean,
                        const acc_t<T>* rstd, const T* weight, const T* bias, bool centered, SavePolicy policy,
                        int64_t M, int64_t N, int device) {
    if constexpr (!std::is_same_v<T, double>) {
        const DeviceLimits limits = device_limits(device);
        auto run_policy = [&](auto output) {
            constexpr bool OUTPUT = decltype(output)::value;
            FastLayout l = fast_layout<T>(backward_budget<T, OUTPUT>(), N,
                                          {dx, dweight, dbias, dy, saved, weight, bias}, limits.clusters);
            auto run = [&](auto shape) {
                if constexpr (shape() < backward_budget<T, OUTPUT>().count) {
                    constexpr Shape s = backward_budget<T, OUTPUT>().shapes[shape()];
                    return norm_backward_fast<T, OUTPUT, s.vecs, s.max_block, s.shared_affine, s.cluster>(
                        l, limits, dx, dweight, dbias, dy, saved, mean, rstd, weight, bias, centered, M, N, device);
                }
                return false;
            };
            return with_shape(l.shape, run);
        };
        if (policy == SavePolicy::Output ? run_policy(std::true_type()) : run_policy(std::false_type())) return;
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
