// ops/activation.h: the MLP activations of modern decoders, relu_squared (Primer, nanochat) and
// swiglu (Llama). Not here: gelu, GPT-2's (ops/elementwise.h), and linear_gelu (ops/matmul.h).
// Both take h f32, f64 or bf16 on the cpu or a CUDA device (any strides: a non-contiguous h is
// read through a contiguous copy) and return a new contiguous tensor of h's dtype and device.
// Arithmetic in acc_t (f32 for f32 and bf16, f64 for f64), rounded once when stored. Each saves h
// for backward and returns dh fresh (=); the engine adds it into leaves (+=).
//
// recompute_output (both ops), as linear_gelu's (ops/matmul.h): when the call records, the output
// carries a recipe (core/autograd.h, Note [Rematerialization]) that makes it again from h with the
// op's own forward kernel, which also computed it, so the two agree bit for bit. Whoever saves the
// output (the MLP's down projection, a Linear, saves its input) then keeps h, already saved by
// this op, instead of a tensor of the output's size: the saved bytes of h -> act -> linear drop by
// exactly the output's bytes, the gradients are the same bits, and the backward pays one more
// forward of the activation. Without recording (NoGradGuard, or nothing requires grad) it changes
// nothing.
//
// Each throws, naming the op: Error on an undefined h; DTypeError on a non-floating h; ShapeError
// on an empty h (swiglu also: a scalar h, or a last dimension that is odd); AnomalyError on a
// non-finite output under anomaly detection (core/anomaly.h).
#pragma once

#include "core/tensor.h"

namespace normtape {

// relu_squared(h) = relu(h)^2 = max(h, 0)^2, elementwise, any shape (So et al. 2021, "Primer",
// arXiv:2109.08668; nanochat's MLP: F.relu(x).square()). NaN stays NaN, as torch.relu keeps it.
// Saves h. dh = g * 2 relu(h).
Tensor relu_squared(const Tensor& h, bool recompute_output = false);

// swiglu(h) = silu(gate) * up, h: [..., 2H] packed as [gate | up] (gate = h[..., :H], up =
// h[..., H:]: the concatenation of Llama's gate_proj and up_proj outputs, one product of width
// 2H), out: [..., H]. silu(x) = x * sigmoid(x) = x / (1 + exp(-x)), as torch.nn.functional.silu
// (Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202; Llama's MLP:
// down_proj(silu(gate_proj(x)) * up_proj(x))). exp is libm's (CUDA's expf, not __expf).
// bf16 rounds once, where transformers rounds silu(gate) to bf16 before the product.
// Saves h. dh: [..., 2H], with s = sigmoid(gate):
//   dgate = g * up * silu'(gate), silu'(x) = s (1 + x (1 - s));   dup = g * silu(gate).
Tensor swiglu(const Tensor& h, bool recompute_output = false);

namespace detail {
// The forward kernels, which the recipes call (recompute_output). Internal: they check nothing and
// record nothing; h contiguous, and for swiglu of a last dimension 2H. Each returns a new
// contiguous tensor.
Tensor relu_squared_forward(const Tensor& h);
Tensor swiglu_forward(const Tensor& h);
}  // namespace detail

}  // namespace normtape
