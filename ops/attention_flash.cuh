// ops/attention_flash.cuh: the tensor-core path of causal self-attention (ops/attention_flash.cu),
// called by the launchers in ops/attention.cu for bf16 with head size 64 or 128. Internal.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/bf16.h"
#include "core/philox.h"

namespace normtape::detail {

// True if the flash kernels run this call (the forward's, or the backward's where `backward`):
// head size 64 or 128, code built for sm_80 or later on a GPU whose blocks may take the
// kernel's shared memory (the backward at head size 128 takes 103 KiB: not on sm_86, sm_89 or
// sm_120, which give a block at most 99 KiB), and 16-byte aligned rows (every pointer given).
bool flash_attention_applies(int64_t hs, bool backward, int device, std::initializer_list<const void*> pointers);

// out [B, T, C] bf16 and lse [B, NH, T] f32 from qkv [B, T, 3C] bf16 (see ops/attention.h).
void flash_attention_forward(bf16* out, float* lse, const bf16* qkv, int64_t B, int64_t T_, int64_t C, int64_t NH,
                             const DropoutMask& drop, int device);

// dqkv [B, T, 3C] (=) from dout [B, T, C], qkv, lse and D [B, NH, T] f32 (D = rowsum(dout * out)
// per head); deterministic.
void flash_attention_backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D,
                              int64_t B, int64_t T_, int64_t C, int64_t NH, const DropoutMask& drop, int device);

}  // namespace normtape::detail
