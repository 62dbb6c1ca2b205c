// nn/optim/muon.cu: Muon's step on the GPU: the momentum, normalization and update kernels and the
// Newton-Schulz products through cuBLAS (formulas: nn/optim/muon_update.h; host side: nn/optim/muon.cpp).
//
// Note [Muon on CUDA]
// The work of a Muon step is its orthogonalizations: per matrix [rows, cols] and iteration,
// A = X X^T, B = b A + c A^2 and X = a X + B X, products of m^2 n and m^3 multiply-adds
// (m = min(rows, cols), n = max). The elementwise work (momentum, norm, update) reads and writes
// each element a few times. So the step is organized around the products:
//  - Matrices of one shape, dtype and group form a class; a class is orthogonalized as one batch,
//    strided-batched products on consecutive copies [count, rows, cols], so that a GPT's L layers
//    of one matrix are three launches per iteration, not 3 L.
//  - The products are cuBLASLt's (gemm_strided_batched_cuda, ops/matmul.cu), whose output D may
//    differ from the matrix C it adds: B = c A A + b A is one product. X' = a X + B X is computed
//    as (B + a I) X: a kernel adds a to B's diagonal (m elements a matrix), and the product then
//    reads no third matrix (reading X as C costs 10-25% of that product's time on an H200, where
//    the diagonal costs a launch). The price: a + B_jj is rounded to bf16 as one number (about
//    0.008 of a, where the reference rounds a X per element), well inside bf16's error of the
//    whole iteration (2e-2 against an f64 iteration, the tests). The products' descriptors and
//    algorithm are made once per problem and kept.
//  - The momentum kernel writes each matrix's update, rounded to bf16, straight into its place in
//    the batch, with per-chunk sums of squares; one block per matrix adds its sums in chunk order
//    (deterministic, no atomics), and a third kernel divides by the norm. Nothing is read back:
//    the step never waits for the GPU.
//  - No transposition: a tall matrix (rows > cols) Y is iterated in place as A = Y^T Y,
//    Y = a Y + Y B, which is the transposed form of the reference's X = Y^T (B is symmetric).
//  - The last kernel applies p = p (1 - lr wd) - lr s o to the parameter (or its f32 master),
//    reading o from the batch.
//  - The elementwise kernels move 16-byte vectors wherever a matrix's pointers allow (else the
//    same formula element by element), a block per 4096 elements of one matrix.
// Each product accumulates in f32 (f64 for f64 parameters). A step whose gradient norm is not
// finite writes zeros into the batch and skips the buffer and parameter updates, so the products
// in between run on zeros.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/cuda_map.cuh"
#include "nn/optim/muon_update.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

constexpr int kThreads = 256;
static_assert(kMuonChunk % 16 == 0, "a chunk must keep 16-byte alignment");

// Elements per thread and vector: 16 bytes of the orthogonalization's dtype (8 bf16, 2 f64).
template <class X>
constexpr int kVec = 16 / int(sizeof(X));

template <class T, class X>
__global__ void __launch_bounds__(kThreads)
    muon_momentum_kernel(const __grid_constant__ MuonMatrices<T> m, int64_t numel, acc_t<T> momentum, bool nesterov,
                         X* __restrict__ x, acc_t<X>* __restrict__ sum, const double* __restrict__ skip_if_nonfinite) {
    using A = acc_t<T>;
    using S = acc_t<X>;
    constexpr int E = kVec<X>;
    __shared__ S shared[32];
    const bool skip = skip_if_nonfinite && !isfinite(*skip_if_nonfinite);
    const int i = blockIdx.y;
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk;
    const int n = static_cast<int>(min(kMuonChunk, numel - start));
    const T* g = m.grad[i] + start;
    A* buf = m.buf[i] ? m.buf[i] + start : nullptr;
    X* xi = x + int64_t(i) * numel + start;
    const bool vec = aligned16(g) && aligned16(xi) && (!buf || aligned16(buf));
    S s = 0;
    for (int k = threadIdx.x * E; k < n; k += kThreads * E) {
        const bool full = vec && k + E <= n;
        T gv[E];
        A bv[E];
        X xv[E];
        if (full) {
            load_vec(g + k, gv);
            if (buf) load_vec(buf + k, bv);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                gv[e] = k + e < n ? g[k + e] : T(0);
                bv[e] = buf && k + e < n ? buf[k + e] : A(0);
            }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {  // a tail's missing elements are zeros, and add nothing
            xv[e] = skip ? X(0) : buf ? X(muon_momentum<A>(A(gv[e]), &bv[e], momentum, nesterov)) : X(A(gv[e]));
            const S f = S(xv[e]);
            s += f * f;
        }
        if (full) {
            store_vec(xi + k, xv);
            if (buf && !skip) store_vec(buf + k, bv);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e)
                if (k + e < n) {
                    xi[k + e] = xv[e];
                    if (buf && !skip) buf[k + e] = bv[e];
                }
        }
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) sum[int64_t(i) * gridDim.x + blockIdx.x] = s;
}

// sum[i chunks] = the sum of sum[i chunks .. (i + 1) chunks) for matrix i = blockIdx.x.
template <class S>
__global__ void __launch_bounds__(kThreads) muon_matrix_sum_kernel(S* __restrict__ sum, int64_t chunks) {
    __shared__ S shared[32];
    S* si = sum + int64_t(blockIdx.x) * chunks;
    S s = 0;
    for (int64_t c = threadIdx.x; c < chunks; c += kThreads) s += si[c];
    s = block_sum(s, shared);  // every thread has read its chunks: the first may be written over
    if (threadIdx.x == 0) si[0] = s;
}

template <class X>
__global__ void __launch_bounds__(kThreads)
    muon_normalize_kernel(X* __restrict__ x, int64_t numel, const acc_t<X>* __restrict__ sum) {
    using S = acc_t<X>;
    constexpr int E = kVec<X>;
    const int i = blockIdx.y;
    const S scale = S(1) / (sqrt(sum[int64_t(i) * gridDim.x]) + S(kNewtonSchulzEps));
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk;
    const int n = static_cast<int>(min(kMuonChunk, numel - start));
    X* xi = x + int64_t(i) * numel + start;
    const bool vec = aligned16(xi);
    for (int k = threadIdx.x * E; k < n; k += kThreads * E) {
        X xv[E];
        if (vec && k + E <= n) {
            load_vec(xi + k, xv);
#pragma unroll
            for (int e = 0; e < E; ++e) xv[e] = X(S(xv[e]) * scale);
            store_vec(xi + k, xv);
        } else {
            for (int e = 0; e < E && k + e < n; ++e) xi[k + e] = X(S(xi[k + e]) * scale);
        }
    }
}

template <class T, class X>
__global__ void __launch_bounds__(kThreads)
    muon_apply_kernel(const __grid_constant__ MuonMatrices<T> m, int64_t numel, const X* __restrict__ x,
                      const double* __restrict__ scalars, double lr_scale, double weight_decay, double aspect,
                      const double* __restrict__ skip_if_nonfinite) {
    using A = acc_t<T>;
    constexpr int E = kVec<X>;
    if (skip_if_nonfinite && !isfinite(*skip_if_nonfinite)) return;
    const double lr = __dmul_rn(scalars[0], lr_scale);  // _rn: no fused multiply-add, as on the host
    const A decay = A(__dsub_rn(1.0, __dmul_rn(lr, weight_decay))), step = A(__dmul_rn(lr, aspect));
    const int i = blockIdx.y;
    const int64_t start = int64_t(blockIdx.x) * kMuonChunk;
    const int n = static_cast<int>(min(kMuonChunk, numel - start));
    T* p = m.p[i] + start;
    A* master = m.master[i] ? m.master[i] + start : nullptr;
    const X* xi = x + int64_t(i) * numel + start;
    const bool vec = aligned16(p) && aligned16(xi) && (!master || aligned16(master));
    for (int k = threadIdx.x * E; k < n; k += kThreads * E) {
        const bool full = vec && k + E <= n;
        T pv[E];
        A wv[E];
        X xv[E];
        if (full) {
            load_vec(xi + k, xv);
            if (master) load_vec(master + k, wv);
            else load_vec(p + k, pv);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const bool in = k + e < n;
                xv[e] = in ? xi[k + e] : X(0);
                wv[e] = in && master ? master[k + e] : A(0);
                pv[e] = in && !master ? p[k + e] : T(0);
            }
        }
#pragma unroll
        for (int e = 0; e < E; ++e) muon_apply<T>(&pv[e], master ? &wv[e] : nullptr, A(acc_t<X>(xv[e])), decay, step);
        if (full) {
            store_vec(p + k, pv);
            if (master) store_vec(master + k, wv);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e)
                if (k + e < n) {
                    p[k + e] = pv[e];
                    if (master) master[k + e] = wv[e];
                }
        }
    }
}

// b[i][j][j] += kNewtonSchulzA for each of `count` matrices [m, m].
template <class X>
__global__ void __launch_bounds__(kThreads) add_diagonal_kernel(X* __restrict__ b, int64_t count, int64_t m) {
    const int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x;
    if (k >= count * m) return;
    X* d = b + (k / m) * m * m + (k % m) * (m + 1);
    *d = X(acc_t<X>(*d) + acc_t<X>(kNewtonSchulzA));
}

dim3 grid_of(int64_t numel, int64_t count) {
    return dim3(static_cast<unsigned>(muon_chunks(numel)), static_cast<unsigned>(count));
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
void muon_normalize_cuda(X* x, int64_t count, int64_t numel, acc_t<X>* sum, int device) {
    cudaStream_t stream = cuda::stream(device);
    muon_matrix_sum_kernel<acc_t<X>><<<static_cast<unsigned>(count), kThreads, 0, stream>>>(sum, muon_chunks(numel));
    CUDA_CHECK(cudaGetLastError());
    muon_normalize_kernel<X><<<grid_of(numel, count), kThreads, 0, stream>>>(x, numel, sum);
    CUDA_CHECK(cudaGetLastError());
}

// Row-major X [rows, cols] is cuBLAS's column-major X^T [cols, rows] with leading dimension cols.
// Wide (rows <= cols, m = rows): A = X X^T is, column-major, X^T' X^T' (T, N); X' = (B + a I) X
// is X^T' (B + a I). Tall (m = cols): A = Y^T Y is Y^T' Y^T'^T (N, T); Y' = Y (B + a I) is
// (B + a I) Y^T'. (X^T' names the column-major matrix cuBLAS sees; A and B are symmetric, so
// their layout is moot.)
template <class X>
X* newton_schulz_cuda(X* x, X* y, X* a, X* b, int64_t count, int64_t rows, int64_t cols, int64_t steps,
                      int device) {
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, sx = rows * cols, sa = m * m;
    for (int64_t s = 0; s < steps; ++s) {
        if (tall)
            gemm_strided_batched_cuda(false, true, m, m, rows, 1.0, x, cols, sx, x, cols, sx, 0.0, a, a, m, sa, count,
                                      device);
        else
            gemm_strided_batched_cuda(true, false, m, m, cols, 1.0, x, cols, sx, x, cols, sx, 0.0, a, a, m, sa, count,
                                      device);
        gemm_strided_batched_cuda(false, false, m, m, m, kNewtonSchulzC, a, m, sa, a, m, sa, kNewtonSchulzB, a, b, m,
                                  sa, count, device);
        add_diagonal_kernel<X><<<static_cast<unsigned>((count * m + kThreads - 1) / kThreads), kThreads, 0,
                                 cuda::stream(device)>>>(b, count, m);
        CUDA_CHECK(cudaGetLastError());
        if (tall)
            gemm_strided_batched_cuda(false, false, cols, rows, cols, 1.0, b, m, sa, x, cols, sx, 0.0, y, y, cols, sx,
                                      count, device);
        else
            gemm_strided_batched_cuda(false, false, cols, rows, rows, 1.0, x, cols, sx, b, m, sa, 0.0, y, y, cols, sx,
                                      count, device);
        std::swap(x, y);
    }
    return x;
}

template <class T>
void muon_apply_cuda(const MuonMatrices<T>& m, int64_t numel, const ns_t<T>* x, const double* scalars,
                     double lr_scale, double weight_decay, double aspect, const double* skip_if_nonfinite, int device) {
    muon_apply_kernel<T, ns_t<T>><<<grid_of(numel, m.count), kThreads, 0, cuda::stream(device)>>>(
        m, numel, x, scalars, lr_scale, weight_decay, aspect, skip_if_nonfinite);
    CUDA_CHECK(cudaGetLastError());
}

#define NT_INSTANTIATE(T)                                                                                           \
    template void muon_momentum_cuda<T>(const MuonMatrices<T>&, int64_t, double, bool, ns_t<T>*,                 \
                                        acc_t<ns_t<T>>*, const double*, int);                                     \
    template void muon_apply_cuda<T>(const MuonMatrices<T>&, int64_t, const ns_t<T>*, const double*, double,      \
                                     double, double, const double*, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE
template void muon_normalize_cuda<bf16>(bf16*, int64_t, int64_t, float*, int);
template void muon_normalize_cuda<double>(double*, int64_t, int64_t, double*, int);
template bf16* newton_schulz_cuda<bf16>(bf16*, bf16*, bf16*, bf16*, int64_t, int64_t, int64_t, int64_t, int);
template double* newton_schulz_cuda<double>(double*, double*, double*, double*, int64_t, int64_t, int64_t, int64_t,
                                            int);

}  // namespace normtape::detail
