// ops/norm/rms_norm.h: rms_norm, the second of the two first-class ops.
#pragma once

#include "core/tensor.h"
#include "ops/norm/fused_norm.h"
#include "ops/norm/norm_policy.h"

namespace normtape {

// rms_norm: y = x * rstd * weight over the last dimension of x, rstd = 1 / sqrt(sum(x^2) / N + eps).
// Zhang & Sennrich 2019, arXiv:1910.07467; matches torch.nn.functional.rms_norm(x, [N], weight, eps).
// x: [..., N] f32, f64 or bf16, on the cpu or a CUDA device, M = numel / N rows; weight: [N], same
// dtype and device as x, or undefined (no affine). Returns y: shape, dtype and device of x. rstd
// [M] is f32 for f32 and bf16 x, f64 for f64 (the cpu sums in f64, CUDA in f32; y is
// rounded to x's dtype once).
// Saves rstd, weight, and x under SavePolicy::Input, y under SavePolicy::Output (backward then
// uses x_hat = y / weight), or x_hat under SavePolicy::Normalized (y = x_hat * weight, with a
// recipe: Note [SavePolicy::Normalized]), except that a forward under Output whose weight has an |element| <
// kOutputPolicyMinWeight saves x and is counted by output_policy_fallbacks() (see the notes in
// ops/norm/norm_policy.h). Backward returns dx (=) and dweight, which the engine adds into weight.grad
// (+=). On CUDA, dweight is summed in a fixed order: the same bits run to run on one GPU model.
// Throws, naming rms_norm: ShapeError for an empty or scalar x, weight not of shape [N]
// (normalized_shape), or on CUDA N or M above INT32_MAX; DTypeError for a non-floating x or a
// weight of another dtype; DeviceError for a weight on another device; Error for an undefined x
// or eps <= 0 or not finite; AnomalyError for a non-finite y under anomaly detection.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-5, SavePolicy policy = SavePolicy::Input);

// rms_norm_fn: rms_norm of s = dropout(x * rowscale) + dropout(x1) + residual (options), returning s too
// with options.prenorm, and y1 = x_hat * weight1 with options.weight1 (Liger's FusedAddRMSNorm;
// FlashAttention's rms_norm_fn with residual, prenorm, dropout_p, x1 and weight1; Note [The fused
// norm], ops/norm/fused_norm.h). Contracts as layer_norm_fn's (ops/norm/layer_norm.h), with
// rms_norm's in place of layer_norm's; throws naming rms_norm_fn, and Error for a bias1.
FusedNormOutputs rms_norm_fn(const Tensor& x, const Tensor& weight, const FusedNormOptions& options);

}  // namespace normtape
