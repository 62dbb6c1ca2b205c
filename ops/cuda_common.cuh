// ops/cuda_common.cuh: device helpers shared by the ops' kernels. Internal, CUDA code only.
#pragma once

#include <library_types.h>

#include <type_traits>

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

}  // namespace normtape::detail
