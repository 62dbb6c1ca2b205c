// ops/matmul.cu: matrix products through cuBLAS (cublasGemmEx). The bias row add of linear is
// add_bias_rows_cuda, in ops/elementwise.cu.
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

// Row-major out = op(a) @ op(b) is column-major out^T = op(b)^T @ op(a)^T: a row-major matrix is
// its transpose in column-major order, so the operands swap and keep their own transposition.
template <class T>
void gemm_cuda(T* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
               int64_t b_cols, bool trans_b, int device) {
    int64_t M = trans_a ? a_cols : a_rows, K = trans_a ? a_rows : a_cols;
    int64_t N = trans_b ? b_rows : b_cols;
    NT_CHECK_AS(ShapeError, (trans_b ? b_cols : b_rows) == K, "matmul: expected equal inner dimensions, got ", K,
                " and ", trans_b ? b_cols : b_rows);
    NT_CHECK_AS(ShapeError, M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX, "matmul: expected sizes <= ", INT32_MAX,
                " (cuBLAS's int), got M ", M, ", N ", N, ", K ", K);
    if (M == 0 || N == 0) return;
    using A = acc_t<T>;
    A alpha = 1, beta = 0;
    cublasComputeType_t compute = std::is_same_v<T, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(cuda::cublas(device), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                              static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, b, cuda_type<T>(),
                              static_cast<int>(b_cols), a, cuda_type<T>(), static_cast<int>(a_cols), &beta, out,
                              cuda_type<T>(), static_cast<int>(N), compute, CUBLAS_GEMM_DEFAULT));
}

#define NT_INSTANTIATE(T)                                                                                           \
    template void gemm_cuda<T>(T*, const T*, int64_t, int64_t, bool, const T*, int64_t, int64_t, bool, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
