// ops/elementwise.h: add, mul, scale, gelu. Inputs f32, f64 or bf16 on the cpu or a CUDA device;
// outputs contiguous, of the inputs' dtype and device. Each throws, naming the op: Error on an
// undefined input; ShapeError on an empty input or mismatched shapes; DTypeError on a
// non-floating input or mismatched dtypes; DeviceError on mismatched devices; AnomalyError on a
// non-finite output under anomaly detection (core/anomaly.h). Gradients are written (=), add's
// passing the output gradient through, and the engine adds them into leaves (+=).
#pragma once

#include "core/tensor.h"

namespace normtape {

// a + b. b has a's shape, or a suffix of it and is broadcast over a's leading dimensions
// (a bias row [N] onto [..., N], positions [T, C] onto [B, T, C]). Saves nothing;
// db sums the gradient over the broadcast dimensions.
Tensor add(const Tensor& a, const Tensor& b);

// a * b elementwise, same shape. Saves b if a needs a gradient and a if b does.
Tensor mul(const Tensor& a, const Tensor& b);

// a * s for a scalar s. Saves nothing.
Tensor scale(const Tensor& a, double s);

// GELU, tanh approximation (Hendrycks & Gimpel 2016, arXiv:1606.08415; GPT-2; matches
// torch.nn.functional.gelu(x, approximate="tanh")):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Saves x.
Tensor gelu(const Tensor& x);

namespace detail {
// gelu's kernels, shared with linear_gelu (ops/matmul.h). Internal: they record nothing and check
// nothing. gelu_forward: gelu(x), x contiguous. gelu_backward: grad * gelu'(x), x and grad of one
// shape, dtype and device. Each returns a new contiguous tensor.
Tensor gelu_forward(const Tensor& x);
Tensor gelu_backward(const Tensor& grad, const Tensor& x);
}  // namespace detail

}  // namespace normtape
