// ops/attention.cu: causal self-attention on the GPU, the launchers. bf16 with head size 64 or
// 128 runs the tensor-core kernels of ops/attention_flash.cu; every other case runs the kernels
// here: the same algorithm (online softmax, the row log-sum-exp saved, the probabilities
// recomputed in backward, nothing of size T x T stored) with one warp per row and scalar
// arithmetic in acc_t<T>, f64 for f64. The inference ops (causal_self_attention_rows,
// causal_attention_rows) run the one-warp-per-row forward kernel from a first row on, for every
// dtype. Where q, k and v are is ops/attention_layout.h: packed or separate, grouped or not.
#include <algorithm>
#include <cmath>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/attention_cudnn.h"
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

// One warp per query row t = first_row + (its row among the Tq computed): keys in chunks of 32, one
// per lane; out = O / l, lse = m + log(l) unless null (ops/attention_layout.h). With dropout
// (first_row 0 only) l sums every probability and O only the kept ones.
template <class T>
__global__ void attention_forward_kernel(T* __restrict__ out, acc_t<T>* __restrict__ lse, const T* __restrict__ q,
                                         const T* __restrict__ k, const T* __restrict__ v, AttentionLayout L,
                                         acc_t<T> scale, DropoutMask drop, acc_t<T> keep_scale, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, L.Tq(), L.NH);
    const int64_t t = L.first_row + r.t, g = r.h / L.group();
    const int hs = static_cast<int>(L.hs);
    const int lane = threadIdx.x % 32;
    A* qs = warp_scratch<A>(2, hs);
    A *o = qs + hs, *p = o + hs;
    const T* qt = q + L.q_at(r.b, t, r.h);
    const T* kb = k + L.kv_at(r.b, 0, g);  // key s: kb + s * kv_row; value s likewise
    const T* vb = v + L.kv_at(r.b, 0, g);
    for (int d = lane; d < hs; d += 32) qs[d] = A(qt[d]), o[d] = 0;
    __syncwarp();
    A m = -INFINITY, l = 0;
    for (int64_t s0 = 0; s0 <= t; s0 += 32) {
        const int64_t s = s0 + lane;
        A score = -INFINITY;
        if (s <= t) {
            const T* ks = kb + s * L.kv_row;
            A dot = 0;
            for (int d = 0; d < hs; ++d) dot += qs[d] * A(ks[d]);
            score = dot * scale;
        }
        const A m_new = max(m, warp_max(score)), corr = exp(m - m_new);
        const A pv = s <= t ? exp(score - m_new) : A(0);
        l = l * corr + warp_sum(pv);
        m = m_new;
        p[lane] = pv * attention_drop_factor(drop, keep_scale, id / L.Tq(), L.T, t, s);
        __syncwarp();
        const int n = chunk(s0, t + 1);
        for (int d = lane; d < hs; d += 32) {
            A acc = o[d] * corr;
            for (int i = 0; i < n; ++i) acc += p[i] * A(vb[(s0 + i) * L.kv_row + d]);
            o[d] = acc;
        }
        __syncwarp();
    }
    T* out_row = out + L.out_at(r.b, t, r.h);
    for (int d = lane; d < hs; d += 32) out_row[d] = static_cast<T>(o[d] / l);
    if (lse && lane == 0) lse[id] = m + log(l);
}

// D[row] = dout_t . out_t over the row's head: the softmax backward's sum_s p dp.
template <class T>
__global__ void attention_rowdot_kernel(acc_t<T>* __restrict__ D, const T* __restrict__ dout, const T* __restrict__ out,
                                        AttentionLayout L, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, L.T, L.NH);
    const int64_t at = L.out_at(r.b, r.t, r.h);
    A sum = 0;
    for (int d = threadIdx.x % 32; d < L.hs; d += 32) sum += A(dout[at + d]) * A(out[at + d]);
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

// One warp per key row s of key/value head g: dk[s] = scale * sum over the group's query heads h
// and t >= s of dS q_t, dv[s] = sum of p z dout_t, the heads in order.
template <class T>
__global__ void attention_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout,
                                      const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                      const acc_t<T>* __restrict__ lse, const acc_t<T>* __restrict__ D,
                                      AttentionLayout L, acc_t<T> scale, DropoutMask drop, acc_t<T> keep_scale,
                                      int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, L.T, L.NKV);  // r.h: the key/value head
    const int64_t Tn = L.T, s = r.t;
    const int hs = static_cast<int>(L.hs);
    const int lane = threadIdx.x % 32;
    A* gk = warp_scratch<A>(2, hs);
    A *gv = gk + hs, *pd = gv + hs;  // pd: p z of 32 queries, then their dS
    const T* ks = k + L.kv_at(r.b, s, r.h);
    const T* vs = v + L.kv_at(r.b, s, r.h);
    for (int d = lane; d < hs; d += 32) gk[d] = 0, gv[d] = 0;
    for (int64_t h = r.h * L.group(); h < (r.h + 1) * L.group(); ++h) {
        const T* qb = q + L.q_at(r.b, 0, h);  // query t: qb + t * q_row
        const T* go_b = dout + L.out_at(r.b, 0, h);
        const int64_t row0 = L.row(r.b, h, 0), ld = L.NH * hs;
        for (int64_t t0 = s; t0 < Tn; t0 += 32) {
            const int64_t t = t0 + lane;
            A p = 0, ds = 0, z = 0;
            if (t < Tn) {
                z = attention_drop_factor(drop, keep_scale, r.b * L.NH + h, Tn, t, s);
                recompute<T, A>(p, ds, qb + t * L.q_row, ks, vs, go_b + t * ld, hs, scale, lse[row0 + t], D[row0 + t], z);
            }
            pd[lane] = p * z, pd[32 + lane] = ds;
            __syncwarp();
            const int n = chunk(t0, Tn);
            for (int d = lane; d < hs; d += 32) {
                A sum_v = 0, sum_k = 0;
                for (int i = 0; i < n; ++i) {
                    sum_v += pd[i] * A(go_b[(t0 + i) * ld + d]);
                    sum_k += pd[32 + i] * A(qb[(t0 + i) * L.q_row + d]);
                }
                gv[d] += sum_v, gk[d] += sum_k * scale;
            }
            __syncwarp();
        }
    }
    T *dks = dk + L.kv_at(r.b, s, r.h), *dvs = dv + L.kv_at(r.b, s, r.h);
    for (int d = lane; d < hs; d += 32) dks[d] = static_cast<T>(gk[d]), dvs[d] = static_cast<T>(gv[d]);
}

// One warp per query row t: dq[t] = scale * sum_{s <= t} dS k_s.
template <class T>
__global__ void attention_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const T* __restrict__ q,
                                    const T* __restrict__ k, const T* __restrict__ v, const acc_t<T>* __restrict__ lse,
                                    const acc_t<T>* __restrict__ D, AttentionLayout L, acc_t<T> scale,
                                    DropoutMask drop, acc_t<T> keep_scale, int64_t rows) {
    using A = acc_t<T>;
    const int64_t id = warp_row();
    if (id >= rows) return;
    const Row r(id, L.T, L.NH);
    const int64_t g = r.h / L.group();
    const int hs = static_cast<int>(L.hs);
    const int lane = threadIdx.x % 32;
    A* gq = warp_scratch<A>(1, hs);
    A* dsv = gq + hs;
    const T* qt = q + L.q_at(r.b, r.t, r.h);
    const T* kb = k + L.kv_at(r.b, 0, g);
    const T* vb = v + L.kv_at(r.b, 0, g);
    const T* go = dout + L.out_at(r.b, r.t, r.h);
    for (int d = lane; d < hs; d += 32) gq[d] = 0;
    for (int64_t s0 = 0; s0 <= r.t; s0 += 32) {
        const int64_t s = s0 + lane;
        A p = 0, ds = 0;
        if (s <= r.t)
            recompute<T, A>(p, ds, qt, kb + s * L.kv_row, vb + s * L.kv_row, go, hs, scale, lse[id], D[id],
                            attention_drop_factor(drop, keep_scale, id / L.T, L.T, r.t, s));
        dsv[lane] = ds;
        __syncwarp();
        const int n = chunk(s0, r.t + 1);
        for (int d = lane; d < hs; d += 32) {
            A sum = 0;
            for (int i = 0; i < n; ++i) sum += dsv[i] * A(kb[(s0 + i) * L.kv_row + d]);
            gq[d] += sum * scale;
        }
        __syncwarp();
    }
    T* dst = dq + L.q_at(r.b, r.t, r.h);
    for (int d = lane; d < hs; d += 32) dst[d] = static_cast<T>(gq[d]);
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

// cuDNN runs bf16 attention where it is built and chosen (attention_backend()), without dropout:
// its dropout mask is not ours (ops/attention.h numbers the mask), so our kernels draw it.
bool cudnn_runs(const DropoutMask& drop) { return !drop.active() && attention_backend() == AttentionBackend::Cudnn; }

}  // namespace

template <class T>
void attention_forward_cuda(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v, const AttentionLayout& L,
                            const DropoutMask& drop, int device) {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bf16>) {
        if (L.first_row == 0 && lse) {
            if (cudnn_runs(drop) && cudnn_attention_forward(out, lse, q, k, v, L, device)) return;
            if (flash_attention_applies(L, false, device, {out, q, k, v}))
                return flash_attention_forward(out, lse, q, k, v, L, drop, device);
        }
    }
    const A scale = A(1) / std::sqrt(A(L.hs));
    launch_rows<T>(attention_forward_kernel<T>, 2, static_cast<int>(L.hs), L.B * L.NH * L.Tq(), device, out, lse, q, k,
                   v, L, scale, drop, A(1) / (A(1) - A(drop.p)));
}

template <class T>
void attention_backward_cuda(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                             const acc_t<T>* lse, const AttentionLayout& L, const DropoutMask& drop, int device) {
    using A = acc_t<T>;
    if constexpr (std::is_same_v<T, bf16>) {
        if (cudnn_runs(drop) && cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, L, device)) return;
    }
    const int hs = static_cast<int>(L.hs);
    const int64_t rows = L.B * L.NH * L.T;
    Tensor D = empty({L.B, L.NH, L.T}, TensorOptions().dtype(dtype_of<A>()).device(Device::cuda(device)));
    launch_rows<T>(attention_rowdot_kernel<T>, 0, hs, rows, device, device_ptr<A>(D), dout, out, L);
    if constexpr (std::is_same_v<T, bf16>) {
        if (flash_attention_applies(L, true, device, {dq, dk, dv, dout, q, k, v}))
            return flash_attention_backward(dq, dk, dv, dout, q, k, v, lse, device_ptr<A>(D), L, drop, device);
    }
    const A scale = A(1) / std::sqrt(A(hs)), keep_scale = A(1) / (A(1) - A(drop.p));
    launch_rows<T>(attention_dkdv_kernel<T>, 2, hs, L.B * L.NKV * L.T, device, dk, dv, dout, q, k, v, lse,
                   device_ptr<A>(D), L, scale, drop, keep_scale);
    launch_rows<T>(attention_dq_kernel<T>, 1, hs, rows, device, dq, dout, q, k, v, lse, device_ptr<A>(D), L, scale, drop,
                   keep_scale);
}

#define NT_INSTANTIATE(T)                                                                                             \
    template void attention_forward_cuda<T>(T*, acc_t<T>*, const T*, const T*, const T*, const AttentionLayout&,      \
                                            const DropoutMask&, int);                                                \
    template void attention_backward_cuda<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*,            \
                                             const acc_t<T>*, const AttentionLayout&, const DropoutMask&, int);
NT_INSTANTIATE(float)
NT_INSTANTIATE(double)
NT_INSTANTIATE(bf16)
#undef NT_INSTANTIATE

}  // namespace normtape::detail
