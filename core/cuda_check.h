// core/cuda_check.h: checks for every CUDA runtime, cuBLAS and cuRAND call and every launch.
// Each failure throws normtape::Error naming the call, the error and file:line (the library
// never exits); a failed allocation (cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED,
// CURAND_STATUS_ALLOCATION_FAILED) throws OutOfMemoryError. Included by CUDA code only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <curand.h>

#include "core/check.h"

#define CUDA_CHECK(call)                                                                                    \
    do {                                                                                                    \
        cudaError_t err_ = (call);                                                                          \
        if (err_ == cudaErrorMemoryAllocation) cudaGetLastError(); /* clear it: the context stays usable */ \
        NT_CHECK_AS(OutOfMemoryError, err_ != cudaErrorMemoryAllocation, "CUDA error: ",                   \
                    cudaGetErrorString(err_), " in ", #call, " at ", __FILE__, ":", __LINE__);              \
        NT_CHECK(err_ == cudaSuccess, "CUDA error: ", cudaGetErrorString(err_), " in ", #call, " at ",     \
                 __FILE__, ":", __LINE__);                                                                  \
    } while (0)

#define CUBLAS_CHECK(call)                                                                                  \
    do {                                                                                                    \
        cublasStatus_t st_ = (call);                                                                        \
        NT_CHECK_AS(OutOfMemoryError, st_ != CUBLAS_STATUS_ALLOC_FAILED, "cuBLAS error: ",                 \
                    cublasGetStatusString(st_), " in ", #call, " at ", __FILE__, ":", __LINE__);            \
        NT_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error: ", cublasGetStatusString(st_), " in ", #call, \
                 " at ", __FILE__, ":", __LINE__);                                                          \
    } while (0)

#define CURAND_CHECK(call)                                                                                  \
    do {                                                                                                    \
        curandStatus_t st_ = (call);                                                                        \
        NT_CHECK_AS(OutOfMemoryError, st_ != CURAND_STATUS_ALLOCATION_FAILED, "cuRAND error ",             \
                    static_cast<int>(st_), " (allocation failed) in ", #call, " at ", __FILE__, ":", __LINE__); \
        NT_CHECK(st_ == CURAND_STATUS_SUCCESS, "cuRAND error ", static_cast<int>(st_), " in ", #call, " at ", \
                 __FILE__, ":", __LINE__);                                                                  \
    } while (0)

// After every <<<...>>>: a bad configuration or a failed launch throws here, not later.
#define CUDA_LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())
