// ops/matmul.h: matrix products, Eigen on the cpu, cuBLAS on CUDA. Inputs f32, f64 or bf16;
// outputs contiguous. Gradients are written (=); the engine adds them into leaves (+=). Both
// throw, naming the op: Error on an undefined input; ShapeError on an empty or scalar input,
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
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace normtape
