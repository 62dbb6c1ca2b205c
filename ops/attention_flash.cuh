// ops/attention_flash.cuh: the tensor-core path of causal self-attention (ops/attention_flash.cu),
// called by the launchers in ops/attention.cu for bf16 with head size 64 or 128. Internal.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/bf16.h"
#include "core/philox.h"
#include "ops/attention_layout.h"

namespace normtape::detail {

// True if the flash kernels run this call (the forward's, or the backward's where `backward`):
// head size 64 or 128, rows of q and k/v 16-byte aligned (every pointer given, and the layout's
// row strides), code built for sm_80 or later on a GPU whose blocks may take the kernel's shared
// memory (the backward at head size 128 takes 103 KiB: not on sm_86, sm_89 or sm_120, which give
// a block at most 99 KiB).
bool flash_attention_applies(const AttentionLayout& layout, bool backward, int device,
                             std::initializer_list<const void*> pointers);

// out and lse (f32) from q, k, v where `layout` puts them (first_row 0; ops/attention_layout.h).
void flash_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionLayout& layout, const DropoutMask& drop, int device);

// dq, dk, dv (=) from dout, q, k, v, lse and D (D = rowsum(dout * out) per head, f32), laid out as
// `layout` says; dk and dv summed over each group's query heads in order; deterministic.
void flash_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                              const bf16* v, const float* lse, const float* D, const AttentionLayout& layout,
                              const DropoutMask& drop, int device);

}  // namespace normtape::detail
