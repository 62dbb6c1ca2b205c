// ops/norm/norm_forward.cu: the fast CUDA forward of layer_norm and rms_norm (f32 and bf16), and
// norm_forward_cuda, which runs it where it applies and the reference (ops/norm/norm_reference.cu)
// elsewhere: f64, N not a multiple of a 16-byte vector, misaligned data, rows longer than the
// budget holds (32768 columns). Tested against the reference and the cpu (tests/test_cuda.cpp),
// timed by examples/bench/bench_norms.cpp.
// - A row is read once with 16-byte loads by a group of threads_per_row threads (a multiple of 32,
//   at most 1024), each holding its vectors of the row in registers (forward_budget, fast_layout);
//   bf16 rows above 8192 columns hold the group's next row too.
// - Statistics in f32, one reduction per row of the sums of x - x[row, 0] and its square (the
//   shifted-data variance; see the kernel); a row of several warps synchronizes only its own warps
//   (named barriers, ops/norm/norm_rows.cuh).
// - Blocks take a few rows a group (f32 one, bf16 four) and retire, new blocks taking their place.
// - With a residual (the fused norm, ops/norm/fused_norm.h), a row is x + residual, rounded to T and
//   stored as the sum as it is loaded: the add op's arithmetic, so that the sum and y are add's and
//   the norm's bit for bit.
// Not here: the backward (ops/norm/norm_backward.cu), launch planning (ops/norm/norm_launch.cuh), the device
// helpers (ops/norm/norm_rows.cuh, ops/cuda_common.cuh).
#include <algorithm>
#include <type_traits>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/dry_run.h"
#include "core/tensor.h"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"
#include "ops/norm/norm_launch.cuh"
#include "ops/norm/norm_rows.cuh"

namespace normtape::detail {

namespace {

using namespace norm;

// The forward's shapes (Shape in ops/norm/norm_launch.cuh). It holds its row in registers as raw
// 16-byte vectors (4 registers each, whatever the dtype): 8 vectors of f32 or 4 of bf16, in blocks
// of up to 1024 threads.
// - Its blocks are not persistent: a group takes rows_per_group rows, gridDim.x * groups apart,
//   and its block retires, new blocks taking its place; that beat persistent blocks at the same
//   occupancy (docs/PERFORMANCE.md), and bf16 takes 4 rows a group so that a block's copy of the
//   weight and bias serves more rows.
// - bf16 rows of more than 256 threads (N > 8192) load the group's next row into registers before
//   this row's reduction, so that loads stay in flight across the barrier of a row of 16 warps.
// - bf16 rows of up to 256 threads read their weight and bias from shared memory, copied there
//   once per block; not f32, whose 2 x 4N bytes a block would cost resident blocks at large N, nor
//   beside the next row in registers.
template <class T>
constexpr Budget forward_budget() {
    if constexpr (std::is_same_v<T, float>) return {{{8, 1024, 1024, false, false, 1, 1}}, 1};
    else return {{{4, 1024, 256, false, true, 4, 1}, {4, 1024, 1024, true, false, 4, 1}}, 2};
}

// y, mean and rstd per row, each row's group of threads walking the rows gridDim.x * groups apart.
// X_HAT (SavePolicy::Normalized): it writes x_hat too, and y = fma(rounded x_hat, weight, bias), as
// norm_affine_cuda makes y again from the stored x_hat, bit for bit. RESIDUAL: the row is
// sum = x + residual (rounded to T), written to `sum`. Template arguments, not branches: the
// X_HAT branch's registers cost the plain bf16 forward at N = 16384 a fifth of its speed.
template <class T, int VECS, int MAX_BLOCK, bool NEXT_ROW, bool SHARED_AFFINE, bool X_HAT, bool RESIDUAL>
__global__ void __launch_bounds__(MAX_BLOCK) norm_forward_fast_kernel(
    T* __restrict__ y, T* __restrict__ x_hat, float* __restrict__ mean, float* __restrict__ rstd, const T* __restrict__ x,
    const T* __restrict__ residual, T* __restrict__ sum, const T* __restrict__ weight, const T* __restrict__ bias,
    int64_t M, int N, float eps, int threads_per_row) {
    constexpr int E = Pack<T>::E;
    extern __shared__ float4 shared4[];
    float* shared = reinterpret_cast<float*>(shared4);
    const int lane = threadIdx.x % threads_per_row, groups = blockDim.x / threads_per_row;
    const int group = threadIdx.x / threads_per_row, vecs_per_row = N / E;
    T* affine = reinterpret_cast<T*>(shared4 + kReduceFloat4s);  // SHARED_AFFINE: weight, then bias
    if constexpr (SHARED_AFFINE) copy_affine_to_shared(affine, N, weight, bias, true);
    // With a residual, its vectors in registers too, where that spills nothing (nvcc 13, sm_90): not
    // beside f32's 8 vectors or a next row.
    constexpr bool kResidualAhead = RESIDUAL && VECS <= 4 && !NEXT_ROW;
    uint4 raw[VECS];  // the row's vectors of this thread, as loaded
    uint4 next[NEXT_ROW ? VECS : 1];  // those of the group's next row
    float K_next = 0;
    // Loads row `row` (zeros past M) into `to`, and K = x[row, 0] (LayerNorm) into K; with RESIDUAL,
    // the row of x + residual, which it stores to `sum`.
    auto load_row = [&](int64_t row, uint4 (&to)[VECS], float& K) {
        const bool active = row < M;
        const T* xr = x + row * N;
        K = mean && active ? (RESIDUAL ? rounded<T>(float(xr[0]) + float(residual[row * N])) : float(xr[0])) : 0.0f;
        // The residual's vectors are loaded beside x's, so that all of the row's loads are in flight
        // together, where registers allow (kResidualAhead); else each as its sum is made.
        uint4 res[kResidualAhead ? VECS : 1];
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            const bool in_row = active && c < vecs_per_row;
            to[k] = in_row ? *reinterpret_cast<const uint4*>(xr + c * E) : make_uint4(0, 0, 0, 0);
            if constexpr (kResidualAhead)
                if (in_row) res[k] = *reinterpret_cast<const uint4*>(residual + row * N + c * E);
        }
        if constexpr (RESIDUAL) {
#pragma unroll
            for (int k = 0; k < VECS; ++k) {
                int c = k * threads_per_row + lane;
                if (!active || c >= vecs_per_row) continue;
                float a[E], b[E];
                unpack(to[k], a);
                if constexpr (kResidualAhead) unpack(res[k], b);
                else unpack(*reinterpret_cast<const uint4*>(residual + row * N + c * E), b);
                for (int e = 0; e < E; ++e) a[e] += b[e];
                to[k] = pack(a);
                *reinterpret_cast<uint4*>(sum + row * N + c * E) = to[k];
            }
        }
    };
    const int64_t stride = int64_t(gridDim.x) * groups;
    if constexpr (NEXT_ROW) load_row(int64_t(blockIdx.x) * groups + group, next, K_next);
    for (int64_t base = int64_t(blockIdx.x) * groups; base < M; base += stride) {
        const int64_t row = base + group;
        const bool active = row < M;
        // One reduction per row: sums of d = x - K and d^2 with K = x[row, 0] (LayerNorm; K = 0
        // for RMSNorm), var = mean(d^2) - mean(d)^2. The shift keeps the subtraction from
        // cancelling: mean(d) is a few standard deviations at most, unless x[row, 0] is an outlier.
        float K;
        if constexpr (NEXT_ROW) {
            K = K_next;
#pragma unroll
            for (int k = 0; k < VECS; ++k) raw[k] = next[k];
            if (row + stride < M) load_row(row + stride, next, K_next);
        } else {
            load_row(row, raw, K);
        }
        if (SHARED_AFFINE && base == int64_t(blockIdx.x) * groups) __syncthreads();  // the weight and bias, once
        float s = 0, sq = 0;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            if (k * threads_per_row + lane >= vecs_per_row) continue;
            float v[E];
            unpack(raw[k], v);
            for (int e = 0; e < E; ++e) {
                float d = v[e] - K;
                s += d;
                sq += d * d;
            }
        }
        // Immediate barrier numbers where registers let more than 4 blocks in: bf16 without a next row.
        group_sum2<!NEXT_ROW && !std::is_same_v<T, float>>(s, sq, shared, threads_per_row);
        const float shift_mean = mean ? s / N : 0.0f;
        const float m = K + shift_mean;
        const float r = rsqrtf(fmaxf(sq / N - shift_mean * shift_mean, 0.0f) + eps);
        if (!active) continue;
        if (lane == 0) {
            if (mean) mean[row] = m;
            rstd[row] = r;
        }
        T* yr = y + row * N;
#pragma unroll
        for (int k = 0; k < VECS; ++k) {
            int c = k * threads_per_row + lane;
            if (c >= vecs_per_row) continue;
            float v[E], w[E], b[E], out[E];
            unpack(raw[k], v);
            if constexpr (SHARED_AFFINE) {
                unpack(reinterpret_cast<const uint4*>(affine)[c], w);
                unpack(reinterpret_cast<const uint4*>(affine + N)[c], b);
            } else {
                load_affine(weight, c, 1.0f, w);
                load_affine(bias, c, 0.0f, b);
            }
            if constexpr (X_HAT) {
                float h[E];
                for (int e = 0; e < E; ++e) h[e] = (v[e] - m) * r;
                store_pack(x_hat + row * N + c * E, h);
                for (int e = 0; e < E; ++e) out[e] = fmaf(rounded<T>(h[e]), w[e], b[e]);
            } else {
                for (int e = 0; e < E; ++e) out[e] = (v[e] - m) * r * w[e] + b[e];
            }
            store_pack(yr + c * E, out);
        }
    }
}

// Launches the forward of one shape. Its blocks take ROWS_PER_GROUP rows a group and retire, new
// blocks taking their place (see forward_budget), except where that would leave the GPU emptier
// than one row a group in as many blocks as fit at once (small M).
template <class T, int VECS, int MAX_BLOCK, bool NEXT_ROW, bool SHARED_AFFINE, int ROWS_PER_GROUP>
void norm_forward_fast(const FastLayout& l, T* y, T* x_hat, float* mean, float* rstd, const T* x, const T* residual,
                       T* sum, const T* weight, const T* bias, int64_t M, int64_t N, double eps, int device) {
    cudaStream_t stream = cuda::stream(device);  // makes `device` current for the queries below
    auto pick = [&](auto residual_tag) {
        constexpr bool R = decltype(residual_tag)::value;
        return x_hat ? norm_forward_fast_kernel<T, VECS, MAX_BLOCK, NEXT_ROW, SHARED_AFFINE, true, R>
                     : norm_forward_fast_kernel<T, VECS, MAX_BLOCK, NEXT_ROW, SHARED_AFFINE, false, R>;
    };
    auto kernel = residual ? pick(std::true_type()) : pick(std::false_type());
    size_t shared = sizeof(float4) * kReduceFloat4s + (SHARED_AFFINE ? 2 * N * sizeof(T) : 0);
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    const int64_t groups = l.block / l.threads_per_row, rows_per_block = groups * ROWS_PER_GROUP;
    const int64_t resident = resident_blocks(kernel, l.block, shared, device);
    unsigned grid = grid_size(M, groups, std::max(resident, (M + rows_per_block - 1) / rows_per_block));
    kernel<<<grid, l.block, shared, stream>>>(y, x_hat, mean, rstd, x, residual, sum, weight, bias, M,
                                              static_cast<int>(N), static_cast<float>(eps), l.threads_per_row);
    CUDA_LAUNCH_CHECK();
}

}  // namespace

// The fast kernels where they apply (f32 and bf16, see the file comment), else add_forward_cuda for
// the sum and the norm of it (fast where only x's or the residual's alignment kept it out), or the
// reference, which with x_hat writes x_hat and then y by norm_affine_cuda.
template <class T>
void norm_forward_cuda(T* y, T* x_hat, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* residual, T* sum,
                       const T* weight, const T* bias, int64_t M, int64_t N, double eps, int device) {
    if constexpr (!std::is_same_v<T, double>) {
        FastLayout l = fast_layout<T>(forward_budget<T>(), N, {y, x_hat, x, residual, sum, weight, bias});
        auto run = [&](auto shape) {
            if constexpr (shape() < forward_budget<T>().count) {
                constexpr Shape s = forward_budget<T>().shapes[shape()];
                norm_forward_fast<T, s.vecs, s.max_block, s.next_row, s.shared_affine, s.rows_per_group>(
                    l, y, x_hat, mean, rstd, x, residual, sum, weight, bias, M, N, eps, device);
                return true;
            }
            return false;
        };
        if (with_shape(l.shape, run)) return;
    }
    if (residual) {
        add_forward_cuda<T>(sum, x, residual, M * N, M * N, device);
        norm_forward_cuda<T>(y, x_hat, mean, rstd, sum, nullptr, nullptr, weight, bias, M, N, eps, device);
        return;
    }
    if (x_hat) {
        norm_forward_reference_cuda<T>(x_hat, mean, rstd, x, nullptr, nullptr, M, N, eps, device);
        norm_affine_cuda<T>(y, x_hat, weight, bias, M, N, device);
    } else {
        norm_forward_reference_cuda<T>(y, mean, rstd, x, weight, bias, M, N, eps, device);
    }
}

namespace {
// y = x_hat * weight + bias rounded once (one fma), as the fused forward above computes it; an
// absent weight is 1 and an absent bias 0, which an fma passes through exactly.
template <class A>
struct AffineOp {  // x = {x_hat, weight, bias}
    __device__ A operator()(const A (&x)[3]) const { return fma(x[0], x[1], x[2]); }
};
template <class A>
struct ScaleRowOp {  // x = {x_hat, weight}
    __device__ A operator()(const A (&x)[2]) const { return fma(x[0], x[1], A(0)); }
};
template <class A>
struct ShiftRowOp {  // x = {x_hat, bias}
    __device__ A operator()(const A (&x)[2]) const { return fma(x[0], A(1), x[1]); }
};
}  // namespace

template <class T>
void norm_affine_cuda(T* y, const T* x_hat, const T* weight, const T* bias, int64_t M, int64_t N, int device) {
    using A = acc_t<T>;
    if (weight && bias) map_cuda<T, 3>(y, {{x_hat, weight, bias}, {0, N, N}}, M * N, AffineOp<A>{}, device);
    else if (weight) map_cuda<T, 2>(y, {{x_hat, weight}, {0, N}}, M * N, ScaleRowOp<A>{}, device);
    else if (bias) map_cuda<T, 2>(y, {{x_hat, bias}, {0, N}}, M * N, ShiftRowOp<A>{}, device);
    else if (!is_dry_run())  // a copy's addresses are checked when a dry run captures it (core/dry_run.h)
        CUDA_CHECK(cudaMemcpyAsync(y, x_hat, size_t(M * N) * sizeof(T), cudaMemcpyDeviceToDevice, cuda::stream(device)));
}

template void norm_affine_cuda<float>(float*, const float*, const float*, const float*, int64_t, int64_t, int);
template void norm_affine_cuda<double>(double*, const double*, const double*, const double*, int64_t, int64_t, int);
template void norm_affine_cuda<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int);

template void norm_forward_cuda<float>(float*, float*, float*, float*, const float*, const float*, float*,
                                       const float*, const float*, int64_t, int64_t, double, int);
template void norm_forward_cuda<double>(double*, double*, double*, double*, const double*, const double*, double*,
                                        const double*, const double*, int64_t, int64_t, double, int);
template void norm_forward_cuda<bf16>(bf16*, bf16*, float*, float*, const bf16*, const bf16*, bf16*, const bf16*,
                                      const bf16*, int64_t, int64_t, double, int);

}  // namespace normtape::detail
