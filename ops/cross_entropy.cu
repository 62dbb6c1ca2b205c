// ops/cross_entropy.cu: the CUDA kernels of cross_entropy and their launchers.
// - Forward: each row is read once, with 16-byte vector loads, by a warp (rows of up to 256
//   vectors: 2048 bf16 or 1024 f32 columns; a block holds 8 such rows) or by a whole block of 256
//   threads (longer rows). Each thread keeps a running maximum and a sum of exponentials scaled to
//   it (online log-sum-exp, Milakov & Gimelshein 2018, arXiv:1805.02867), rescaling once per 4
//   vectors; the group combines its threads' pairs in a fixed order. The mean over rows is one
//   block's fixed-order sum (single_block_sum_cuda, ops/cuda_common.cu). No atomics.
// - Backward: softmax minus one-hot, row by row with the same groups, 16-byte loads and stores;
//   dlogits may be logits itself (Note [Cross-entropy writes its gradient over its logits],
//   ops/cross_entropy.cpp): every element is read, then written, by one thread.
// - Rows need not start on a 16-byte boundary (V odd, a view at an offset): the elements before
//   a row's first boundary and after its last whole vector are taken one at a time.
// - The logit softcap (softcap > 0, ops/cross_entropy.h): every logit x becomes
//   z = softcap * tanh(x / softcap) as it is read, and the backward multiplies by 1 - tanh^2; the
//   vector kernels take it as a template argument (CAP), so that without a cap they are the
//   kernels without one, arithmetic and speed; the plain kernels branch on softcap > 0.
// f64, and a backward whose dlogits and logits differ in their offset from a 16-byte boundary, run
// the plain kernels (a block per row in the forward, one thread per element in the backward).
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

// Most blocks of a launch (as cuda::blocks_for); the kernels' groups walk the rows.
constexpr int64_t kMaxRowBlocks = 65535 * 16;
// Threads a block of the vector kernels; a warp's rows: 8 a block.
constexpr int kBlock = 256;
// 16-byte vectors a thread loads before it uses them (bytes in flight).
constexpr int kUnroll = 4;
// Rows of at most this many vectors go to a warp each (at most 2 sweeps of kUnroll vectors a lane).
constexpr int64_t kWarpRowVecs = 32 * 2 * kUnroll;
// log2(e), for exp(x) = exp2(x * log2(e)).
constexpr float kLog2e = 1.4426950408889634f;

// ---- the vector kernels (f32, bf16) -----------------------------------------------------------

// A row of V elements at `row`: `head` elements up to its first 16-byte boundary, `vecs` whole
// 16-byte vectors, `tail` elements after them.
struct RowSplit {
    int head, tail;
    int64_t vecs;
};
template <class T>
__device__ inline RowSplit split_row(const T* row, int64_t V) {
    constexpr int E = Pack<T>::E;
    int64_t head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(row) % 16) % 16 / sizeof(T));
    head = min(head, V);
    const int64_t vecs = (V - head) / E;
    return {static_cast<int>(head), static_cast<int>(V - head - vecs * E), vecs};
}
// The column of the k-th element taken one at a time (k < head + tail).
__device__ inline int64_t scalar_column(const RowSplit& r, int64_t V, int k) {
    return k < r.head ? k : V - r.tail + (k - r.head);
}

// 2^x by the hardware's approximation (ex2.approx.ftz: at most 2 ulp; results below 2^-126,
// which no sum or gradient here can tell from 0 at f32 precision, are flushed to 0). exp(x) is
// exp2(x * log2(e)); the difference x - m is taken first, so that large logits lose no precision.
__device__ inline float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The logit the loss sees: x, or under CAP, c * tanh(x / c) with x / c taken as x * inv_c
// (inv_c = 1 / c in f32) and tanhf (2 ulp). c * tanh(-inf) = -c: a logit of -inf adds exp(-c - m).
template <bool CAP>
__device__ inline float soft_cap(float x, float c, float inv_c) {
    if constexpr (CAP)
        return c * tanhf(x * inv_c);
    else
        return x;
}

// The gradient of one element, (exp(z - l) - [is_target]) * g, times dz/dx = 1 - tanh(x / c)^2
// under CAP (z and tanh as soft_cap's).
template <bool CAP>
__device__ inline float element_grad(float x, float l, bool is_target, float g, float c, float inv_c) {
    if constexpr (CAP) {
        const float th = tanhf(x * inv_c);
        return (fast_exp2((c * th - l) * kLog2e) - (is_target ? 1.0f : 0.0f)) * g * (1.0f - th * th);
    } else {
        return (fast_exp2((x - l) * kLog2e) - (is_target ? 1.0f : 0.0f)) * g;
    }
}

// Adds the pair (m2, s2) into the running pair (m, s): m the maximum, s the sum of exp(x - m).
// m starts at -FLT_MAX, not -inf, so that m - max never reads -inf - -inf (a row's elements that
// are all -inf give s = 0, lse = -inf, as on the cpu).
__device__ inline void combine(float& m, float& s, float m2, float s2) {
    const float top = fmaxf(m, m2);
    s = s * fast_exp2((m - top) * kLog2e) + s2 * fast_exp2((m2 - top) * kLog2e);
    m = top;
}

// A 16-byte vector of -inf, standing for a vector past the row's end (no maximum, no exponential).
template <class T>
__device__ inline uint4 minus_inf_vector() {
    const uint32_t w = std::is_same_v<T, float> ? 0xff800000u : 0xff80ff80u;
    return make_uint4(w, w, w, w);
}

// The largest of `top` and the elements of the raw vectors. bf16 compares pairs of elements as
// they are stored (max.bf16x2, exact), half the instructions of unpacking them first.
template <class T>
__device__ inline float vectors_max(const uint4 (&raw)[kUnroll], float top) {
    if constexpr (std::is_same_v<T, float>) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            float v[4];
            unpack(raw[u], v);
            top = fmaxf(top, fmaxf(fmaxf(v[0], v[1]), fmaxf(v[2], v[3])));
        }
        return top;
    } else {
        auto pair = [](uint32_t w) { return *reinterpret_cast<const __nv_bfloat162*>(&w); };
        __nv_bfloat162 a = __hmax2(pair(raw[0].x), pair(raw[0].y)), b = __hmax2(pair(raw[0].z), pair(raw[0].w));
#pragma unroll
        for (int u = 1; u < kUnroll; ++u) {
            a = __hmax2(a, __hmax2(pair(raw[u].x), pair(raw[u].y)));
            b = __hmax2(b, __hmax2(pair(raw[u].z), pair(raw[u].w)));
        }
        a = __hmax2(a, b);
        return fmaxf(top, fmaxf(__low2float(a), __high2float(a)));
    }
}

// Combines (m, s) over the row's group, a warp or the whole block (then through `shared`,
// 2 floats a warp, behind two barriers), in a fixed order; every thread gets the result.
template <bool WARP>
__device__ inline void group_combine(float& m, float& s, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, offset), s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        combine(m, s, m2, s2);
    }
    if constexpr (!WARP) {
        const int warp = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) shared[2 * warp] = m, shared[2 * warp + 1] = s;
        __syncthreads();
        m = shared[0], s = shared[1];
        for (int w = 1; w < kBlock / 32; ++w) combine(m, s, shared[2 * w], shared[2 * w + 1]);
        __syncthreads();
    }
}

// Per row i: lse[i] = m + log(sum over v of exp(z[i, v] - m)), m = max over v of z[i, v];
// term[i] = lse[i] - z[i, targets[i]], z = soft_cap<CAP>(logits). logits: [M, V]; targets: [M];
// lse, term: [M] f32; softcap: the cap (read under CAP only). A warp (WARP) or the block owns a
// row; the groups walk the rows gridDim.x * groups apart.
template <class T, bool WARP, bool CAP>
__global__ void __launch_bounds__(kBlock) cross_entropy_forward_kernel(float* __restrict__ lse,
                                                                       float* __restrict__ term,
                                                                       const T* __restrict__ logits,
                                                                       const int64_t* __restrict__ targets,
                                                                       int64_t M, int64_t V, float softcap) {
    constexpr int E = Pack<T>::E, GROUP = WARP ? 32 : kBlock, GROUPS = kBlock / GROUP;
    __shared__ float shared[2 * kBlock / 32];
    const int lane = threadIdx.x % GROUP;
    const float inv_c = CAP ? 1.0f / softcap : 0.0f;
    for (int64_t i = int64_t(blockIdx.x) * GROUPS + threadIdx.x / GROUP; i < M; i += int64_t(gridDim.x) * GROUPS) {
        const T* row = logits + i * V;
        const float x_target = lane == 0 ? soft_cap<CAP>(float(row[targets[i]]), softcap, inv_c) : 0.0f;
        const RowSplit r = split_row(row, V);
        float m = -FLT_MAX, s = 0.0f;
        for (int k = lane; k < r.head + r.tail; k += GROUP)
            combine(m, s, soft_cap<CAP>(float(row[scalar_column(r, V, k)]), softcap, inv_c), 1.0f);
        const T* body = row + r.head;
        for (int64_t c0 = lane; c0 < r.vecs; c0 += int64_t(kUnroll) * GROUP) {
            uint4 raw[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                raw[u] = c0 + u * GROUP < r.vecs ? *reinterpret_cast<const uint4*>(body + (c0 + u * GROUP) * E)
                                                 : minus_inf_vector<T>();
            // One rescale for the kUnroll vectors. Under CAP, the raw vectors' maximum, capped:
            // tanh increases, so that is z's maximum (to tanhf's rounding, which an exponent of
            // the shifted sum tolerates), at one tanh per kUnroll vectors.
            const float top = CAP ? fmaxf(m, soft_cap<CAP>(vectors_max<T>(raw, -FLT_MAX), softcap, inv_c))
                                  : vectors_max<T>(raw, m);
            s *= fast_exp2((m - top) * kLog2e);
            m = top;
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                if (c0 + u * GROUP >= r.vecs) continue;
                float v[E];
                unpack(raw[u], v);
#pragma unroll
                for (int e = 0; e < E; ++e) s += fast_exp2((soft_cap<CAP>(v[e], softcap, inv_c) - m) * kLog2e);
            }
        }
        group_combine<WARP>(m, s, shared);
        if (lane == 0) {
            const float l = m + logf(s);
            lse[i] = l;
            term[i] = l - x_target;
        }
    }
}

// dlogits[i, v] = element_grad<CAP>(logits[i, v], lse[i], v == targets[i], g), g = *grad / M, read
// on the device (no host synchronization for the loss's gradient): (exp(z - lse) - onehot) * g,
// times 1 - tanh^2 under CAP. logits, dlogits: [M, V] (the same array, or two arrays at the same
// offset from a 16-byte boundary); lse, targets: [M]; softcap: the cap (read under CAP only).
// Groups as in the forward. Not __restrict__: dlogits may be logits.
template <class T, bool WARP, bool CAP>
__global__ void __launch_bounds__(kBlock) cross_entropy_backward_kernel(T* dlogits, const T* logits,
                                                                        const float* __restrict__ lse,
                                                                        const int64_t* __restrict__ targets,
                                                                        const T* __restrict__ grad, int64_t M,
                                                                        int64_t V, float softcap) {
    constexpr int E = Pack<T>::E, GROUP = WARP ? 32 : kBlock, GROUPS = kBlock / GROUP;
    const float g = float(*grad) / float(M);
    const float inv_c = CAP ? 1.0f / softcap : 0.0f;
    const int lane = threadIdx.x % GROUP;
    for (int64_t i = int64_t(blockIdx.x) * GROUPS + threadIdx.x / GROUP; i < M; i += int64_t(gridDim.x) * GROUPS) {
        const T* row = logits + i * V;
        T* drow = dlogits + i * V;
        const float l = lse[i];
        const int64_t t = targets[i];
        const RowSplit r = split_row(row, V);
        for (int k = lane; k < r.head + r.tail; k += GROUP) {
            const int64_t v = scalar_column(r, V, k);
            drow[v] = static_cast<T>(element_grad<CAP>(float(row[v]), l, v == t, g, softcap, inv_c));
        }
        const T* body = row + r.head;
        T* dbody = drow + r.head;
        for (int64_t c0 = lane; c0 < r.vecs; c0 += int64_t(kUnroll) * GROUP) {
            uint4 raw[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
                if (c0 + u * GROUP < r.vecs) raw[u] = *reinterpret_cast<const uint4*>(body + (c0 + u * GROUP) * E);
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const int64_t c = c0 + u * GROUP;
                if (c >= r.vecs) continue;
                const int64_t place = t - r.head - c * E;  // the target's place in this vector, if there
                const int target_e = place >= 0 && place < E ? static_cast<int>(place) : -1;
                float v[E];
                unpack(raw[u], v);
#pragma unroll
                for (int e = 0; e < E; ++e) v[e] = element_grad<CAP>(v[e], l, e == target_e, g, softcap, inv_c);
                store_pack(dbody + c * E, v);
            }
        }
    }
}

// ---- the plain kernels (f64; a backward of misaligned pairs) ---------------------------------

// The logit the loss sees, in acc_t: x where c == 0, c * tanh(x / c) where c > 0 (as the cpu).
template <class A>
__device__ inline A plain_soft_cap(A x, A c) {
    return c > 0 ? c * tanh(x / c) : x;
}

// As cross_entropy_forward_kernel, in acc_t<T>, a block per row, one element at a time; c: the
// softcap (0: none).
template <class T>
__global__ void cross_entropy_forward_plain_kernel(acc_t<T>* __restrict__ lse, acc_t<T>* __restrict__ term,
                                                   const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                                   int64_t M, int64_t V, acc_t<T> c) {
    using A = acc_t<T>;
    __shared__ A shared[32];
    for (int64_t i = blockIdx.x; i < M; i += gridDim.x) {
        const T* row = logits + i * V;
        A m = plain_soft_cap(A(row[0]), c);
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = max(m, plain_soft_cap(A(row[v]), c));
        m = block_max(m, shared);
        A s = 0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += exp(plain_soft_cap(A(row[v]), c) - m);
        s = block_sum(s, shared);
        if (threadIdx.x == 0) {
            A l = m + log(s);
            lse[i] = l;
            term[i] = l - plain_soft_cap(A(row[targets[i]]), c);
        }
    }
}

// As cross_entropy_backward_kernel, in acc_t<T>, one element a thread (grid-stride); c: the
// softcap (0: none). dlogits may be logits.
template <class T>
__global__ void cross_entropy_backward_plain_kernel(T* dlogits, const T* logits, const acc_t<T>* __restrict__ lse,
                                                    const int64_t* __restrict__ targets,
                                                    const T* __restrict__ grad, int64_t M, int64_t V, acc_t<T> c) {
    using A = acc_t<T>;
    const A g = A(*grad) / A(M);
    for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < M * V; k += int64_t(gridDim.x) * blockDim.x) {
        int64_t i = k / V, v = k % V;
        if (c > 0) {
            const A th = tanh(A(logits[k]) / c);
            dlogits[k] =
                static_cast<T>((exp(c * th - lse[i]) - (v == targets[i] ? A(1) : A(0))) * g * (A(1) - th * th));
        } else {
            dlogits[k] = static_cast<T>((exp(A(logits[k]) - lse[i]) - (v == targets[i] ? A(1) : A(0))) * g);
        }
    }
}

// The grid of the vector kernels: a block per 8 rows (warps) or per row, at most kMaxRowBlocks.
unsigned row_grid(int64_t M, bool warp_rows) {
    const int64_t rows_per_block = warp_rows ? kBlock / 32 : 1;
    return static_cast<unsigned>(std::min((M + rows_per_block - 1) / rows_per_block, kMaxRowBlocks));
}

// Queues the vector kernels of a row group (WARP) with or without the cap (softcap > 0), on stream.
template <class T, bool WARP>
void forward_rows(float* lse, float* term, const T* logits, const int64_t* targets, int64_t M, int64_t V,
                  double softcap, cudaStream_t stream) {
    const float c = static_cast<float>(softcap);
    if (softcap > 0)
        cross_entropy_forward_kernel<T, WARP, true><<<row_grid(M, WARP), kBlock, 0, stream>>>(lse, term, logits,
                                                                                              targets, M, V, c);
    else
        cross_entropy_forward_kernel<T, WARP, false><<<row_grid(M, WARP), kBlock, 0, stream>>>(lse, term, logits,
                                                                                               targets, M, V, c);
}
template <class T, bool WARP>
void backward_rows(T* dlogits, const T* logits, const float* lse, const int64_t* targets, const T* grad, int64_t M,
                   int64_t V, double softcap, cudaStream_t stream) {
    const float c = static_cast<float>(softcap);
    if (softcap > 0)
        cross_entropy_backward_kernel<T, WARP, true><<<row_grid(M, WARP), kBlock, 0, stream>>>(dlogits, logits, lse,
                                                                                               targets, grad, M, V, c);
    else
        cross_entropy_backward_kernel<T, WARP, false><<<row_grid(M, WARP), kBlock, 0, stream>>>(dlogits, logits, lse,
                                                                                                targets, grad, M, V, c);
}

}  // namespace

// The per-row terms live in a temporary [M] acc_t<T> tensor, freed on return: the caching
// allocator may hand it out again at once, as later work is queued on the same stream.
template <class T>
void cross_entropy_forward_cuda(T* loss, acc_t<T>* lse, const T* logits, const int64_t* targets, int64_t M, int64_t V,
                                double softcap, int device) {
    cudaStream_t stream = cuda::stream(device);
    Tensor term = empty({M}, TensorOptions().dtype(stat_dtype(dtype_of<T>())).device(Device::cuda(device)));
    acc_t<T>* pt = device_ptr<acc_t<T>>(term);
    if constexpr (std::is_same_v<T, double>) {
        unsigned blocks = static_cast<unsigned>(std::min(M, kMaxRowBlocks));
        cross_entropy_forward_plain_kernel<T><<<blocks, cuda::kThreads, 0, stream>>>(lse, pt, logits, targets, M, V,
                                                                                     softcap);
    } else if (V / Pack<T>::E <= kWarpRowVecs) {
        forward_rows<T, true>(lse, pt, logits, targets, M, V, softcap, stream);
    } else {
        forward_rows<T, false>(lse, pt, logits, targets, M, V, softcap, stream);
    }
    CUDA_LAUNCH_CHECK();
    single_block_sum_cuda<acc_t<T>, T>(loss, pt, M, 1.0 / static_cast<double>(M), device);
}

// dlogits may equal logits (the node writes the gradient over its saved logits).
template <class T>
void cross_entropy_backward_cuda(T* dlogits, const T* logits, const acc_t<T>* lse, const int64_t* targets,
                                 const T* grad, int64_t M, int64_t V, double softcap, int device) {
    cudaStream_t stream = cuda::stream(device);
    if constexpr (!std::is_same_v<T, double>) {
        if ((reinterpret_cast<uintptr_t>(dlogits) - reinterpret_cast<uintptr_t>(logits)) % 16 == 0) {
            if (V / Pack<T>::E <= kWarpRowVecs)
                backward_rows<T, true>(dlogits, logits, lse, targets, grad, M, V, softcap, stream);
            else
                backward_rows<T, false>(dlogits, logits, lse, targets, grad, M, V, softcap, stream);
            CUDA_LAUNCH_CHECK();
            return;
        }
    }
    cross_entropy_backward_plain_kernel<T><<<cuda::blocks_for(M * V), cuda::kThreads, 0, stream>>>(
        dlogits, logits, lse, targets, grad, M, V, static_cast<acc_t<T>>(softcap));
    CUDA_LAUNCH_CHECK();
}

#define NT_INSTANTIATE(T)                                                                                 \
    template void cross_entropy_forward_cuda<T>(T*, acc_t<T>*, const T*, const int64_t*, int64_t, int64_t, double, \
                                                int);                                                             \
    template void cross_entropy_backward_cuda<T>(T*, const T*, const acc_t<T>*, const int64_t*, const T*,  \
                                                 int64_t, int64_t, double, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
