// ops/cast.h: cast, a dtype conversion that gradients flow through (PyTorch's x.to(dtype) under
// autograd, whose node is ToCopyBackward0). Tensor::to(DType) is the same copy without a node.
#pragma once

#include "core/tensor.h"

namespace normtape {

// cast(x, dtype): x converted to `dtype`, each element rounded to nearest even (f64 -> f32 -> bf16),
// or widened exactly. x: any shape, f32, f64 or bf16, cpu or CUDA; dtype: f32, f64 or bf16. Returns
// x itself when it already has `dtype`, else a new contiguous tensor of x's shape and device (a
// copy on the device's stream). Saves nothing for backward: dx = dy converted to x's dtype,
// returned fresh (=).
// Throws, naming cast: Error on an undefined x; DTypeError on a non-floating x or dtype (i64
// indices are Tensor::to's, which is not differentiable); ShapeError on an empty x; DTypeError for
// bf16 on a GPU before compute capability 8.0; AnomalyError on a non-finite output under anomaly
// detection (a narrowing that overflows).
Tensor cast(const Tensor& x, DType dtype);

}  // namespace normtape
