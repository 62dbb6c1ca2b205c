// nn/muon.cu: Muon's step on the GPU: the momentum, normalization and update kernels and the
// Newton-Schulz products through cuBLAS (formulas: nn/muon_update.h; host side: nn/muon.cpp).
//
// Note [Muon on CUDA]
// The work of a Muon step is its orthogonalizations: per matrix [rows, cols] and iteration,
// A = X X^T, B = b A + c A^2 and X = a X + B X, products of m^2 n and m^3 multiply-adds
// (m = min(rows, cols), n = max). The elementwise work (momentum, norm, update) reads and writes
// each element a few times. So the step is organized around the products:
//  - Matrices of one shape, dtype and group form a class; a class is orthogonalized as one batch,
//    strided-batched products (cublasGemmStridedBatchedEx) on consecutive copies [count, rows,
//    cols], so that a GPT's L layers of one matrix are three launches per iteration, not 3 L.
//  - The momentum kernel writes each matrix's update, rounded to bf16, straight into its place in
//    the batch, with per-chunk sums of squares; a second kernel adds a matrix's sums in chunk
//    order (deterministic, no atomics) and divides by the norm. Nothing is read back: the step
//    never waits for the GPU.
//  - No transposition: a tall matrix (rows > cols) Y is iterated in place as A = Y^T Y,
//    Y = a Y + Y B, which is the transposed form of the reference's X = Y^T (B is symmetric).
//  - X = a X + B X is one product (a I + B) X: the polynomial kernel writes b A + a I, which the
//    product c A A accumulates onto (beta 1), and then the update needs no second input.
//  - The last kernel applies p = p (1 - lr wd) - lr s o to the parameter (or its f32 master),
//    reading o from the batch.
// Each product accumulates in f32 (f64 for f64 parameters). A step whose gradient norm is not
// finite writes zeros into the batch and skips the buffer and parameter updates, so the products
// in between run on zeros.
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "nn/muon_update.h"
#include "ops/cuda_common.cuh"

namespace normtape::detail {

namespace {

constexpr int kThreads = 256;

template <class T, class X>
__global__ void __launch_bounds__(kThreads)
    muon_momentum_kernel(const __grid_constant__ MuonMatrices<T> m, int64_t numel, acc_t<T> momentum, bool nesterov,
                         X* __restrict__ x, acc_t<X>* __restrict__ sum, const double* __restrict__ skip_if_nonfinite) {
    using A = acc_t<T>;
    using S = acc_t<X>;
    __shared__ S shared[32];
    const bool skip = skip_if_nonfinite && !isfinite(*skip_if_nonfinite);
    const int i = blockIdx.y;
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk, end = min(numel, start + kMuonChunk);
    const T* g = m.grad[i];
    A* buf = m.buf[i];
    X* xi = x + int64_t(i) * numel;
    S s = 0;
    for (int64_t k = start + threadIdx.x; k < end; k += kThreads) {
        const X v = skip ? X(0) : buf ? X(muon_momentum<A>(A(g[k]), buf + k, momentum, nesterov)) : X(A(g[k]));
        xi[k] = v;
        const S f = S(v);
        s += f * f;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) sum[int64_t(i) * gridDim.x + blockIdx.x] = s;
}

template <class X>
__global__ void __launch_bounds__(kThreads)
    muon_normalize_kernel(X* __restrict__ x, int64_t numel, const acc_t<X>* __restrict__ sum) {
    using S = acc_t<X>;
    __shared__ S shared[32];
    const int i = blockIdx.y;
    const acc_t<X>* si = sum + int64_t(i) * gridDim.x;
    S s = 0;
    for (unsigned c = threadIdx.x; c < gridDim.x; c += kThreads) s += si[c];
    s = block_sum(s, shared);
    const S scale = S(1) / (sqrt(s) + S(kNewtonSchulzEps));
    X* xi = x + int64_t(i) * numel;
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk, end = min(numel, start + kMuonChunk);
    for (int64_t k = start + threadIdx.x; k < end; k += kThreads) xi[k] = X(S(xi[k]) * scale);
}

// b = kNewtonSchulzB a + kNewtonSchulzA I over `count` matrices [m, m].
template <class X>
__global__ void __launch_bounds__(kThreads)
    newton_schulz_poly_kernel(X* __restrict__ b, const X* __restrict__ a, int64_t count, int64_t m) {
    using S = acc_t<X>;
    const int64_t n = count * m * m;
    for (int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x; k < n; k += int64_t(gridDim.x) * kThreads) {
        const int64_t r = k / m % m, c = k % m;
        b[k] = X(S(kNewtonSchulzB) * S(a[k]) + (r == c ? S(kNewtonSchulzA) : S(0)));
    }
}

template <class T, class X>
__global__ void __launch_bounds__(kThreads)
    muon_apply_kernel(const __grid_constant__ MuonMatrices<T> m, int64_t numel, const X* __restrict__ x,
                      acc_t<T> decay, acc_t<T> step, const double* __restrict__ skip_if_nonfinite) {
    using A = acc_t<T>;
    if (skip_if_nonfinite && !isfinite(*skip_if_nonfinite)) return;
    const int i = blockIdx.y;
    T* p = m.p[i];
    A* master = m.master[i];
    const X* xi = x + int64_t(i) * numel;
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk, end = min(numel, start + kMuonChunk);
    for (int64_t k = start + threadIdx.x; k < end; k += kThreads)
        muon_apply<T>(p + k, master ? master + k : nullptr, A(acc_t<X>(xi[k])), decay, step);
}

dim3 grid_of(int64_t numel, int64_t count) {
    return dim3(static_cast<unsigned>(muon_chunks(numel)), static_cast<unsigned>(count));
}

// C = alpha op(A) op(B) + beta C for `count` column-major matrices (cuBLAS's convention), each
// operand `stride` elements after the previous one.
template <class X>
void gemm_batched(int device, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const X* a,
                  int64_t lda, int64_t stride_a, const X* b, int64_t ldb, int64_t stride_b, double beta, X* c,
                  int64_t ldc, int64_t stride_c, int64_t count) {
    constexpr bool f64 = std::is_same_v<X, double>;
    using S = std::conditional_t<f64, double, float>;
    const S al = static_cast<S>(alpha), be = static_cast<S>(beta);
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        cuda::cublas(device), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, int(m), int(n),
        int(k), &al, a, cuda_type<X>(), int(lda), stride_a, b, cuda_type<X>(), int(ldb), stride_b, &be, c,
        cuda_type<X>(), int(ldc), stride_c, int(count), f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
}

}  // namespace

template <class T>
void muon_momentum_cuda(const MuonMatrices<T>& m, int64_t numel, double momentum, bool nesterov, ns_t<T>* x,
                        acc_t<ns_t<T>>* sum, const double* skip_if_nonfinite, int device) {
    cudaStream_t stream = cuda::stream(device);
    muon_momentum_kernel<T, ns_t<T>><<<grid_of(numel, m.count), kThreads, 0, stream>>>(
        m, numel, acc_t<T>(momentum), nesterov, x, sum, skip_if_nonfinite);
    CUDA_CHECK(cudaGetLastError());
}

template <class X>
void muon_normalize_cuda(X* x, int64_t count, int64_t numel, const acc_t<X>* sum, int device) {
    muon_normalize_kernel<X><<<grid_of(numel, count), kThreads, 0, cuda::stream(device)>>>(x, numel, sum);
    CUDA_CHECK(cudaGetLastError());
}

// Row-major X [rows, cols] is cuBLAS's column-major X^T [cols, rows] with leading dimension cols.
// Wide (rows <= cols, m = rows): A = X X^T is, column-major, X^T' X^T' (T, N); X' = (a I + B) X is
// X^T' B. Tall (m = cols): A = Y^T Y is Y^T' Y^T'^T (N, T); Y' = Y (a I + B) is B Y^T'. (X^T'
// names the column-major matrix cuBLAS sees; A and B are symmetric, so their layout is moot.)
template <class X>
X* newton_schulz_cuda(X* x, X* y, X* a, X* b, int64_t count, int64_t rows, int64_t cols, int64_t steps,
                      int device) {
    NT_CHECK_AS(ShapeError, rows <= INT_MAX && cols <= INT_MAX && count <= INT_MAX, "newton_schulz: expected sizes up to ",
                INT_MAX, " (cuBLAS's int), got [", count, ", ", rows, ", ", cols, "]");
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, sx = rows * cols, sa = m * m;
    const int64_t poly_blocks = std::min<int64_t>((count * sa + kThreads - 1) / kThreads, 65535 * 16);
    for (int64_t s = 0; s < steps; ++s) {
        if (tall) gemm_batched(device, false, true, m, m, rows, 1.0, x, cols, sx, x, cols, sx, 0.0, a, m, sa, count);
        else gemm_batched(device, true, false, m, m, cols, 1.0, x, cols, sx, x, cols, sx, 0.0, a, m, sa, count);
        newton_schulz_poly_kernel<X><<<static_cast<unsigned>(poly_blocks), kThreads, 0, cuda::stream(device)>>>(b, a,
                                                                                                              count, m);
        CUDA_CHECK(cudaGetLastError());
        gemm_batched(device, false, false, m, m, m, kNewtonSchulzC, a, m, sa, a, m, sa, 1.0, b, m, sa, count);
        if (tall) gemm_batched(device, false, false, cols, rows, cols, 1.0, b, m, sa, x, cols, sx, 0.0, y, cols, sx, count);
        else gemm_batched(device, false, false, cols, rows, rows, 1.0, x, cols, sx, b, m, sa, 0.0, y, cols, sx, count);
        std::swap(x, y);
    }
    return x;
}

template <class T>
void muon_apply_cuda(const MuonMatrices<T>& m, int64_t numel, const ns_t<T>* x, double decay, double step,
                     const double* skip_if_nonfinite, int device) {
    muon_apply_kernel<T, ns_t<T>><<<grid_of(numel, m.count), kThreads, 0, cuda::stream(device)>>>(
        m, numel, x, acc_t<T>(decay), acc_t<T>(step), skip_if_nonfinite);
    CUDA_CHECK(cudaGetLastError());
}

#define NT_INSTANTIATE(T)                                                                                           \
    template void muon_momentum_cuda<T>(const MuonMatrices<T>&, int64_t, double, bool, ns_t<T>*,                 \
                                        acc_t<ns_t<T>>*, const double*, int);                                     \
    template void muon_apply_cuda<T>(const MuonMatrices<T>&, int64_t, const ns_t<T>*, double, double,             \
                                     const double*, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE
template void muon_normalize_cuda<bf16>(bf16*, int64_t, int64_t, const float*, int);
template void muon_normalize_cuda<double>(double*, int64_t, int64_t, const double*, int);
template bf16* newton_schulz_cuda<bf16>(bf16*, bf16*, bf16*, bf16*, int64_t, int64_t, int64_t, int64_t, int);
template double* newton_schulz_cuda<double>(double*, double*, double*, double*, int64_t, int64_t, int64_t, int64_t,
                                            int);

}  // namespace normtape::detail
