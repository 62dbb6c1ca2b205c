// ops/attention_cudnn.h: causal attention through cuDNN's fused flash attention (cuDNN 9's graph
// API, ops/attention_cudnn.cpp), called by the launchers in ops/attention.cu for bf16 without
// dropout where the build has cuDNN (NORMTAPE_CUDNN) and attention_backend() is Cudnn. Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "core/bf16.h"
#include "ops/attention_layout.h"

namespace normtape::detail {

// True if the library was built with cuDNN's attention (CMake's NORMTAPE_CUDNN, on where cuDNN 9
// is found).
bool cudnn_attention_built();

// out [B, Tq, NH * hs] and lse [B, NH, T] (f32, the natural log-sum-exp of the scaled scores, as
// our kernels write it) from q, k, v where `layout` puts them (first_row 0). Returns false, having
// written nothing, where cuDNN has no engine for the layout or cannot start (a message on stderr,
// once per layout), the build has no cuDNN, or a pointer or row stride is not 16-byte aligned.
// Throws Error when cuDNN fails to run a plan it built.
bool cudnn_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionLayout& layout, int device);

// dq, dk, dv (=) from dout, q, k, v, out and lse, laid out as `layout` says; dk and dv summed
// over each group's query heads. Returns false as cudnn_attention_forward does. cuDNN adds dq
// up in f32 with atomics, so dq may differ in its last bits from one run to the next.
bool cudnn_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const float* lse, const AttentionLayout& layout,
                              int device);

}  // namespace normtape::detail
