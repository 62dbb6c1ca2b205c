// ops/reduce.h: sum and mean over all elements. Input f32, f64 or bf16 on the cpu or a CUDA
// device, non-empty; output a 0-dim tensor of the input's dtype and device. Save nothing
// (backward needs only the input's shape); the gradient is written (=) and added by the engine
// into leaves (+=).
// Throw, naming the op: Error on an undefined input, ShapeError on an empty one, DTypeError on a
// non-floating one, AnomalyError on a non-finite result under anomaly detection (e.g. a sum that
// overflows; core/autograd.h).
#pragma once

#include "core/tensor.h"

namespace normtape {

// sum(x) = sum of all elements (accumulated in double on the cpu; on CUDA in f32, f64 for f64,
// in a fixed order). dx = g everywhere.
Tensor sum(const Tensor& x);

// mean(x) = sum(x) / numel(x). dx = g / numel everywhere.
Tensor mean(const Tensor& x);

}  // namespace normtape
