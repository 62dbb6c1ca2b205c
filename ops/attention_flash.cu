// ops/attention_flash.cu: causal self-attention on bf16 tensor cores, the FlashAttention-2
// algorithm (Dao 2023, arXiv:2307.08691). Nothing of size T x T is ever stored: the forward walks
// key/value tiles in shared memory with an online softmax and saves the row log-sum-exp; the
// backward recomputes the probabilities tile by tile from it.
//
// Layout. A block owns 64 rows (forward: queries; backward: keys) and walks 64-row tiles of the
// other side; each of its 4 warps owns 16 of the rows. Products are mma.sync m16n8k16 (bf16 in,
// f32 accumulate). Operands that come from shared memory are read with ldmatrix (.trans where the
// tile is stored the other way round); an operand computed by the warp itself (P, dS) goes from
// the accumulator layout to the A layout in registers, two 8-column accumulators making one
// 16-column A fragment. Tiles are padded by 8 elements a row so that ldmatrix's 8 row addresses
// hit 8 different bank groups.
//
// Forward (query tile i): S = Q K_j^T, running max m and sum l, O = O * exp(m_old - m) + P V_j,
// for key tiles j <= i (the causal mask inside j == i only); out = O / l, lse = m + log(l).
// K_{j+1} is copied (cp.async) while P V_j is computed, V_{j+1} while S_{j+1} is.
// Backward, two kernels, so that every sum has one owner and a fixed order (no atomics):
// dK, dV (key tile j, query tiles i >= j): P^T = exp(K Q^T * scale - lse), dV += P^T dO,
// dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q; dQ (query tile i, key tiles j <= i):
// S, P and dP again, dQ += dS K. The next tile is copied while the current one is used.
// Dropout on the probabilities (a template argument, so that the kernels without it are
// unchanged): the forward multiplies P by z = keep / (1 - p) after adding it into l; the backward
// draws z again (core/philox.h), dV += (P z)^T dO and dS = P (z dP - D).
// Grouped-query attention (ops/attention_layout.h): a block of the forward or dQ reads the K and V
// of its query head's group; a block of dK, dV walks the query tiles of every query head of its
// group in turn, so each sum still has one owner.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/attention_flash.cuh"
#include "ops/cuda_common.cuh"
#include "ops/mma.cuh"

namespace normtape::detail {

namespace {

constexpr int kTile = 64;              // rows a block owns, and rows of each tile it walks
constexpr int kThreads = 128;          // 4 warps of 16 rows
constexpr float kLog2e = 1.4426950408889634f;

template <int HS>
constexpr int kStride = HS + 8;        // a shared tile's row, in elements

// Rows [row0, row0 + 64) of an [T, HS] matrix whose rows are `ld` elements apart, into a shared
// tile; rows at or past T are zero. Committed by the caller.
template <int HS>
__device__ void load_tile(bf16* tile, const bf16* src, int64_t ld, int row0, int Tn) {
    constexpr int chunks = HS / 8;  // 16 bytes each
    for (int i = threadIdx.x; i < kTile * chunks; i += kThreads) {
        int r = i / chunks, c = (i % chunks) * 8;
        bf16* to = tile + r * kStride<HS> + c;
        if (row0 + r < Tn) copy_async16(to, src + static_cast<int64_t>(row0 + r) * ld + c);
        else *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    }
}

__device__ inline float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ inline float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Grid: B * NH * tiles blocks, x = (bh, then tile from the last, the longest, down): the longest
// blocks go first and the shortest fill the tail.
template <int HS, bool DROPOUT>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                                                                 const bf16* __restrict__ q, const bf16* __restrict__ k,
                                                                 const bf16* __restrict__ v, AttentionLayout L, int tiles,
                                                                 float scale_log2, DropoutMask drop, float keep_scale) {
    extern __shared__ __align__(16) unsigned char shared_raw[];
    constexpr int S = kStride<HS>;
    bf16* sq = reinterpret_cast<bf16*>(shared_raw);
    bf16* sk = sq + kTile * S;
    bf16* sv = sk + kTile * S;
    const int Tn = static_cast<int>(L.T), BNH = static_cast<int>(L.B * L.NH), NH = static_cast<int>(L.NH);
    const int bh = blockIdx.x % BNH, tile = tiles - 1 - blockIdx.x / BNH, b = bh / NH, h = bh % NH;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const bf16* q_base = q + L.q_at(b, 0, h);
    const bf16* k_base = k + L.kv_at(b, 0, h / L.group());
    const bf16* v_base = v + L.kv_at(b, 0, h / L.group());
    const int q0 = tile * kTile;

    load_tile<HS>(sq, q_base, L.q_row, q0, Tn);
    copy_async_commit();
    load_tile<HS>(sk, k_base, L.kv_row, 0, Tn);
    copy_async_commit();
    load_tile<HS>(sv, v_base, L.kv_row, 0, Tn);
    copy_async_commit();
    copy_async_wait_n<2>();
    __syncthreads();
    uint32_t qf[HS / 16][4];
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) load_a(qf[kk], sq, S, warp * 16, kk * 16, lane);

    float o[HS / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    for (int j = 0; j <= tile; ++j) {
        copy_async_wait_n<1>();  // K_j has landed (V_j may not have)
        __syncthreads();
        float s[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk)
#pragma unroll
            for (int n = 0; n < kTile / 16; ++n) {
                uint32_t bk[4];
                load_b(bk, sk, S, n * 16, kk * 16, lane);
                mma(s[2 * n], qf[kk], bk[0], bk[1]);
                mma(s[2 * n + 1], qf[kk], bk[2], bk[3]);
            }
        __syncthreads();  // every warp is done with K_j
        if (j < tile) load_tile<HS>(sk, k_base, L.kv_row, (j + 1) * kTile, Tn);
        copy_async_commit();

        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = s[n][e] * scale_log2;
                if (j == tile && j * kTile + n * 8 + 2 * t4 + (e & 1) > row[e / 2]) v = -INFINITY;
                s[n][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        float corr[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = quad_max(mx[r]);  // finite: key 0 of tile 0 is visible to every row
            corr[r] = exp2f(m[r] - mx[r]);
            m[r] = mx[r];
        }
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[n][e] = exp2f(s[n][e] - m[e / 2]);
                sum[e / 2] += s[n][e];
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];  // this thread's columns; summed at the end
        if constexpr (DROPOUT) {  // l holds every probability; P V only the kept ones
#pragma unroll
            for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    s[n][e] *= attention_keep(drop, bh, Tn, row[e / 2], j * kTile + n * 8 + 2 * t4 + (e & 1)) ? keep_scale : 0.f;
        }
#pragma unroll
        for (int d = 0; d < HS / 8; ++d) {
            o[d][0] *= corr[0], o[d][1] *= corr[0];
            o[d][2] *= corr[1], o[d][3] *= corr[1];
        }

        copy_async_wait_n<1>();  // V_j has landed (K_{j+1} may not have)
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
            uint32_t a[4];
            to_a(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < HS / 16; ++n) {
                uint32_t bv[4];
                load_b_trans(bv, sv, S, kk * 16, n * 16, lane);
                mma(o[2 * n], a, bv[0], bv[1]);
                mma(o[2 * n + 1], a, bv[2], bv[3]);
            }
        }
        __syncthreads();  // every warp is done with V_j
        if (j < tile) load_tile<HS>(sv, v_base, L.kv_row, (j + 1) * kTile, Tn);
        copy_async_commit();
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] = quad_sum(l[r]);
        if (row[r] >= Tn) continue;
        const float inv = 1.f / l[r];
        bf16* dst = out + L.out_at(b, row[r], h) + 2 * t4;
#pragma unroll
        for (int d = 0; d < HS / 8; ++d)
            *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
        if (t4 == 0) lse[static_cast<int64_t>(bh) * Tn + row[r]] = (m[r] + log2f(l[r])) / kLog2e;
    }
}

// Grid: B * NKV * tiles blocks, x = (b and key/value head, then key tile from the first, the
// longest, up). A block walks the query tiles of each query head of its group in turn, the heads
// in order, so that dK and dV sum over the group with no atomics.
template <int HS, bool DROPOUT>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 3 : 1)  // 3 blocks an SM spill 8 bytes at 64
    flash_dkdv_kernel(bf16* __restrict__ dk_out, bf16* __restrict__ dv_out, const bf16* __restrict__ dout,
                      const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      const float* __restrict__ lse, const float* __restrict__ D, AttentionLayout L, int tiles,
                      float scale, DropoutMask drop, float keep_scale) {
    extern __shared__ __align__(16) unsigned char shared_raw[];
    constexpr int S = kStride<HS>;
    bf16* sk = reinterpret_cast<bf16*>(shared_raw);
    bf16* sv = sk + kTile * S;
    bf16* sq_buf = sv + kTile * S;  // two buffers each of Q, dO, lse and D: step i in i % 2
    bf16* sdo_buf = sq_buf + 2 * kTile * S;
    float* slse_buf = reinterpret_cast<float*>(sdo_buf + 2 * kTile * S);
    float* sD_buf = slse_buf + 2 * kTile;
    const int Tn = static_cast<int>(L.T), NKV = static_cast<int>(L.NKV), G = static_cast<int>(L.group());
    const int BG = static_cast<int>(L.B) * NKV, out_ld = static_cast<int>(L.NH * HS);
    const int bg = blockIdx.x % BG, tile = blockIdx.x / BG, b = bg / NKV, kv_head = bg % NKV;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const int k0 = tile * kTile;
    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    // Step i: query head h = kv_head * G + i / n, query tile tile + i % n, of G * n steps.
    const int n = tiles - tile, steps = G * n;
    auto head = [&](int i) { return kv_head * G + i / n; };
    auto first_query = [&](int i) { return (tile + i % n) * kTile; };
    // Queues step i's Q, dO, lse and D into buffer i % 2; rows past T: zeros, lse = +inf (P = 0).
    auto load_query_tile = [&](int i) {
        const int h = head(i), q0 = first_query(i), buf = i % 2, bh = b * static_cast<int>(L.NH) + h;
        load_tile<HS>(sq_buf + buf * kTile * S, q + L.q_at(b, 0, h), L.q_row, q0, Tn);
        load_tile<HS>(sdo_buf + buf * kTile * S, dout + L.out_at(b, 0, h), out_ld, q0, Tn);
        if (threadIdx.x < kTile) {
            const int t = q0 + threadIdx.x;
            const int64_t at = static_cast<int64_t>(bh) * Tn + t;
            float *to_lse = slse_buf + buf * kTile + threadIdx.x, *to_D = sD_buf + buf * kTile + threadIdx.x;
            if (t < Tn) copy_async4(to_lse, lse + at), copy_async4(to_D, D + at);
            else *to_lse = INFINITY, *to_D = 0.f;
        }
        copy_async_commit();
    };

    load_tile<HS>(sk, k + L.kv_at(b, 0, kv_head), L.kv_row, k0, Tn);
    load_tile<HS>(sv, v + L.kv_at(b, 0, kv_head), L.kv_row, k0, Tn);
    load_query_tile(0);
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int i = 0; i < steps; ++i) {
        const int q0 = first_query(i), bh = b * static_cast<int>(L.NH) + head(i);
        const bf16* sq = sq_buf + i % 2 * kTile * S;
        const bf16* sdo = sdo_buf + i % 2 * kTile * S;
        const float* slse = slse_buf + i % 2 * kTile;
        const float* sD = sD_buf + i % 2 * kTile;
        copy_async_wait_n<0>();  // step i's tiles have landed
        __syncthreads();         // ... for every thread; and step i - 1's buffers are no longer read
        if (i + 1 < steps) load_query_tile(i + 1);

        // S^T = K_w Q^T (16 keys x 64 queries), then P^T.
        float p[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk) {
            uint32_t a[4];
            load_a(a, sk, S, warp * 16, kk * 16, lane);
#pragma unroll
            for (int n = 0; n < kTile / 16; ++n) {
                uint32_t bq[4];
                load_b(bq, sq, S, n * 16, kk * 16, lane);
                mma(p[2 * n], a, bq[0], bq[1]);
                mma(p[2 * n + 1], a, bq[2], bq[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = n * 8 + 2 * t4 + (e & 1);
                const float v = fminf(1.f, exp2f((p[n][e] * scale - slse[c]) * kLog2e));  // <= 1 as in forward
                p[n][e] = q0 + c < key[e / 2] ? 0.f : v;
            }
        // With dropout, z = keep / (1 - p) of each (query, key), its keep bits in `kept` (bit 4n + e):
        // dV += (P z)^T dO, dS^T = P^T (z dP^T - D).
        uint32_t kept = 0;
        if constexpr (DROPOUT) {
#pragma unroll
            for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (attention_keep(drop, bh, Tn, q0 + n * 8 + 2 * t4 + (e & 1), key[e / 2])) kept |= 1u << (4 * n + e);
        }
        auto z = [&](int n, int e) { return kept >> (4 * n + e) & 1u ? keep_scale : 0.f; };
        // dV += P^T dO
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
            uint32_t a[4];
            if constexpr (DROPOUT) {
                float pz[2][4];
#pragma unroll
                for (int e = 0; e < 4; ++e) pz[0][e] = p[2 * kk][e] * z(2 * kk, e), pz[1][e] = p[2 * kk + 1][e] * z(2 * kk + 1, e);
                to_a(a, pz[0], pz[1]);
            } else {
                to_a(a, p[2 * kk], p[2 * kk + 1]);
            }
#pragma unroll
            for (int n = 0; n < HS / 16; ++n) {
                uint32_t bo[4];
                load_b_trans(bo, sdo, S, kk * 16, n * 16, lane);
                mma(dv[2 * n], a, bo[0], bo[1]);
                mma(dv[2 * n + 1], a, bo[2], bo[3]);
            }
        }
        // dP^T = V_w dO^T, then dS^T = P^T (dP^T - D), kept in ds.
        float ds[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk) {
            uint32_t a[4];
            load_a(a, sv, S, warp * 16, kk * 16, lane);
#pragma unroll
            for (int n = 0; n < kTile / 16; ++n) {
                uint32_t bo[4];
                load_b(bo, sdo, S, n * 16, kk * 16, lane);
                mma(ds[2 * n], a, bo[0], bo[1]);
                mma(ds[2 * n + 1], a, bo[2], bo[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (DROPOUT) ds[n][e] *= z(n, e);
                ds[n][e] = p[n][e] * (ds[n][e] - sD[n * 8 + 2 * t4 + (e & 1)]);
            }
        // dK += dS^T Q (scaled at the end)
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
            uint32_t a[4];
            to_a(a, ds[2 * kk], ds[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < HS / 16; ++n) {
                uint32_t bq[4];
                load_b_trans(bq, sq, S, kk * 16, n * 16, lane);
                mma(dk[2 * n], a, bq[0], bq[1]);
                mma(dk[2 * n + 1], a, bq[2], bq[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (key[r] >= Tn) continue;
        bf16* dst_k = dk_out + L.kv_at(b, key[r], kv_head) + 2 * t4;
        bf16* dst_v = dv_out + L.kv_at(b, key[r], kv_head) + 2 * t4;
#pragma unroll
        for (int d = 0; d < HS / 8; ++d) {
            *reinterpret_cast<uint32_t*>(dst_k + d * 8) = pack_bf16(dk[d][2 * r] * scale, dk[d][2 * r + 1] * scale);
            *reinterpret_cast<uint32_t*>(dst_v + d * 8) = pack_bf16(dv[d][2 * r], dv[d][2 * r + 1]);
        }
    }
}


// dQ: a block owns 64 queries and walks key tiles j <= its own, as the forward does:
// S = Q K^T, P = exp(S * scale - lse), dP = dO V^T, dS = P (dP - D), dQ += dS K (dS goes from the
// accumulators to the A operand in registers). K and V tiles are double-buffered. Grid as the forward.
template <int HS, bool DROPOUT>
__global__ void __launch_bounds__(kThreads, HS == 64 ? 3 : 2)
    flash_dq_kernel(bf16* __restrict__ dq_out, const bf16* __restrict__ dout, const bf16* __restrict__ q,
                    const bf16* __restrict__ k, const bf16* __restrict__ v, const float* __restrict__ lse,
                    const float* __restrict__ D, AttentionLayout L, int tiles, float scale, DropoutMask drop,
                    float keep_scale) {
    extern __shared__ __align__(16) unsigned char shared_raw[];
    constexpr int S = kStride<HS>;
    bf16* sq = reinterpret_cast<bf16*>(shared_raw);
    bf16* sdo = sq + kTile * S;
    bf16* sk_buf = sdo + kTile * S;  // K_j in buffer j % 2, V_j likewise
    bf16* sv_buf = sk_buf + 2 * kTile * S;
    const int Tn = static_cast<int>(L.T), BNH = static_cast<int>(L.B * L.NH), NH = static_cast<int>(L.NH);
    const int bh = blockIdx.x % BNH, tile = tiles - 1 - blockIdx.x / BNH, b = bh / NH, h = bh % NH;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const bf16* k_base = k + L.kv_at(b, 0, h / L.group());
    const bf16* v_base = v + L.kv_at(b, 0, h / L.group());
    const int q0 = tile * kTile;
    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float row_lse[2], row_D[2];  // rows past T: P = 0
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t at = static_cast<int64_t>(bh) * Tn + row[r];
        row_lse[r] = row[r] < Tn ? lse[at] * kLog2e : INFINITY;
        row_D[r] = row[r] < Tn ? D[at] : 0.f;
    }
    auto load_key_tile = [&](int j) {
        load_tile<HS>(sk_buf + j % 2 * kTile * S, k_base, L.kv_row, j * kTile, Tn);
        load_tile<HS>(sv_buf + j % 2 * kTile * S, v_base, L.kv_row, j * kTile, Tn);
        copy_async_commit();
    };
    load_tile<HS>(sq, q + L.q_at(b, 0, h), L.q_row, q0, Tn);
    load_tile<HS>(sdo, dout + L.out_at(b, 0, h), NH * HS, q0, Tn);
    load_key_tile(0);

    float dq[HS / 8][4] = {};
    for (int j = 0; j <= tile; ++j) {
        const bf16* sk = sk_buf + j % 2 * kTile * S;
        const bf16* sv = sv_buf + j % 2 * kTile * S;
        copy_async_wait_n<0>();  // tile j has landed
        __syncthreads();         // ... for every thread; and tile j - 1's buffers are no longer read
        if (j < tile) load_key_tile(j + 1);

        float p[kTile / 8][4] = {}, ds[kTile / 8][4] = {};
#pragma unroll
        for (int kk = 0; kk < HS / 16; ++kk) {
            uint32_t aq[4], ao[4];
            load_a(aq, sq, S, warp * 16, kk * 16, lane);
            load_a(ao, sdo, S, warp * 16, kk * 16, lane);
#pragma unroll
            for (int n = 0; n < kTile / 16; ++n) {
                uint32_t bk[4], bv[4];
                load_b(bk, sk, S, n * 16, kk * 16, lane);
                mma(p[2 * n], aq, bk[0], bk[1]);
                mma(p[2 * n + 1], aq, bk[2], bk[3]);
                load_b(bv, sv, S, n * 16, kk * 16, lane);
                mma(ds[2 * n], ao, bv[0], bv[1]);
                mma(ds[2 * n + 1], ao, bv[2], bv[3]);
            }
        }
#pragma unroll
        for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = j * kTile + n * 8 + 2 * t4 + (e & 1);
                const float pv = fminf(1.f, exp2f(p[n][e] * scale * kLog2e - row_lse[e / 2]));  // <= 1 as in forward
                float dp = ds[n][e];
                if constexpr (DROPOUT) dp *= attention_keep(drop, bh, Tn, row[e / 2], key) ? keep_scale : 0.f;
                ds[n][e] = key > row[e / 2] ? 0.f : pv * (dp - row_D[e / 2]);
            }
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
            uint32_t a[4];
            to_a(a, ds[2 * kk], ds[2 * kk + 1]);
#pragma unroll
            for (int n = 0; n < HS / 16; ++n) {
                uint32_t bk[4];
                load_b_trans(bk, sk, S, kk * 16, n * 16, lane);
                mma(dq[2 * n], a, bk[0], bk[1]);
                mma(dq[2 * n + 1], a, bk[2], bk[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (row[r] >= Tn) continue;
        bf16* dst = dq_out + L.q_at(b, row[r], h) + 2 * t4;
#pragma unroll
        for (int d = 0; d < HS / 8; ++d)
            *reinterpret_cast<uint32_t*>(dst + d * 8) = pack_bf16(dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale);
    }
}

template <int HS>
constexpr size_t forward_shared() { return 3u * kTile * kStride<HS> * sizeof(bf16); }
template <int HS>
constexpr size_t backward_shared() {
    return 6u * kTile * kStride<HS> * sizeof(bf16) + 4u * kTile * sizeof(float);
}

}  // namespace

bool flash_attention_applies(const AttentionLayout& layout, bool backward, int device,
                             std::initializer_list<const void*> pointers) {
    const int64_t hs = layout.hs;
    if (hs != 64 && hs != 128) return false;
    if (layout.q_row % 8 != 0 || layout.kv_row % 8 != 0) return false;  // 16-byte rows
    for (const void* p : pointers)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    const size_t shared = backward ? (hs == 64 ? backward_shared<64>() : backward_shared<128>())
                                   : (hs == 64 ? forward_shared<64>() : forward_shared<128>());
    // The device's shared memory a block may opt in to, or 0 where the kernels cannot run on it:
    // the code this GPU runs must come from sm_80 or later (mma.sync, ldmatrix, cp.async), not on
    // an earlier GPU, nor from a build whose code for this GPU is an earlier architecture's PTX.
    // Asked once per device. The device is made current on every call, as the launches that follow
    // set the kernels' attributes on the current device.
    (void)cuda::stream(device);
    static std::mutex mutex;
    static std::vector<std::pair<int, int>> usable_shared;  // (device, bytes)
    std::lock_guard<std::mutex> lock(mutex);
    auto it = std::find_if(usable_shared.begin(), usable_shared.end(), [&](const auto& e) { return e.first == device; });
    if (it == usable_shared.end()) {
        int shared_optin = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        cudaFuncAttributes attributes{};
        CUDA_CHECK(cudaFuncGetAttributes(&attributes, flash_forward_kernel<64, false>));
        it = usable_shared.insert(usable_shared.end(), {device, attributes.ptxVersion >= 80 ? shared_optin : 0});
    }
    return shared <= static_cast<size_t>(it->second) && it->second > 0;
}

void flash_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionLayout& L, const DropoutMask& drop, int device) {
    const int64_t tiles = (L.T + kTile - 1) / kTile;
    const float scale_log2 = static_cast<float>(kLog2e / std::sqrt(static_cast<double>(L.hs)));
    auto run = [&](auto kernel, size_t shared) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        kernel<<<static_cast<unsigned>(L.B * L.NH * tiles), kThreads, shared, cuda::stream(device)>>>(
            out, lse, q, k, v, L, static_cast<int>(tiles), scale_log2, drop, static_cast<float>(1.0 / (1.0 - drop.p)));
        CUDA_LAUNCH_CHECK();
    };
    if (L.hs == 64) {
        if (drop.active()) run(flash_forward_kernel<64, true>, forward_shared<64>());
        else run(flash_forward_kernel<64, false>, forward_shared<64>());
    } else {
        if (drop.active()) run(flash_forward_kernel<128, true>, forward_shared<128>());
        else run(flash_forward_kernel<128, false>, forward_shared<128>());
    }
}

void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                              const bf16* v, const float* lse, const float* D, const AttentionLayout& L,
                              const DropoutMask& drop, int device) {
    const int64_t tiles = (L.T + kTile - 1) / kTile;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(L.hs)));
    const float keep_scale = static_cast<float>(1.0 / (1.0 - drop.p));
    auto both = [&](auto dkdv, auto dq_kernel, size_t shared) {
        for (const void* kernel : {reinterpret_cast<const void*>(dkdv), reinterpret_cast<const void*>(dq_kernel)})
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
        dkdv<<<static_cast<unsigned>(L.B * L.NKV * tiles), kThreads, shared, cuda::stream(device)>>>(
            dk, dv, dout, q, k, v, lse, D, L, static_cast<int>(tiles), scale, drop, keep_scale);
        CUDA_LAUNCH_CHECK();
        dq_kernel<<<static_cast<unsigned>(L.B * L.NH * tiles), kThreads, shared, cuda::stream(device)>>>(
            dq, dout, q, k, v, lse, D, L, static_cast<int>(tiles), scale, drop, keep_scale);
        CUDA_LAUNCH_CHECK();
    };
    if (L.hs == 64) {
        if (drop.active()) both(flash_dkdv_kernel<64, true>, flash_dq_kernel<64, true>, backward_shared<64>());
        else both(flash_dkdv_kernel<64, false>, flash_dq_kernel<64, false>, backward_shared<64>());
    } else {
        if (drop.active()) both(flash_dkdv_kernel<128, true>, flash_dq_kernel<128, true>, backward_shared<128>());
        else both(flash_dkdv_kernel<128, false>, flash_dq_kernel<128, false>, backward_shared<128>());
    }
}

}  // namespace normtape::detail
