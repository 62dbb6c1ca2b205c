// ops/layer_norm.h: layer_norm, the first of the two first-class ops.
#pragma once

#include "core/tensor.h"
#include "ops/norm_policy.h"

namespace normtape {

// layer_norm: y = (x - mean) * rstd * weight + bias over the last dimension of x, with
// mean = sum(x) / N, rstd = 1 / sqrt(var + eps), var = sum((x - mean)^2) / N (biased).
// Ba et al. 2016, arXiv:1607.06450; matches torch.nn.functional.layer_norm(x, [N], weight, bias, eps).
// x: [..., N] f32 or f64, cpu, M = numel / N rows; weight, bias: [N], same dtype and device as x,
// each may be undefined (no affine / no bias). Returns y: shape of x. Statistics are kept in the
// dtype of x (f32 for f32, f64 for f64).
// Saves rstd [M], weight, bias, and x + mean [M] under SavePolicy::Input or y under
// SavePolicy::Output (see Note [Why saving y saves memory] and Note [Weights near zero under
// SavePolicy::Output] in ops/norm_policy.h). Backward returns dx (=) and dweight, dbias, which the
// engine adds into weight.grad and bias.grad (+=).
// Throws Error naming layer_norm on: undefined or empty x, a non-floating dtype, a scalar x,
// weight/bias not of shape [N] or of another dtype or device, eps <= 0 or not finite.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  SavePolicy policy = SavePolicy::Input);

}  // namespace normtape
