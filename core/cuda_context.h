// core/cuda_context.h: what each CUDA device owns: one stream on which all of normtape's work
// for that device is queued, cuBLAS and cuBLASLt handles sharing one workspace, and a cuRAND
// generator (Philox4x32-10) bound to it. Created on first use and kept for the process's lifetime (destroying them at exit could
// race the driver's own teardown). Included by CUDA code only; not thread-safe, like the rest.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <curand.h>

#include <cstdint>

namespace normtape::cuda {

// Makes `device` current and returns its stream.
cudaStream_t stream(int device);
// The device's cuBLAS handle: on stream(device), default math (no TF32 for f32 products).
cublasHandle_t cublas(int device);
// The device's cuBLASLt handle (its calls pass stream(device) and workspace(device)).
cublasLtHandle_t cublaslt(int device);
// The GEMM workspace of the device, kWorkspaceBytes, shared by the cuBLAS handle and every
// cuBLASLt call: both queue on stream(device), so they never use it at the same time. Allocated
// with cudaMalloc when the context is made, outside normtape's allocator and its statistics, as
// cuBLAS's own workspace would be (32 MiB: NVIDIA's recommendation for Hopper).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
void* workspace(int device);
// The device's generator, seeded by manual_seed (offset reset to 0 at each manual_seed).
curandGenerator_t curand(int device);

// Reseeds every generator created so far, and those created later (called by manual_seed).
void manual_seed(uint64_t seed);

// Threads per block for the simple elementwise kernels, and the blocks to cover n elements with
// a grid-stride loop (capped so that a launch never exceeds the grid limit).
constexpr int kThreads = 256;
inline unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

}  // namespace normtape::cuda
