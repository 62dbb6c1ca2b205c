// ops/attention.h: causal multi-head self-attention over packed q, k, v.
#pragma once

#include "core/tensor.h"

namespace normtape {

// causal_self_attention(qkv, n_head): for each batch b, head h and position t,
//   att[b,h,t,s] = softmax over s <= t of (q[b,t,h] . k[b,s,h]) / sqrt(hs), 0 for s > t,
//   out[b,t,h] = sum_s att[b,h,t,s] v[b,s,h]
// (Vaswani et al. 2017, arXiv:1706.03762; GPT-2's causal mask; matches
// torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)).
// qkv: [B, T, 3C] f32, f64 or bf16, cpu or CUDA (cuBLAS products, f32 accumulation; f64 for
// f64), laid out as GPT-2's c_attn output: q = [..., 0:C], k = [..., C:2C], v = [..., 2C:3C], head
// h owning columns h*hs .. (h+1)*hs, hs = C / n_head.
// Returns out: [B, T, C], heads concatenated.
// Saves qkv and the softmax probabilities att [B, n_head, T, T] (saved, not recomputed, as
// llm.c does: backward is then one pass). dqkv is returned fresh (=).
// Throws, naming causal_self_attention: Error on an undefined qkv or n_head < 1; DTypeError on a
// non-floating qkv; ShapeError on an empty qkv, one that is not 3-D, a last dimension that is not
// 3C with C divisible by n_head, an att [B, n_head, T, T] too large to count in int64, or on CUDA
// 3C or n_head * T above INT32_MAX; AnomalyError on a non-finite output under anomaly detection.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head);

}  // namespace normtape
