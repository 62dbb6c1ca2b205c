// ops/norm/norm_backward.cu: the fast CUDA backward of layer_norm and rms_norm (f32 and bf16, both
// policies), and norm_backward_cuda, which runs it where it applies and the reference
// (ops/norm/norm_reference.cu) elsewhere: f64, N not a multiple of a 16-byte vector, misaligned data,
// rows longer than the budget holds (16384 columns), or whose ring does not fit in the GPU's
// shared memory. Tested against the reference and the cpu (tests/test_cuda.cpp), timed by
// examples/bench/bench_norms.cpp.
// - Blocks are persistent (as many as fit on the GPU) and walk the rows; a group of threads
//   brings its rows into shared memory with cp.async, one row ahead of the one it works on, and
//   reads the weight and bias from shared memory, copied there once per block.
// - dweight and dbias: each thread sums its own columns over the rows its group visits, in order,
//   in registers; a block adds its groups' sums into one partial row, and the blocks' partial rows
//   are added in order by column_sum_cuda (no atomics).
// - x_hat as x_hat_from_saved() gives it (ops/norm/norm_policy.h), the one place where the policy
//   matters, as on the cpu; under SavePolicy::Output the backward works with y - bias where it can
//   and divides by the weight once per column, and per element with an approximate division
//   (2 ulp) where 1 / weight does not fit in registers (divide_approx).
// - With dresidual (the fused norm's gradient of its sum, ops/norm/fused_norm.h), dx is the norm's
//   dx rounded to T plus dresidual, rounded again: the add op's arithmetic on the norm's dx.
// Determinism: dweight and dbias are summed per persistent block (or cluster), and the number of
// blocks depends on the GPU (SM count, occupancy): the same bits run to run on one GPU model, not
// across models.
// Not here: the forward (ops/norm/norm_forward.cu), launch planning (ops/norm/norm_launch.cuh), the row
// group helpers (ops/norm/norm_rows.cuh), vector and cp.async helpers (ops/cuda_common.cuh).
#include <cooperative_groups.h>

#include <algorithm>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"
#include "ops/norm/norm_launch.cuh"
#include "ops/norm/norm_rows.cuh"

namespace normtape::detail {

namespace {

using namespace norm;

// The backward's shapes (Shape in ops/norm/norm_launch.cuh). The backward reads its rows from shared
// memory (see its kernel) and holds in registers the dweight and dbias sums of its columns (2
// floats a column). The more columns a thread owns, the fewer threads share a row's fixed costs
// (its reduction, its loads of mean and rstd, the loop): 4 vectors a thread (32 columns of bf16,
// 16 of f32) in blocks of up to 512 threads, 128 registers a thread. Except:
// - bf16 under SavePolicy::Output: rows of up to 1024 columns take 2 vectors, so that the bias and
//   1 / weight of a thread's 16 columns fit in registers (affine_in_registers);
// - f32: short rows (up to 128 threads, N <= 1024) take 2 vectors in 64 registers, and rows of
//   more than 2048 vectors (8192 < N <= 16384; 8 vectors of f32 spill) are split over a
//   thread-block cluster of two blocks of 512 threads (sm_90 and later; see the kernel). Without
//   clusters such rows take 4 vectors in blocks of 1024 threads, at 64 registers and without the
//   weight in shared memory.
// The weight (and the bias under SavePolicy::Output, where it is not in registers) is copied into
// shared memory once per block, ahead of the ring, so that a row's pass reads it there with one
// 16-byte load a vector instead of a global load, its address and its null-pointer test; all
// shapes but the 1024-thread one, whose one-slot ring leaves no room for two more rows of f32.
template <class T, bool OUTPUT>
constexpr Budget backward_budget() {
    if constexpr (std::is_same_v<T, float>)
        return {{{2, 1024, 128, false, true, 0, 1},
                 {4, 512, 512, false, true, 0, 1},
                 {4, 512, 512, false, true, 0, 2},
                 {4, 1024, 1024, false, false, 0, 1}},
                4};
    else if constexpr (OUTPUT) return {{{2, 512, 64, false, true, 0, 1}, {4, 512, 512, false, true, 0, 1}}, 2};
    else return {{{4, 512, 512, false, true, 0, 1}}, 1};
}
// Whether the backward with dresidual loads a row's dresidual vectors into registers ahead of the
// row's first pass (4 registers a vector), or in its second pass: ahead where a thread keeps at
// least 64 registers beyond its dweight and dbias sums (2 * VECS * E floats) and, under
// SavePolicy::Output, 32 more for the affine terms. With fewer, ptxas (nvcc 13, sm_90) spilled.
template <class T, int VECS, int MAX_BLOCK, bool OUTPUT>
constexpr bool dresidual_ahead() {
    return 65536 / MAX_BLOCK - 2 * VECS * Pack<T>::E - (OUTPUT ? 32 : 0) >= 64;
}
// The backward's head: the reduction's floats, then cluster_sum2's two slots, padded to 128 bytes
// so that the rows behind it stay 128-byte aligned.
constexpr int kBackwardHeadFloat4s = kReduceFloat4s + 8;

// Where the dweight or dbias sum of element e of vector c lives in shared memory at the end of the
// backward: the vectors' first four columns, then their next four (bf16), as float4s, so that the
// threads of a warp write neighbouring 16-byte words.
__device__ inline float4& sum_slot(float* sums, int vecs_per_row, int c, int quad) {
    return reinterpret_cast<float4*>(sums)[quad * vecs_per_row + c];
}
template <int E>
__device__ inline float sum_at(const float* sums, int vecs_per_row, int j) {
    int c = j / E, e = j % E;
    return sums[((e / 4) * vecs_per_row + c) * 4 + e % 4];
}
__device__ inline void add4(float4& s, const float* v) { s.x += v[0], s.y += v[1], s.z += v[2], s.w += v[3]; }

// a / b to 2 ulp for |b| in [2^-126, 2^126] (under SavePolicy::Output, |weight| >= 1e-3:
// ops/norm/norm_policy.h). FLUSH: div.approx.ftz.f32, a reciprocal and a multiply, which reads a
// subnormal a (|y - bias| < 2^-126) as 0; else __fdividef, which under the default -ftz=false
// also rescales subnormal operands: 6 instructions an element in the SASS instead of 2.
template <bool FLUSH>
__device__ inline float divide_approx(float a, float b) {
    if constexpr (!FLUSH) return __fdividef(a, b);
    float q;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(q) : "f"(a), "f"(b));
    return q;
}

// dx per row, and this block's partial row [blockIdx.x] of dweight and dbias.
// - The rows come in through a ring of `stages` slots (2, or 1 where 2 do not fit in shared
//   memory) per group, each [dy, saved] of N elements: a thread copies its own vectors of the
//   next row with cp.async while it works on the current one, and reads back only what it copied
//   itself, so the ring needs no barrier. The bytes in flight are the ring's, not the registers'.
//   Both passes over a row read it from the ring, so no row is held in registers; a vector is read
//   into a register first, so that it takes one 16-byte shared load, not four narrow ones.
// - SHARED_AFFINE: the weight (and the bias under OUTPUT) sits in shared memory ahead of the ring,
//   copied there once per block (1 and 0 where absent); else each pass loads it from global memory.
// - A thread owns the same columns in every row its group visits, and sums dy * x_hat and dy of
//   them over those rows, in row order, in registers (VECS vectors of columns: backward_budget).
//   At the end the block's groups add their sums in group order into the ring's memory, and the
//   block writes its partial row.
// - CLUSTER = 2: a thread-block cluster of two blocks shares each of its rows, block r taking
//   columns [r * N / 2, (r + 1) * N / 2) as if they were a row of its own, except that the row's
//   two sums add the other block's through distributed shared memory (cluster_sum2) and each
//   block writes its half of the cluster's partial row. For f32 rows too long for one block of
//   512 threads (backward_budget).
// - __launch_bounds__(MAX_BLOCK, 1): without the 1, ptxas held the cluster kernel to 64
//   registers and spilled.
// - SavePolicy::Normalized runs the Input kernels with `normalized` set: the saved row is x_hat,
//   so the per-row scale applied to it is 1 instead of rstd (and the mean is absent, 0).
// - OUTPUT: SavePolicy::Output, where x_hat = (y - bias) / weight. The first pass and the dweight
//   sums work with y - bias (no division: g * x_hat = dy * (y - bias)), and the partial dweight is
//   divided by the weight once per column. Where a thread has at most 16 columns (8 at 64
//   registers: affine_in_registers), it holds their bias and 1 / weight in registers and the
//   second pass multiplies; elsewhere the bias
//   comes from shared memory and the second pass divides with divide_approx<FLUSH> (2 ulp;
//   FLUSH: see norm_backward_fast).
constexpr int kMaxStages = 2;  // a third slot leaves room for fewer groups
// Whether a thread of the backward under SavePolicy::Output holds 1 / weight and the bias of its
// VECS vectors of columns in registers: at most 16 columns, 8 in kernels of 1024 threads (64
// registers); more would spill.
template <class T, int VECS, int MAX_BLOCK>
constexpr bool affine_in_registers() {
    return VECS * Pack<T>::E <= (MAX_BLOCK > 512 ? 8 : 16);
}
// Arrays of a block's columns that the backward keeps in shared memory ahead of its ring (with
// SHARED_AFFINE): the weight, and under SavePolicy::Output the bias unless it is in registers.
template <class T, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, bool OUTPUT>
constexpr int affine_arrays() {
    return SHARED_AFFINE ? (OUTPUT && !affine_in_registers<T, VECS, MAX_BLOCK>() ? 2 : 1) : 0;
}

// The block's rank in its thread-block cluster of CLUSTER blocks (0 without one).
template <int CLUSTER>
__device__ inline int cluster_rank() {
    if constexpr (CLUSTER == 1) return 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
    __trap();  // the host launches clusters only where the device supports them (sm_90 and later)
    return 0;
#endif
}
__device__ inline void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::this_cluster().sync();
#else
    __trap();
#endif
}
// Adds to a and b, each the same in every thread of the block, those of the other block of a
// cluster of two, through its shared memory (`exchange`: two float2 slots, alternated row by
// row, so that a block writing the next row's sums never overwrites sums its peer has yet to
// read: it would first have to pass the next row's cluster barrier, which the peer reaches
// only after reading). Both blocks get the same bits (a + b == b + a). Every thread of both
// blocks calls it, once per row.
__device__ inline void cluster_sum2(float& a, float& b, float2* exchange, int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    if (threadIdx.x == 0) *cluster.map_shared_rank(exchange + parity, cluster.block_rank() ^ 1) = make_float2(a, b);
    cluster.sync();
    const float2 peer = exchange[parity];
    a += peer.x, b += peer.y;
#else
    (void)a, (void)b, (void)exchange, (void)parity;
    __trap();
#endif
}

template <class T, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, int CLUSTER, bool OUTPUT, bool FLUSH, bool DRESIDUAL>
__global__ void __launch_bounds__(MAX_BLOCK, 1) norm_backward_fast_kernel(
    T* __restrict__ dx, float* __restrict__ partial_w, float* __restrict__ partial_b, const T* __restrict__ dy,
    const T* __restrict__ dresidual, const T* __restrict__ saved, const float* __restrict__ mean,
    const float* __restrict__ rstd, const T* __restrict__ weight, const T* __restrict__ bias, bool centered,
    bool normalized, int64_t M, int N, int threads_per_row, int stages) {
    static_assert(CLUSTER == 1 || CLUSTER == 2);
    constexpr int E = Pack<T>::E, Q = E / 4;
    constexpr bool kInRegisters = OUTPUT && affine_in_registers<T, VECS, MAX_BLOCK>();
    constexpr bool kAhead = DRESIDUAL && dresidual_ahead<T, VECS, MAX_BLOCK, OUTPUT>();
    extern __shared__ float4 shared4[];
    // Block `rank` of a cluster takes columns [rank * cols, (rank + 1) * cols) of the cluster's rows.
    const int cols = N / CLUSTER, rank = cluster_rank<CLUSTER>();
    const int64_t cluster = blockIdx.x / CLUSTER, clusters = gridDim.x / CLUSTER;
    dy += rank * cols, saved += rank * cols;
    if (dx) dx += rank * cols;
    if constexpr (DRESIDUAL) dresidual += rank * cols;
    if (weight) weight += rank * cols;
    if (bias) bias += rank * cols;
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int group = threadIdx.x / threads_per_row, vecs_per_row = cols / E;
    float* reduce = reinterpret_cast<float*>(shared4);
    float2* exchange = reinterpret_cast<float2*>(shared4 + kReduceFloat4s);  // cluster_sum2's slots
    constexpr int kAffine = affine_arrays<T, VECS, MAX_BLOCK, SHARED_AFFINE, OUTPUT>();
    T* affine = reinterpret_cast<T*>(shared4 + kBackwardHeadFloat4s);  // weight, then bias (OUTPUT)
    T* ring = affine + kAffine * cols + size_t(group) * stages * 2 * cols;
    if constexpr (kAffine > 0) copy_affine_to_shared(affine, cols, weight, bias, kAffine > 1);
    float sum_w[VECS][E] = {}, sum_b[VECS][E] = {};
    float inv_w[kInRegisters ? VECS : 1][E], bias_r[kInRegisters ? VECS : 1][E];
    if constexpr (kInRegisters) {
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            c = c < vecs_per_row ? c : 0;
            float w[E];
            load_affine(weight, c, 1.0f, w);
            for (int e = 0; e < E; ++e) inv_w[k][e] = 1.0f / w[e];
            load_affine(bias, c, 0.0f, bias_r[k]);
        }
    }
    // Queues this group's row `row` (none past M) into slot `slot`, as one commit group.
    auto fetch = [&](int64_t row, int slot) {
        if (row < M) {
            T* to = ring + size_t(slot) * 2 * cols;
#pragma unroll
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (c >= vecs_per_row) break;
                copy_async16(to + c * E, dy + row * N + c * E);
                copy_async16(to + cols + c * E, saved + row * N + c * E);
            }
        }
        copy_async_commit();
    };
    const int64_t stride = clusters * groups;
    for (int ahead = 0; ahead < stages - 1; ++ahead) fetch(cluster * groups + group + ahead * stride, ahead);
    if constexpr (kAffine > 0) __syncthreads();
    if constexpr (CLUSTER > 1) cluster_sync();  // the peer block has started before its shared memory is written
    int slot = 0, parity = 0;
    for (int64_t base = cluster * groups; base < M; base += stride) {
        const int64_t row = base + group;
        const bool active = row < M;
        const float m = active && mean ? mean[row] : 0.0f, r = active ? rstd[row] : 0.0f;  // their latency overlaps the wait
        const float x_scale = normalized ? 1.0f : r;  // Normalized saved x_hat itself (and no mean: m = 0)
        fetch(row + (stages - 1) * stride, (slot + stages - 1) % stages);
        copy_async_wait(stages - 1);
        // dresidual's vectors of the row, loaded now where registers allow (dresidual_ahead), so that
        // their latency overlaps the first pass and the reduction; raw, 4 registers a vector.
        uint4 dr_raw[kAhead ? VECS : 1];
        if constexpr (kAhead) {
#pragma unroll
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (active && dx && c < vecs_per_row)
                    dr_raw[k] = *reinterpret_cast<const uint4*>(dresidual + row * N + c * E);
            }
        }
        const T* row_dy = ring + size_t(slot) * 2 * cols;
        const T* row_saved = row_dy + cols;
        slot = slot + 1 == stages ? 0 : slot + 1;
        // From the row's vectors: d = dy, g = dy * weight, and s = x_hat (Input, Normalized) or y - bias =
        // x_hat * weight (Output: x_hat_from_saved of ops/norm/norm_policy.h without its division).
        auto terms = [&](int k, int c, float (&d)[E], float (&g)[E], float (&s)[E], float (&w)[E]) {
            const uint4 qd = *reinterpret_cast<const uint4*>(row_dy + c * E);
            const uint4 qs = *reinterpret_cast<const uint4*>(row_saved + c * E);
            unpack(qd, d);
            unpack(qs, s);
            if constexpr (kAffine > 0) unpack(reinterpret_cast<const uint4*>(affine)[c], w);
            else load_affine(weight, c, 1.0f, w);
            if constexpr (kInRegisters) {
                for (int e = 0; e < E; ++e) s[e] -= bias_r[k][e];
            } else if constexpr (OUTPUT) {
                float b[E];
                if constexpr (kAffine > 1) unpack(reinterpret_cast<const uint4*>(affine + cols)[c], b);
                else load_affine(bias, c, 0.0f, b);
                for (int e = 0; e < E; ++e) s[e] -= b[e];
            } else {
                for (int e = 0; e < E; ++e) s[e] = (s[e] - m) * x_scale;
            }
            for (int e = 0; e < E; ++e) g[e] = d[e] * w[e];
        };
        float sum_g = 0, sum_gx = 0;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (!active || c >= vecs_per_row) continue;
            float d[E], g[E], s[E], w[E];
            terms(k, c, d, g, s, w);
            for (int e = 0; e < E; ++e) {
                float ds = d[e] * s[e];
                sum_g += g[e];
                sum_gx += OUTPUT ? ds : g[e] * s[e];
                sum_w[k][e] += ds;
                sum_b[k][e] += d[e];
            }
        }
        group_sum2<false>(sum_g, sum_gx, reduce, threads_per_row);
        if constexpr (CLUSTER > 1) cluster_sum2(sum_g, sum_gx, exchange, parity), parity ^= 1;
        if (!active || !dx) continue;
        const float mean_g = centered ? sum_g / N : 0.0f, mean_gx = sum_gx / N;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (c >= vecs_per_row) continue;
            float d[E], g[E], xh[E], w[E], out[E];
            terms(k, c, d, g, xh, w);  // again, from shared memory: cheaper than holding them in registers
            if constexpr (OUTPUT) {
                for (int e = 0; e < E; ++e)
                    xh[e] = kInRegisters ? xh[e] * inv_w[k][e] : divide_approx<FLUSH>(xh[e], w[e]);
            }
            for (int e = 0; e < E; ++e) out[e] = r * (g[e] - mean_g - xh[e] * mean_gx);
            if constexpr (DRESIDUAL) {
                float dr[E];
                if constexpr (kAhead) unpack(dr_raw[k], dr);
                else load_pack(dresidual + row * N + c * E, dr);
                // __fadd_rn: an add that is never contracted with the product above into an fma,
                // which in f32 (where rounded<T> is no rounding) would round once, not twice.
                for (int e = 0; e < E; ++e) out[e] = __fadd_rn(rounded<T>(out[e]), dr[e]);
            }
            store_pack(dx + row * N + c * E, out);
        }
    }
    // The groups' sums, in group order, into [2][cols] floats where the ring was.
    copy_async_wait(0);
    __syncthreads();
    float* sums_w = reinterpret_cast<float*>(shared4 + kBackwardHeadFloat4s);
    float* sums_b = sums_w + cols;
    for (int g = 0; g < groups; ++g) {
        if (group == g)
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (c >= vecs_per_row) continue;
                for (int q = 0; q < Q; ++q) {
                    float4& w = sum_slot(sums_w, vecs_per_row, c, q);
                    float4& b = sum_slot(sums_b, vecs_per_row, c, q);
                    if (g == 0) w = b = float4{0, 0, 0, 0};
                    add4(w, sum_w[k] + 4 * q);
                    add4(b, sum_b[k] + 4 * q);
                }
            }
        __syncthreads();
    }
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        float sw = sum_at<E>(sums_w, vecs_per_row, j), sb = sum_at<E>(sums_b, vecs_per_row, j);
        if (OUTPUT && weight) sw /= float(weight[j]);
        if (partial_w) partial_w[cluster * N + rank * cols + j] = sw;
        if (partial_b) partial_b[cluster * N + rank * cols + j] = sb;
    }
}

// Shared memory of the backward: the row reduction's floats and cluster_sum2's slots, then
// `affine` arrays of a block's cols = N / cluster columns (weight, bias) and the ring of `stages`
// slots of [dy, saved] per group, or the block's dweight/dbias sums ([2][cols] floats) where larger.
template <class T>
size_t backward_shared_bytes(const FastLayout& l, int64_t N, int affine, int stages) {
    const size_t cols = N / l.cluster;
    size_t rows = (affine + size_t(l.block / l.threads_per_row) * stages * 2) * cols * sizeof(T);
    return sizeof(float4) * kBackwardHeadFloat4s + std::max(rows, 2 * cols * sizeof(float));
}

// Launches the backward of one shape; false where its shared memory does not fit on the GPU. The
// ring takes two slots a row where they fit, else one (the f32 1024-thread shape at N = 16384:
// 2 x 64 KiB a slot).
template <class T, bool OUTPUT, int VECS, int MAX_BLOCK, bool SHARED_AFFINE, int CLUSTER>
bool norm_backward_fast(const FastLayout& l, const DeviceLimits& limits, T* dx, T* dweight, T* dbias, const T* dy,
                        const T* dresidual, const T* saved, const float* mean, const float* rstd, const T* weight,
                        const T* bias, bool centered, bool normalized, int64_t M, int64_t N, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    // Under SavePolicy::Output, where 1 / weight is not in registers, the second pass divides by
    // the weight with subnormals flushed (divide_approx<true>: fewer instructions an element), except
    // in bf16 rows of up to two warps (1024 < N <= 2048 here), which keep __fdividef
    // (divide_approx<false>); which division suits which row width is in docs/PERFORMANCE.md.
    auto pick = [&](auto dresidual_tag) {
        constexpr bool R = decltype(dresidual_tag)::value;
        auto k = norm_backward_fast_kernel<T, VECS, MAX_BLOCK, SHARED_AFFINE, CLUSTER, OUTPUT, OUTPUT, R>;
        if constexpr (OUTPUT && std::is_same_v<T, bf16> && !affine_in_registers<T, VECS, MAX_BLOCK>())
            if (l.threads_per_row <= 64)
                k = norm_backward_fast_kernel<T, VECS, MAX_BLOCK, SHARED_AFFINE, CLUSTER, true, false, R>;
        return k;
    };
    auto kernel = dresidual && dx ? pick(std::true_type()) : pick(std::false_type());
    const int affine = affine_arrays<T, VECS, MAX_BLOCK, SHARED_AFFINE, OUTPUT>();
    int stages = kMaxStages;
    while (stages > 0 && backward_shared_bytes<T>(l, N, affine, stages) > size_t(limits.shared_optin)) --stages;
    if (stages == 0) return false;
    size_t shared = backward_shared_bytes<T>(l, N, affine, stages);
    // A block per group of rows, or a cluster of CLUSTER blocks sharing them; each writes its
    // columns of one partial row of dweight and dbias. As many as the kernel without dresidual
    // keeps resident, with dresidual too, so that both sum dweight and dbias in the same order (so
    // both kernels are let have their shared memory before the occupancy query).
    const auto plain = pick(std::false_type());
    if (shared > 48 * 1024)
        for (auto k : {kernel, plain})
            CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    const int64_t partial_rows =
        grid_size(M, l.block / l.threads_per_row, resident_blocks(plain, l.block, shared, device, CLUSTER) / CLUSTER);
    TensorOptions opts = TensorOptions().dtype(DType::F32).device(Device::cuda(device));
    Tensor pw = dweight ? empty({partial_rows, N}, opts) : Tensor(), pb = dbias ? empty({partial_rows, N}, opts) : Tensor();
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config = launch_config(dim3(static_cast<unsigned>(partial_rows * CLUSTER)), l.block, shared,
                                              CLUSTER, stream, attribute);
    CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, dx, device_ptr<float>(pw), device_ptr<float>(pb), dy, dresidual,
                                  saved, mean, rstd, weight, bias, centered, normalized, M, static_cast<int>(N),
                                  l.threads_per_row, stages));
    CUDA_LAUNCH_CHECK();
    if (dweight) column_sum_cuda<float, T>(dweight, device_ptr<float>(pw), partial_rows, N, device);
    if (dbias) column_sum_cuda<float, T>(dbias, device_ptr<float>(pb), partial_rows, N, device);
    return true;
}

}  // namespace

template <class T>
void norm_backward_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* dresidual, const T* saved,
                        const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, const T* bias, bool centered,
                        SavePolicy policy, int64_t M, int64_t N, int device) {
    if constexpr (!std::is_same_v<T, double>) {
        const auto probe = norm_backward_fast_kernel<float, 4, 512, true, 1, false, false, false>;
        const DeviceLimits limits = device_limits(device, reinterpret_cast<const void*>(probe));
        auto run_policy = [&](auto output) {
            constexpr bool OUTPUT = decltype(output)::value;
            FastLayout l = fast_layout<T>(backward_budget<T, OUTPUT>(), N,
                                          {dx, dweight, dbias, dy, dresidual, saved, weight, bias}, limits.clusters);
            auto run = [&](auto shape) {
                if constexpr (shape() < backward_budget<T, OUTPUT>().count) {
                    constexpr Shape s = backward_budget<T, OUTPUT>().shapes[shape()];
                    return norm_backward_fast<T, OUTPUT, s.vecs, s.max_block, s.shared_affine, s.cluster>(
                        l, limits, dx, dweight, dbias, dy, dresidual, saved, mean, rstd, weight, bias, centered,
                        policy == SavePolicy::Normalized, M, N, device);
                }
                return false;
            };
            return with_shape(l.shape, run);
        };
        if (policy == SavePolicy::Output ? run_policy(std::true_type()) : run_policy(std::false_type())) return;
    }
    if (dx && dresidual) {  // the plain backward (fast where only dresidual's alignment kept it out), then the add
        norm_backward_cuda<T>(dx, dweight, dbias, dy, nullptr, saved, mean, rstd, weight, bias, centered, policy, M,
                              N, device);
        add_forward_cuda<T>(dx, dx, dresidual, M * N, M * N, device);
        return;
    }
    norm_backward_reference_cuda<T>(dx, dweight, dbias, dy, saved, mean, rstd, weight, bias, centered, policy, M, N,
                                    device);
}

template void norm_backward_cuda<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const float*, bool, SavePolicy,
                                        int64_t, int64_t, int);
template void norm_backward_cuda<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, const double*, const double*, bool, SavePolicy,
                                         int64_t, int64_t, int);
template void norm_backward_cuda<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, const bf16*, const bf16*, bool, SavePolicy, int64_t, int64_t, int);

}  // namespace normtape::detail
