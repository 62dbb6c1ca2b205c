// ops/matmul.h: matrix products, Eigen on the cpu, cuBLAS and cuBLASLt on CUDA. Inputs f32, f64
// or bf16; outputs contiguous. Gradients are written (=); the engine adds them into leaves (+=).
// Each throws, naming the op: Error on an undefined input; ShapeError on an empty or scalar input,
// inner dimensions that differ (both shapes in the message), a bias not of shape [N], or on CUDA
// a size above INT32_MAX (cuBLAS's int); DTypeError on a non-floating input or mismatched
// dtypes; DeviceError on mismatched devices; AnomalyError on a non-finite output under anomaly
// detection (core/autograd.h).
#pragma once

#include "core/tensor.h"

namespace normtape {

// matmul(a, b) = a @ b. a: [..., K] (leading dims flattened into rows), b: [K, N] -> [..., N].
// Saves b if a needs a gradient and a if b does. da = g @ b^T, db = a^T @ g.
Tensor matmul(const Tensor& a, const Tensor& b);

// linear(x, weight, bias) = x @ weight^T + bias, as torch.nn.functional.linear.
// x: [..., K], weight: [N, K], bias: [N] or undefined -> [..., N].
// Saves x if weight needs a gradient and weight if x does (a pre-LN block's Linear therefore
// saves the norm's output y: Note [Why saving y saves memory]).
// dx = g @ weight, dweight = g^T @ x (summed over rows), dbias = sum of g over rows.
// On CUDA (f32, bf16) the bias is added in the product's cuBLASLt epilogue where cuBLASLt has an
// algorithm for the shapes and alignments, else by a pass of our own; the same to rounding.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// linear_gelu(x, weight, bias) = gelu(linear(x, weight, bias)), gelu as in ops/elementwise.h
// (tanh approximation), as a GPT's MLP computes its hidden layer. bias is required.
// On CUDA (f32, bf16, N % 8 == 0) one cuBLASLt product writes both h = x @ weight^T + bias
// (rounded to x's dtype) and gelu(h) (CUBLASLT_EPILOGUE_GELU_AUX_BIAS): one pass instead of three.
// Saves h [..., N] (always, when anything needs a gradient), x if weight needs a gradient and
// weight if x does: the bytes of linear followed by gelu. dh = g * gelu'(h), then as linear.
// recompute_output: the output carries a recipe (core/autograd.h, Note [Rematerialization]):
// whoever saves it (the MLP's second Linear) keeps h, already saved, instead of its own
// [..., N] tensor, and gelu(h) is made again in backward. The output is then computed from the
// rounded h by gelu's own kernel (on CUDA: the bias in the epilogue, GELU a pass of its own), so
// that the two agree bit for bit.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, bool recompute_output = false);

}  // namespace normtape
