// ops/rotary.h: rotary position embedding (RoPE), the positions of Llama-style attention.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace normtape {

// rotary_embedding(x, position_offset, theta): rotates each pair (d, d + hs/2) of every head of
// x by the angle of its position (Su et al. 2021, "RoFormer", arXiv:2104.09864), in Hugging Face
// Llama's convention (transformers' rotate_half: the pairs are the two halves of a head, not
// adjacent elements). For t < T and d < hs/2, with p = position_offset + t:
//   inv_freq_d = 1 / theta^(2d/hs),   angle = p * inv_freq_d,
//   out[b, t, h, d]        = x[b, t, h, d] * cos(angle) - x[b, t, h, d + hs/2] * sin(angle)
//   out[b, t, h, d + hs/2] = x[b, t, h, d + hs/2] * cos(angle) + x[b, t, h, d] * sin(angle)
// x: [B, T, H, hs] (exactly 4-D, hs even), f32, f64 or bf16, cpu or CUDA, any strides (a
// non-contiguous x is read through a contiguous copy). Returns a new contiguous tensor of x's
// shape, dtype and device. position_offset is the position of x's first row: the number of
// positions already in a key/value cache, so that rotary_embedding(x[:, t0:], t0) equals
// rotary_embedding(x)[:, t0:], bit for bit on the cpu.
// Arithmetic: f64 for f64 (inv_freq, angle, cos and sin in double). For f32 and bf16 as
// transformers' LlamaRotaryEmbedding computes them, in f32: inv_freq_d = 1.0f / r with
// r = theta^(float(2d) / float(hs)) rounded to f32 (theta itself taken as f32; the power is
// evaluated in double and rounded once, the correctly rounded powf, the same on both devices),
// angle = float(p) * inv_freq_d in f32 (exact positions below 2^24), cos and sin in f32 (libm's
// cosf/sinf on the cpu, CUDA's cosf/sinf, not the fast intrinsics, on the GPU: they may differ
// by an ulp or two), and the products and the sum rounded as transformers' separate tensor ops
// round them (no fused multiply-add). bf16 loads exactly into f32 and rounds once on store,
// where transformers rounds cos, sin and every product to bf16: bf16 outputs may differ from
// its by an ulp of bf16.
// Saves nothing for backward (only position_offset and theta): the backward is the inverse
// rotation with the same cos and sin,
//   dx[.., d] = g[.., d] * cos + g[.., d + hs/2] * sin,  dx[.., d + hs/2] = g[.., d + hs/2] * cos - g[.., d] * sin.
// dx is returned fresh (=).
// Throws, naming rotary_embedding: Error on an undefined x, position_offset < 0 (or so large
// that position_offset + T overflows int64), or theta not finite and > 0; DTypeError on a
// non-floating x; ShapeError on an x that is not 4-D, is empty, or has an odd hs; AnomalyError
// on a non-finite output under anomaly detection.
Tensor rotary_embedding(const Tensor& x, int64_t position_offset = 0, double theta = 10000.0);

}  // namespace normtape
