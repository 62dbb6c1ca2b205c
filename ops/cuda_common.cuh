// ops/cuda_common.cuh: device helpers shared by the kernels of ops/ and nn/: the cuBLAS type of
// a dtype, block-wide sums and maxima, and cp.async copies into shared memory. Internal, CUDA
// code only. Not here: 16-byte vectors and the elementwise map (core/cuda_map.cuh, included); the
// host launchers of the shared reductions (column_sum_cuda, single_block_sum_cuda:
// ops/cuda_launchers.h), anything specific to one op (the norms' row groups: ops/norm/norm_rows.cuh).
#pragma once

#include <cuda_bf16.h>
#include <library_types.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda_map.cuh"
#include "core/dtype.h"

namespace normtape::detail {

// The cuBLAS data type of f32, f64 and bf16.
template <class T>
cudaDataType_t cuda_type() {
    if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
    else if constexpr (std::is_same_v<T, double>) return CUDA_R_64F;
    else return CUDA_R_16BF;
}

// The sum of `v` over the block, returned to every thread; blockDim.x a multiple of 32, at most
// 1024. The order of additions is fixed by the block shape, so results are deterministic.
// `shared` holds at least 32 values. Ends with a barrier, so it can be called back to back.
template <class A>
__device__ A block_sum(A v, A* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    A total = 0;
    for (int w = 0; w < warps; ++w) total += shared[w];  // every thread, same order
    __syncthreads();
    return total;
}

// The maximum of `v` over the block, as block_sum.
template <class A>
__device__ A block_max(A v, A* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    A total = shared[0];
    for (int w = 1; w < warps; ++w) total = max(total, shared[w]);
    __syncthreads();
    return total;
}

// ---- cp.async ---------------------------------------------------------------------------------

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
// 4 bytes, as copy_async16 (through L1: .ca, the only form for 4 bytes).
__device__ inline void copy_async4(float* to_shared, const float* from_global) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(to_shared));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(from_global) : "memory");
#else
    *to_shared = *from_global;
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

}  // namespace normtape::detail
