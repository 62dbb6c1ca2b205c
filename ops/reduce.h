// ops/reduce.h: sum and mean over all elements. Input f32 or f64 on the cpu, non-empty; output a
// 0-dim tensor of the input's dtype. Save nothing (backward needs only the input's shape); the
// gradient is written (=) and added by the engine into leaves (+=).
// Throw Error naming the op on an undefined, empty or non-floating input.
#pragma once

#include "core/tensor.h"

namespace normtape {

// sum(x) = sum of all elements (accumulated in double). dx = g everywhere.
Tensor sum(const Tensor& x);

// mean(x) = sum(x) / numel(x). dx = g / numel everywhere.
Tensor mean(const Tensor& x);

}  // namespace normtape
