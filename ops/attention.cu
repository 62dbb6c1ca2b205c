// ops/attention.cu: causal self-attention on the GPU, the launchers. bf16 with head size 64 or
// 128 runs the tensor-core kernels of ops/attention_flash.cu; every other case runs the kernels
// here: the same algorithm (online softmax, the row log-sum-exp saved, the probabilities
// recomputed in backward, nothing of size T x T stored) with one warp per row and scalar
// arithmetic in acc_t<T>, f64 for f64. The inference op causal_self_attention_rows runs the
// one-warp-per-row forward kernel from a first row on, for every dtype.
#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/attention_flash.cuh"
#include "ops/cuda_common.cuh"
#include "ops/cuda_launchers.h"

namespace normtape::detail {

namespace {

template <class A>
__device__ A warp_sum(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
template <class A>
__device__ A warp_max(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Where one warp's row lives: rows are (b, h, t) in that order, as lse is laid out.
struct Row {
    int64_t b, h, t, id;
    __device__ Row(int64_t row_id, int64_t Tn, int64_t NH)
        : b(row_id / Tn / NH), h(row_id / Tn % NH), t(row_id % Tn), id(row_id) {}
};

// The per-warp scratch in shared memory: `vectors` rows of hs values, then 64 (two per lane).
constexpr int kLaneScratch = 64;
template <class A>
__device__ A* warp_scratch(int vectors, int hs) {
    extern __shared__ __align__(16) unsigned char shared_raw[];
    return reinterpret_cast<A*>(shared_raw) + (threadIdx.x / 32) * (vectors * hs + kLaneScratch);
}

// The number of rows of a chunk of 32 that start at `first` and end before `end`.
__device__ inline int chunk(int64_t first, int64_t end) { return end - first < 32 ? static_cast<int>(end - first) : 32; }

__device__ inline int64_t warp_row() { return static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; }

// One warp per query row t = first_row + (its row among the Tq = T - first_row computed): keys in
// chunks of 32, one per lane; out [B, Tq, C] = O / l, lse [B, NH, Tq] = m + log(l) unless null.
// With dropout (first_row 0 only) l sums every probability and O only the kept ones.
template <class T>
__global__ void attention_forward_kernel(T* __restrict__ out, acc_t<T>* __restrict__ lse, const T* __restrict__ qkv,
                                         int64_t Tn, int64_t C, int64_t NH, int hs, acc_t<T> scale, int64_t first_row,
                                         DropoutMask drop, acc_t<T> keep_scale, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const int64_t Tq = Tn - first_row;
    const Row r(id, Tq, NH);
    const int64_t t = first_row + r.t;
    const int lane = threadIdx.x % 32;
    A* q = warp_scratch<A>(2, hs);
    A *o = q + hs, *p = o + hs;
    const T* base = qkv + r.b * Tn * 3 * C + r.h * hs;  // q of position s: base + s * 3C; k: + C; v: + 2C
    for (int d = lane; d < hs; d += 32) q[d] = A(base[t * 3 * C + d]), o[d] = 0;
    __syncwarp();
    A m = -INFINITY, l = 0;
    for (int64_t s0 = 0; s0 <= t; s0 += 32) {
        const int64_t s = s0 + lane;
        A score = -INFINITY;
        if (s <= t) {
            const T* k = base + s * 3 * C + C;
            A dot = 0;
            for (int d = 0; d < hs; ++d) dot += q[d] * A(k[d]);
            score = dot * scale;
        }
        const A m_new = max(m, warp_max(score)), corr = exp(m - m_new);
        const A pv = s <= t ? exp(score - m_new) : A(0);
        l = l * corr + warp_sum(pv);
        m = m_new;
        p[lane] = pv * attention_drop_factor(drop, keep_scale, id / Tq, Tn, t, s);
        __syncwarp();
        const int n = chunk(s0, t + 1);
        for (int d = lane; d < hs; d += 32) {
            A acc = o[d] * corr;
            for (int i = 0; i < n; ++i) acc += p[i] * A(base[(s0 + i) * 3 * C + 2 * C + d]);
            o[d] = acc;
        }
        __syncwarp();
    }
    for (int d = lane; d < hs; d += 32) out[(r.b * Tq + r.t) * C + r.h * hs + d] = static_cast<T>(o[d] / l);
    if (lse && lane == 0) lse[id] = m + log(l);
}

// D[row] = dout_t . out_t over the row's head: the softmax backward's sum_s p dp.
template <class T>
__global__ void attention_rowdot_kernel(acc_t<T>* __restrict__ D, const T* __restrict__ dout, const T* __restrict__ out,
                                        int64_t Tn, int64_t C, int64_t NH, int hs, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, Tn, NH);
    const int64_t at = (r.b * Tn + r.t) * C + r.h * hs;
    A sum = 0;
    for (int d = threadIdx.x % 32; d < hs; d += 32) sum += A(dout[at + d]) * A(out[at + d]);
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) D[id] = sum;
}

// The probability p and dS = p (z dout_t . v_s - D_t) of query t and key s, z the dropout factor.
template <class T, class A>
__device__ void recompute(A& p, A& ds, const T* q, const T* k, const T* v, const T* go, int hs, A scale, A row_lse,
                          A row_D, A z) {
    A qk = 0, dp = 0;
    for (int d = 0; d < hs; ++d) qk += A(q[d]) * A(k[d]), dp += A(go[d]) * A(v[d]);
    p = min(A(1), exp(qk * scale - row_lse));  // <= 1 as in forward, whatever the rounding (ops/attention.cpp)
    ds = p * (z * dp - row_D);
}

// One warp per key row s: dk[s] = scale * sum_{t >= s} dS q_t, dv[s] = sum_{t >= s} p z dout_t.
template <class T>
__global__ void attention_dkdv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                                      const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ D, int64_t Tn,
                                      int64_t C, int64_t NH, int hs, acc_t<T> scale, DropoutMask drop,
                                      acc_t<T> keep_scale, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, Tn, NH);
    const int lane = threadIdx.x % 32;
    A* dk = warp_scratch<A>(2, hs);
    A *dv = dk + hs, *pd = dv + hs;  // pd: p of 32 queries, then their dS
    const T* base = qkv + r.b * Tn * 3 * C + r.h * hs;
    const T* go_base = dout + r.b * Tn * C + r.h * hs;
    const int64_t lse_base = id - r.t;  // the row id of t = 0
    for (int d = lane; d < hs; d += 32) dk[d] = 0, dv[d] = 0;
    for (int64_t t0 = r.t; t0 < Tn; t0 += 32) {
        const int64_t t = t0 + lane;
        A p = 0, ds = 0, z = 0;
        if (t < Tn) {
            z = attention_drop_factor(drop, keep_scale, id / Tn, Tn, t, r.t);
            recompute<T, A>(p, ds, base + t * 3 * C, base + r.t * 3 * C + C, base + r.t * 3 * C + 2 * C,
                            go_base + t * C, hs, scale, lse[lse_base + t], D[lse_base + t], z);
        }
        pd[lane] = p * z, pd[32 + lane] = ds;
        __syncwarp();
        const int n = chunk(t0, Tn);
        for (int d = lane; d < hs; d += 32) {
            A sum_v = 0, sum_k = 0;
            for (int i = 0; i < n; ++i) {
                sum_v += pd[i] * A(go_base[(t0 + i) * C + d]);
                sum_k += pd[32 + i] * A(base[(t0 + i) * 3 * C + d]);
            }
            dv[d] += sum_v, dk[d] += sum_k * scale;
        }
        __syncwarp();
    }
    T* dst = dqkv + (r.b * Tn + r.t) * 3 * C + r.h * hs;
    for (int d = lane; d < hs; d += 32) dst[C + d] = static_cast<T>(dk[d]), dst[2 * C + d] = static_cast<T>(dv[d]);
}

// One warp per query row t: dq[t] = scale * sum_{s <= t} dS k_s.
template <class T>
__global__ void attention_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout, const T* __restrict__ qkv,
                                    const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ D, int64_t Tn,
                                    int64_t C, int64_t NH, int hs, acc_t<T> scale, DropoutMask drop,
                                    acc_t<T> keep_scale, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, Tn, NH);
    const int lane = threadIdx.x % 32;
    A* dq = warp_scratch<A>(1, hs);
    A* dsv = dq + hs;
    const T* base = qkv + r.b * Tn * 3 * C + r.h * hs;
    const T* go = dout + (r.b * Tn + r.t) * C + r.h * hs;
    for (int d = lane; d < hs; d += 32) dq[d] = 0;
    for (int64_t s0 = 0; s0 <= r.t; s0 += 32) {
        const int64_t s = s0 + lane;
        A p = 0, ds = 0;
        if (s <= r.t)
            recompute<T, A>(p, ds, base + r.t * 3 * C, base + s * 3 * C + C, base + s * 3 * C + 2 * C, go, hs, scale,
                            lse[id], D[id], attention_drop_factor(drop, keep_scale, id / Tn, Tn, r.t, s));
        dsv[lane] = ds;
        __syncwarp();
        const int n = chunk(s0, r.t + 1);
        for (int d = lane; d < hs; d += 32) {
            A sum = 0;
            for (int i = 0; i < n; ++i) sum += dsv[i] * A(base[(s0 + i) * 3 * C + C + d]);
            dq[d] += sum * scale;
        }
        __syncwarp();
    }
    T* dst = dqkv + (r.b * Tn + r.t) * 3 * C + r.h * hs;
    for (int d = lane; d < hs; d += 32) dst[d] = static_cast<T>(dq[d]);
}

// Launches `kernel` with one warp per row and `vectors` rows of hs acc_t<T> (+ 64) of shared
// memory a warp: up to 8 warps a block, fewer where the scratch would pass 48 KiB, one warp a
// block past that with the device's opt-in limit (the op's checks keep hs within it).
template <class T, class Kernel, class... Args>
void launch_rows(Kernel kernel, int vectors, int hs, int64_t rows, int device, Args... args) {
    const size_t per_warp = (static_cast<size_t>(vectors) * hs + kLaneScratch) * sizeof(acc_t<T>);
    int warps = 8;
    while (warps > 1 && warps * per_warp > 48 * 1024) warps /= 2;
    const size_t shared = warps * per_warp;
    if (shared > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
    const int64_t blocks = (rows + warps - 1) / warps;
    kernel<<<static_cast<unsigned>(blocks), 32 * warps, shared, cuda::stream(device)>>>(args..., rows);
    CUDA_LAUNCH_CHECK();
}

}  // namespace

template <class T>
void attention_forward_cuda(T* out, acc_t<T>* lse, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH,
                            const DropoutMask& drop, int device) {
    using A = acc_t<T>;
    const int hs = static_cast<int>(C / NH);
    if constexpr (std::is_same_v<T, bf16>) {
        if (flash_attention_applies(hs, false, device, {out, qkv}))
            return flash_attention_forward(out, lse, qkv, B, Tn, C, NH, drop, device);
    }
    const A scale = A(1) / std::sqrt(A(hs));
    launch_rows<T>(attention_forward_kernel<T>, 2, hs, B * NH * Tn, device, out, lse, qkv, Tn, C, NH, hs, scale,
                   int64_t(0), drop, A(1) / (A(1) - A(drop.p)));
}

template <class T>
void attention_forward_rows_cuda(T* out, const T* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH, int64_t first_row,
                                 int device) {
    using A = acc_t<T>;
    const int hs = static_cast<int>(C / NH);
    const A scale = A(1) / std::sqrt(A(hs));
    launch_rows<T>(attention_forward_kernel<T>, 2, hs, B * NH * (Tn - first_row), device, out,
                   static_cast<A*>(nullptr), qkv, Tn, C, NH, hs, scale, first_row, DropoutMask(), A(1));
}

template <class T>
void attention_backward_cuda(T* dqkv, const T* dout, const T* qkv, const T* out, const acc_t<T>* lse, int64_t B,
                             int64_t Tn, int64_t C, int64_t NH, const DropoutMask& drop, int device) {
    using A = acc_t<T>;
    const int hs = static_cast<int>(C / NH);
    const int64_t rows = B * NH * Tn;
    Tensor D = empty({B, NH, Tn}, TensorOptions().dtype(dtype_of<A>()).device(Device::cuda(device)));
    launch_rows<T>(attention_rowdot_kernel<T>, 0, hs, rows, device, device_ptr<A>(D), dout, out, Tn, C, NH, hs);
    if constexpr (std::is_same_v<T, bf16>) {
        if (flash_attention_applies(hs, true, device, {dqkv, dout, qkv}))
            return flash_attention_backward(dqkv, dout, qkv, lse, device_ptr<A>(D), B, Tn, C, NH, drop, device);
    }
    const A scale = A(1) / std::sqrt(A(hs)), keep_scale = A(1) / (A(1) - A(drop.p));
    launch_rows<T>(attention_dkdv_kernel<T>, 2, hs, rows, device, dqkv, dout, qkv, lse, device_ptr<A>(D), Tn, C, NH, hs,
                   scale, drop, keep_scale);
    launch_rows<T>(attention_dq_kernel<T>, 1, hs, rows, device, dqkv, dout, qkv, lse, device_ptr<A>(D), Tn, C, NH, hs,
                   scale, drop, keep_scale);
}

#define NT_INSTANTIATE(T)                                                                                             \
    template void attention_forward_cuda<T>(T*, acc_t<T>*, const T*, int64_t, int64_t, int64_t, int64_t,             \
                                            const DropoutMask&, int);                                                \
    template void attention_forward_rows_cuda<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, int);     \
    template void attention_backward_cuda<T>(T*, const T*, const T*, const T*, const acc_t<T>*, int64_t, int64_t,     \
                                             int64_t, int64_t, const DropoutMask&, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
