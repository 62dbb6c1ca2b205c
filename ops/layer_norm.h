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
// Throws, naming layer_norm: ShapeError for an empty or scalar x, weight/bias not of shape [N]
// (normalized_shape), or on CUDA N or M above INT32_MAX; DTypeError for a non-floating x or
// weight/bias of another dtype; DeviceError for weight/bias on another device; Error for an
// undefined x or eps <= 0 or not finite; AnomalyError for a non-finite y under anomaly
// detection (core/autograd.h).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  SavePolicy policy = SavePolicy::Input);

}  // namespace normtape
