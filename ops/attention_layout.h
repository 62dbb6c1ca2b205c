// ops/attention_layout.h: where the attention kernels (ops/attention.cpp, ops/attention.cu,
// ops/attention_flash.cu) find q, k, v, their gradients, the output and the row statistics, so
// that one set of kernels serves GPT-2's packed qkv and separate q, k, v of grouped-query
// attention. Internal.
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace normtape::detail {

// Queries t = first_row .. T-1 of NH heads attend to keys s = 0..t of NKV heads, each hs wide;
// NKV divides NH and query head h reads key/value head h / (NH / NKV) (grouped-query attention,
// Ainslie et al. 2023, arXiv:2305.13245; NKV == NH is multi-head attention).
//   q of (b, t, h):    q + b * q_batch + (t - first_row) * q_row + h * hs      (dq alike)
//   k, v of (b, s, g): k + (b * T + s) * kv_row + g * hs                       (dk, dv alike)
//   out of (b, t, h):  out + (b * Tq + t - first_row) * NH * hs + h * hs       [B, Tq, NH * hs]
//   lse, D of (b, h, t): (b * NH + h) * Tq + t - first_row                     [B, NH, Tq]
// with Tq = T - first_row. GPT-2's packed qkv [B, T, 3C] is q = qkv, k = qkv + C, v = qkv + 2C,
// q_batch = T * 3C, q_row = kv_row = 3C; separate tensors [B, T, H, hs] have q_row = NH * hs and
// kv_row = NKV * hs.
struct AttentionLayout {
    int64_t B, T, NH, NKV, hs;
    int64_t q_batch, q_row, kv_row;
    int64_t first_row;

    NT_HOST_DEVICE int64_t Tq() const { return T - first_row; }
    NT_HOST_DEVICE int64_t group() const { return NH / NKV; }
    NT_HOST_DEVICE int64_t q_at(int64_t b, int64_t t, int64_t h) const {
        return b * q_batch + (t - first_row) * q_row + h * hs;
    }
    // g: a key/value head.
    NT_HOST_DEVICE int64_t kv_at(int64_t b, int64_t s, int64_t g) const { return (b * T + s) * kv_row + g * hs; }
    NT_HOST_DEVICE int64_t out_at(int64_t b, int64_t t, int64_t h) const {
        return (b * Tq() + t - first_row) * NH * hs + h * hs;
    }
    NT_HOST_DEVICE int64_t row(int64_t b, int64_t h, int64_t t) const { return (b * NH + h) * Tq() + t - first_row; }
};

}  // namespace normtape::detail
