// ops/norm/norm_rows.cuh: device helpers of the fast norm kernels (ops/norm/norm_forward.cu,
// ops/norm/norm_backward.cu): rounding to a dtype, loading the weight and bias a vector at a time, copying them to shared
// memory, and the sums over the group of threads that owns a row, behind a barrier of that group's
// warps only. Internal, CUDA code only. Not here: generic vector and cp.async helpers
// (ops/cuda_common.cuh), how rows are spread over threads and blocks (ops/norm/norm_launch.cuh), the
// kernels themselves.
#pragma once

#include <type_traits>

#include "ops/cuda_common.cuh"

namespace normtape::detail::norm {

// The row reduction's floats (2 per warp of a row) at the start of the fast kernels' dynamic
// shared memory, in float4s.
constexpr int kReduceFloat4s = 16;

// v rounded to T and back: what a stored and reloaded element holds.
template <class T>
__device__ inline float rounded(float v) {
    if constexpr (std::is_same_v<T, float>) return v;
    else return __bfloat162float(__float2bfloat16_rn(v));
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
// A barrier number in a register makes ptxas reserve all 16 barriers for the block, which caps an
// SM at 4 such blocks (ncu's "Block Limit Barriers"). IMMEDIATE names the barrier with an
// immediate under a predicate instead (5 barriers reserved), for kernels whose registers let more
// than 4 blocks in; it costs a register, which kernels held to 64 registers cannot spare.
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

}  // namespace normtape::detail::norm
