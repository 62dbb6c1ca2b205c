// nn/optim/adamw.cu: the multi-tensor AdamW step and the gradient norm's kernels on the GPU (formula:
// nn/optim/adamw_update.h; host side: nn/optim/adamw.cpp). block_sum is the ops' (ops/cuda_common.cuh: nn
// may use ops). Not here: the choice of chunks and launches, and the caching of AdamW's table
// (nn/optim/adamw.cpp).
//
// Note [Multi-tensor AdamW and the gradient norm]
// A GPT has ~150 parameter tensors; a kernel per tensor is ~150 short launches per step, each too
// small to reach memory bandwidth. Instead every tensor is cut into chunks of kMultiTensorChunk
// elements and one launch covers all the chunks of one dtype on one device, a block per chunk
// (as PyTorch's multi_tensor_apply). AdamW's pointers that stay put from step to step (parameter,
// master copy, moments) live in a device table that AdamW builds once and rebuilds only when a
// pointer or the set of parameters with a gradient changes; the gradients, reallocated by every
// backward, go as kernel arguments (at most kAdamWGradsPerLaunch per launch). A block reads its
// elements with 16-byte vectors when all its pointers are 16-byte aligned, else one by one, and
// applies adamw_update to each, so an element's bits do not depend on the path taken.
// clip_grad_norm_ never reads the norm back: one block per chunk writes the chunk's sum of squares
// (in double), one block adds those partials in a fixed order (deterministic, no atomics) and
// writes the norm and the clip coefficient to device memory, and a scaling kernel reads the
// coefficient there (returning at once where it is 1). AdamW may read the norm to skip a step
// whose norm is not finite, still without a synchronization.
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "nn/optim/adamw_update.h"
#include "ops/cuda_common.cuh"

namespace normtape::detail {

namespace {

constexpr int kThreads = 256;

static_assert(kMultiTensorChunk % 16 == 0, "a chunk must keep 16-byte alignment");
static_assert(sizeof(AdamWGrads<float>) + 128 <= 4096 && sizeof(GradList) + 64 <= 4096,
              "kernel arguments must stay within 4 KiB");

// The tensor of block `b` in a GradList (the first i with chunk_end[i] > b) and the chunk's
// first element offset within it.
__device__ inline int grad_list_tensor(const GradList& list, int b, int64_t* start) {
    int lo = 0, hi = list.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (list.chunk_end[mid] > b) hi = mid;
        else lo = mid + 1;
    }
    *start = int64_t(b - (lo > 0 ? list.chunk_end[lo - 1] : 0)) * kMultiTensorChunk;
    return lo;
}

// One chunk of the AdamW table per block (Note [Multi-tensor AdamW and the gradient norm]). The
// bf16 master copy is read instead of the parameter and rounded into it; f32 and f64 have none.
// A thread takes E consecutive elements at a time: one 16-byte vector of each array when all
// are aligned and E elements remain, else element by element (the chunk's tail, or a tensor
// whose pointers are not aligned); either way they go through the same E calls of adamw_update
// (one loop with one set of call sites also keeps ptxas from spilling).
template <class T>
__global__ void __launch_bounds__(kThreads)
    adamw_multi_tensor_kernel(const AdamWTensor<T>* __restrict__ tensors, const AdamWChunk* __restrict__ chunks,
                              const __grid_constant__ AdamWGrads<T> grads, AdamWStep s,
                              const double* __restrict__ scalars, const double* __restrict__ skip_if_nonfinite) {
    using A = acc_t<T>;
    constexpr bool kMaster = std::is_same_v<T, bf16>;
    constexpr int E = 16 / sizeof(T);  // elements of a 16-byte vector of T
    if (skip_if_nonfinite && !isfinite(*skip_if_nonfinite)) return;
    const AdamWChunk c = chunks[blockIdx.x];
    const AdamWTensor<T> t = tensors[c.tensor];
    s.weight_decay = t.weight_decay;
    s.lr = scalars[0] * t.lr_scale;
    s.bias_correction1 = scalars[2];
    s.bias_correction2 = scalars[3];
    const int64_t start = int64_t(c.index) * kMultiTensorChunk;
    const int n = static_cast<int>(min(kMultiTensorChunk, t.numel - start));
    T* p = t.p + start;
    A* master = kMaster ? t.master + start : nullptr;
    A* m = t.m + start;
    A* v = t.v + start;
    const T* g = grads.grad[c.tensor - grads.first_tensor] + start;
    const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) && (!kMaster || aligned16(master));
    for (int i = threadIdx.x * E; i < n; i += kThreads * E) {
        const bool full = vec && i + E <= n;
        T pv[E], gv[E];
        A wv[E], mv[E], vv[E];
        if (full) {
            load_vec(g + i, gv);
            load_vec(m + i, mv);
            load_vec(v + i, vv);
            if constexpr (kMaster) load_vec(master + i, wv);
            else load_vec(p + i, pv);
        } else {
#pragma unroll
            for (int k = 0; k < E; ++k) {
                const bool in = i + k < n;
                gv[k] = in ? g[i + k] : T(0);
                mv[k] = in ? m[i + k] : A(0);
                vv[k] = in ? v[i + k] : A(0);
                if constexpr (kMaster) wv[k] = in ? master[i + k] : A(0);
                else pv[k] = in ? p[i + k] : T(0);
            }
        }
#pragma unroll
        for (int k = 0; k < E; ++k) adamw_update<T>(&pv[k], kMaster ? &wv[k] : nullptr, gv[k], &mv[k], &vv[k], s);
        if (full) {
            store_vec(p + i, pv);
            if constexpr (kMaster) store_vec(master + i, wv);
            store_vec(m + i, mv);
            store_vec(v + i, vv);
        } else {
#pragma unroll
            for (int k = 0; k < E; ++k)
                if (i + k < n) {
                    p[i + k] = pv[k];
                    if constexpr (kMaster) master[i + k] = wv[k];
                    m[i + k] = mv[k];
                    v[i + k] = vv[k];
                }
        }
    }
}

// partial[b] = sum of x^2 over the chunk of block b, in double; the order of additions is fixed
// by the block shape.
template <class T>
__global__ void __launch_bounds__(kThreads)
    grad_sum_squares_kernel(double* __restrict__ partial, const __grid_constant__ GradList list) {
    __shared__ double shared[32];
    constexpr int E = 16 / sizeof(T);
    int64_t start = 0;
    const int i_tensor = grad_list_tensor(list, blockIdx.x, &start);
    const T* x = static_cast<const T*>(list.data[i_tensor]) + start;
    const int n = static_cast<int>(min(kMultiTensorChunk, list.numel[i_tensor] - start));
    double s = 0;
    int tail = 0;
    if (aligned16(x)) {
        tail = n / E * E;
#pragma unroll 4
        for (int i = threadIdx.x * E; i < tail; i += kThreads * E) {
            T xv[E];
            load_vec(x + i, xv);
#pragma unroll
            for (int k = 0; k < E; ++k) {
                const double d = double(acc_t<T>(xv[k]));
                s += d * d;
            }
        }
    }
    for (int i = tail + threadIdx.x; i < n; i += kThreads) {
        const double d = double(acc_t<T>(x[i]));
        s += d * d;
    }
    s = block_sum(s, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: thread t adds partial[t], partial[t + kThreads], ... in order, block_sum adds the
// threads' sums in a fixed order; then the norm and the clip coefficient, in double.
__global__ void __launch_bounds__(kThreads)
    clip_coef_kernel(double* __restrict__ norm, double* __restrict__ coef, const double* __restrict__ partial,
                     int64_t n, double max_norm) {
    __shared__ double shared[32];
    double s = 0;
    for (int64_t i = threadIdx.x; i < n; i += kThreads) s += partial[i];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) {
        const double r = sqrt(s);
        *norm = r;
        *coef = r > max_norm ? max_norm / (r + 1e-6) : 1.0;
    }
}

// x *= coef[0] over the chunk of block b, rounded as Tensor::mul_ rounds; nothing where it is 1.
template <class T>
__global__ void __launch_bounds__(kThreads)
    grad_scale_kernel(const __grid_constant__ GradList list, const double* __restrict__ coef) {
    using A = acc_t<T>;
    constexpr int E = 16 / sizeof(T);
    const double c = *coef;
    if (c == 1.0) return;
    const A a = static_cast<A>(c);
    int64_t start = 0;
    const int i_tensor = grad_list_tensor(list, blockIdx.x, &start);
    T* x = static_cast<T*>(list.data[i_tensor]) + start;
    const int n = static_cast<int>(min(kMultiTensorChunk, list.numel[i_tensor] - start));
    int tail = 0;
    if (aligned16(x)) {
        tail = n / E * E;
        for (int i = threadIdx.x * E; i < tail; i += kThreads * E) {
            T xv[E];
            load_vec(x + i, xv);
#pragma unroll
            for (int k = 0; k < E; ++k) xv[k] = static_cast<T>(A(xv[k]) * a);
            store_vec(x + i, xv);
        }
    }
    for (int i = tail + threadIdx.x; i < n; i += kThreads) x[i] = static_cast<T>(A(x[i]) * a);
}

}  // namespace

template <class T>
void adamw_multi_tensor_cuda(const AdamWTensor<T>* tensors, const AdamWChunk* chunks, int64_t num_chunks,
                             const AdamWGrads<T>& grads, const AdamWStep& s, const double* scalars,
                             const double* skip_if_nonfinite, int device) {
    if (num_chunks == 0) return;
    adamw_multi_tensor_kernel<T><<<static_cast<unsigned>(num_chunks), kThreads, 0, cuda::stream(device)>>>(
        tensors, chunks, grads, s, scalars, skip_if_nonfinite);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void grad_sum_squares_cuda(double* partial, const GradList& list, int device) {
    const int chunks = list.count > 0 ? list.chunk_end[list.count - 1] : 0;
    if (chunks == 0) return;
    grad_sum_squares_kernel<T><<<chunks, kThreads, 0, cuda::stream(device)>>>(partial, list);
    CUDA_LAUNCH_CHECK();
}

void clip_coef_cuda(double* norm, double* coef, const double* partial, int64_t n, double max_norm, int device) {
    clip_coef_kernel<<<1, kThreads, 0, cuda::stream(device)>>>(norm, coef, partial, n, max_norm);
    CUDA_LAUNCH_CHECK();
}

template <class T>
void grad_scale_cuda(const GradList& list, const double* coef, int device) {
    const int chunks = list.count > 0 ? list.chunk_end[list.count - 1] : 0;
    if (chunks == 0) return;
    grad_scale_kernel<T><<<chunks, kThreads, 0, cuda::stream(device)>>>(list, coef);
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                   \
    template void adamw_multi_tensor_cuda<T>(const AdamWTensor<T>*, const AdamWChunk*, int64_t,            \
                                             const AdamWGrads<T>&, const AdamWStep&, const double*,        \
                                             const double*, int);                                          \
    template void grad_sum_squares_cuda<T>(double*, const GradList&, int);                                \
    template void grad_scale_cuda<T>(const GradList&, const double*, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
