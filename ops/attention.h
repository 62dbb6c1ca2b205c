// ops/attention.h: causal self-attention: multi-head over GPT-2's packed q, k, v, and grouped-query over
// separate q, k, v.
#pragma once

#include <vector>

#include "core/philox.h"
#include "core/tensor.h"

namespace normtape {

// causal_self_attention(qkv, n_head, dropout_p): for each batch b, head h and position t,
//   p[b,h,t,s] = softmax over s <= t of (q[b,t,h] . k[b,s,h]) / sqrt(hs), 0 for s > t,
//   out[b,t,h] = sum_s p[b,h,t,s] z[b,h,t,s] v[b,s,h]
// (Vaswani et al. 2017, arXiv:1706.03762; GPT-2's causal mask; matches
// torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p)).
// z is dropout on the probabilities (1 when dropout_p == 0): keep / (1 - dropout_p), keep drawn
// for element ((b * n_head + h) * T + t) * T + s of a range of the dropout stream
// (philox_next(B * n_head * T * T), core/philox.h), the same on the cpu and CUDA. The mask is drawn
// again in backward: dropout saves nothing more.
// qkv: [B, T, 3C] f32, f64 or bf16, cpu or CUDA, laid out as GPT-2's c_attn output: q = [..., 0:C],
// k = [..., C:2C], v = [..., 2C:3C], head h owning columns h*hs .. (h+1)*hs, hs = C / n_head.
// Returns out: [B, T, C] of qkv's dtype and device, heads concatenated.
// Computed as FlashAttention-2 does (Dao 2023, arXiv:2307.08691): an online softmax over key
// blocks, so no T x T matrix is stored in forward or backward. Arithmetic in f32 (f64 for f64);
// on CUDA, bf16 with hs = 64 or 128 runs on tensor cores (bf16 products, f32 accumulation).
// Saves qkv, out and the row log-sum-exp lse [B, n_head, T] (f32; f64 for f64): B*T*(4C) elements
// + B*n_head*T statistics, linear in T; out is shared with the next op when it saves its input.
// The backward recomputes the probabilities from qkv and lse. dqkv is returned fresh (=).
// Throws, naming causal_self_attention: Error on an undefined qkv, n_head < 1 or dropout_p
// outside [0, 1); DTypeError on a non-floating qkv; ShapeError on an empty qkv, one that is not
// 3-D, a last dimension that is not 3C with C divisible by n_head, or on CUDA B * n_head * T above
// INT32_MAX or hs above 8192; AnomalyError on a non-finite output under anomaly detection.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head, double dropout_p = 0.0);

// causal_self_attention_rows(qkv, n_head, first_row): the rows first_row .. T-1 of
// causal_self_attention(qkv, n_head), for inference: row t attends to the keys 0..t of qkv, so a
// caller holding the q, k, v rows of positions 0..T-1 (a key/value cache, nn/model/generate.h) gets the
// outputs of only its new positions T - n .. T-1 with first_row = T - n, at O(n * T * C) work.
// qkv: [B, T, 3C] f32, f64 or bf16, cpu or CUDA, packed as causal_self_attention's (the q rows
// before first_row are not read). Returns out: [B, T - first_row, C] of qkv's dtype and device.
// On the cpu each row is computed by causal_self_attention's own loop, so the rows equal its rows
// bit for bit; on CUDA by its one-warp-per-row kernel for every dtype (the bf16 tensor-core kernel
// serves only causal_self_attention), equal to its rows to rounding.
// Records nothing and saves nothing. Throws, naming causal_self_attention_rows, as
// causal_self_attention does, and Error on first_row outside [0, T) or when grad mode is on and
// qkv requires grad (it has no backward: call it under NoGradGuard); AnomalyError on a non-finite
// output under anomaly detection.
Tensor causal_self_attention_rows(const Tensor& qkv, int64_t n_head, int64_t first_row);

// causal_attention(q, k, v, dropout_p): causal attention of separate q, k and v with grouped-query
// heads (Ainslie et al. 2023, arXiv:2305.13245, as Llama 2/3 and nanochat use them): query head h
// attends with key/value head h / (n_head / n_kv_head),
//   p[b,h,t,s] = softmax over s <= t of (q[b,t,h] . k[b,s,g]) / sqrt(hs), g = h / (n_head / n_kv_head),
//   out[b,t,h] = sum_s p[b,h,t,s] z[b,h,t,s] v[b,s,g]
// (matches torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p,
// enable_gqa=True) on [B, H, T, hs] transposes). k and v are never repeated in memory.
// q: [B, T, n_head, hs]; k, v: [B, T, n_kv_head, hs], n_kv_head dividing n_head; f32, f64 or bf16,
// one dtype and device (cpu or CUDA); any strides (copied contiguous where they are not). Dropout
// as causal_self_attention's, numbered by the query head. Returns out: [B, T, n_head, hs] of q's
// dtype and device. The same kernels as causal_self_attention (tensor cores for bf16 at hs 64 or
// 128 on CUDA). Saves q, k, v, out and lse [B, n_head, T] (f32; f64 for f64): B*T*hs*(2 n_head +
// 2 n_kv_head) elements + B*n_head*T statistics; each shared with whatever else saves it (the
// norm before it under SavePolicy::Output, the Linear after it). The backward recomputes the
// probabilities; dq, dk, dv are returned fresh (=), dk and dv summed over each group's query heads
// in a fixed order.
// Throws, naming causal_attention: Error on an undefined input or dropout_p outside [0, 1);
// DTypeError on a non-floating q or k, v of another dtype; DeviceError on k, v on another device;
// ShapeError on inputs not 4-D, an empty q (B, T, n_head or hs 0: there is no empty attention to
// compute), k and v of different shapes, B, T or hs that differ, n_kv_head 0 or not dividing
// n_head, or on CUDA B * n_head * T above INT32_MAX or hs above 8192; AnomalyError on a
// non-finite output under anomaly detection.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p = 0.0);

// causal_attention_rows(q, k, v): for inference with a key/value cache, the attention of the last
// Tq positions of a sequence of T: q [B, Tq, n_head, hs] holds the queries of positions T - Tq ..
// T - 1, k and v [B, T, n_kv_head, hs] every position's keys and values (Tq <= T). Row i attends
// to keys 0 .. T - Tq + i. Returns out: [B, Tq, n_head, hs]; on the cpu equal bit for bit to the
// rows of causal_attention, on CUDA (one-warp-per-row kernel for every dtype) to rounding.
// Records nothing and saves nothing. Throws, naming causal_attention_rows, as causal_attention
// does, and Error when grad mode is on and an input requires grad (call it under NoGradGuard).
Tensor causal_attention_rows(const Tensor& q, const Tensor& k, const Tensor& v);

// Which implementation runs causal attention (every op above but the _rows ones) in bf16 on
// CUDA without dropout: cuDNN's fused flash attention (Cudnn, the default where the library was
// built with cuDNN 9: CMake's NORMTAPE_CUDNN) or normtape's own kernels (Kernels: the default
// without cuDNN, and what runs f32, f64, dropout, the CPU and any layout cuDNN offers no engine
// for, which is said once on stderr). Both save the same tensors (q, k, v, out, lse), so memory
// and the saved-bytes formulas do not depend on it; cuDNN's backward adds dq up in f32 with
// atomics, so its dq may differ in the last bits from run to run, where our kernels' do not.
enum class AttentionBackend { Kernels, Cudnn };
AttentionBackend attention_backend();
// Chooses the implementation for every later call (process-wide, not thread-safe). Throws Error
// naming set_attention_backend when Cudnn is asked of a library built without cuDNN.
void set_attention_backend(AttentionBackend backend);
// "kernels" or "cudnn".
const char* attention_backend_name(AttentionBackend backend);

namespace detail {
// Attention's dropout factor z of query t and key s in (batch, head) bh = b * n_head + h: keep /
// (1 - p) for element (bh * T + t) * T + s of the mask (the numbering above), 1 without dropout.
// One definition for the cpu loops and the CUDA kernels, so both draw the same mask.
NT_HOST_DEVICE inline bool attention_keep(const DropoutMask& drop, int64_t bh, int64_t T, int64_t t, int64_t s) {
    return drop.keep(static_cast<uint64_t>((bh * T + t) * T + s));
}
template <class A>
NT_HOST_DEVICE A attention_drop_factor(const DropoutMask& drop, A keep_scale, int64_t bh, int64_t T, int64_t t,
                                       int64_t s) {
    if (!drop.active()) return A(1);
    return attention_keep(drop, bh, T, t, s) ? keep_scale : A(0);
}
}  // namespace detail

}  // namespace normtape
