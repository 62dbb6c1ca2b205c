// ops/matmul.h: matrix products on the cpu through Eigen. Inputs f32 or f64; outputs contiguous.
// Gradients are written (=); the engine adds them into leaves (+=). Both throw Error naming the op on an undefined, empty or non-floating input, on mismatched
// dtypes or devices, and on inner dimensions that differ (both shapes in the message).
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
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace normtape
