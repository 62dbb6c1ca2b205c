// ops/softmax.h: softmax over the last dimension, the op behind attention's probabilities and a
// classifier's output. Not here: cross_entropy (ops/cross_entropy.h), whose log-sum-exp never
// writes the probabilities out, and the online softmax inside causal_self_attention (ops/attention.h).
#pragma once

#include "core/tensor.h"

namespace normtape {

// softmax(x) along the last dimension, row by row: with m = max_j x[..., j],
//   y[..., i] = exp(x[..., i] - m) / sum_j exp(x[..., j] - m),
// so that no exponential overflows (a row of 1000 and 1001 gives 0.269, 0.731). Matches
// torch.nn.functional.softmax(x, dim=-1) (PyTorch docs, torch.nn.Softmax).
// x: [..., N], N >= 1, non-empty, f32, f64 or bf16, on the cpu or a CUDA device, any strides (a
// non-contiguous x is read through a contiguous copy). y: a new contiguous tensor of x's shape,
// dtype and device. Max, exponentials and sum in acc_t (f32 for f32 and bf16, f64 for f64), y
// rounded once when stored. A row holding NaN or +inf, or only -inf, gives NaN throughout, as
// PyTorch's. Deterministic: each row is reduced by one thread (cpu) or one block (CUDA) in a fixed
// order, whatever the thread count.
// Saves y (as PyTorch's softmax does, not x): backward reads nothing else. dx = y * (g - sum_j(g * y))
// along the last dimension (PyTorch tools/autograd/derivatives.yaml, _softmax_backward_data), in
// acc_t, returned fresh (=); the engine adds it into leaves (+=). y modified in place before the
// backward makes the backward throw (core/autograd.h, SavedTensor::unpack).
// Throws, naming softmax: Error on an undefined x; DTypeError on a non-floating x (or bf16 on a
// GPU before compute capability 8.0); ShapeError on a 0-dim x or an empty one; AnomalyError on a
// non-finite y under anomaly detection (core/anomaly.h).
Tensor softmax(const Tensor& x);

}  // namespace normtape
