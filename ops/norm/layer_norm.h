// ops/norm/layer_norm.h: layer_norm, the first of the two first-class ops.
#pragma once

#include "core/tensor.h"
#include "ops/norm/fused_norm.h"
#include "ops/norm/norm_policy.h"

namespace normtape {

// layer_norm: y = (x - mean) * rstd * weight + bias over the last dimension of x, with
// mean = sum(x) / N, rstd = 1 / sqrt(var + eps), var = sum((x - mean)^2) / N (biased).
// Ba et al. 2016, arXiv:1607.06450; matches torch.nn.functional.layer_norm(x, [N], weight, bias, eps).
// x: [..., N] f32, f64 or bf16, on the cpu or a CUDA device, M = numel / N rows; weight, bias:
// [N], same dtype and device as x, each may be undefined (no affine / no bias). Returns y: shape,
// dtype and device of x. The statistics mean and rstd [M] are f32 for f32 and bf16 x, f64 for
// f64 (the cpu sums in f64, CUDA in f32; y is rounded to x's dtype once).
// Saves rstd, weight, bias, and x + mean under SavePolicy::Input, y under SavePolicy::Output, or
// x_hat under SavePolicy::Normalized, where y = x_hat * weight + bias is computed from the rounded
// x_hat and carries a recipe (Note [SavePolicy::Normalized]); except that a forward under Output whose weight has an |element| < kOutputPolicyMinWeight saves
// as Input does and is counted by output_policy_fallbacks() (see Note [Why saving y saves memory]
// and Note [Weights near zero under SavePolicy::Output] in ops/norm/norm_policy.h). Backward returns
// dx (=) and dweight, dbias, which the engine adds into weight.grad and bias.grad (+=). On CUDA,
// dweight and dbias are summed in a fixed order: the same bits run to run on one GPU model.
// Throws, naming layer_norm: ShapeError for an empty or scalar x, weight/bias not of shape [N]
// (normalized_shape), or on CUDA N or M above INT32_MAX; DTypeError for a non-floating x or
// weight/bias of another dtype; DeviceError for weight/bias on another device; Error for an
// undefined x or eps <= 0 or not finite; AnomalyError for a non-finite y under anomaly
// detection (core/anomaly.h).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  SavePolicy policy = SavePolicy::Input);

// layer_norm_fn: layer_norm of s = dropout(x * options.rowscale) + dropout(options.x1) +
// options.residual (each term optional), returning s too with options.prenorm, and a second affine
// output y1 with options.weight1 (FlashAttention's layer_norm_fn with residual, prenorm,
// residual_in_fp32, dropout_p, rowscale, x1, weight1, bias1, zero_centered_weight and out_dtype;
// Note [The fused norm], ops/norm/fused_norm.h). x, weight, bias, eps and the policy as
// layer_norm's, the policy applying to s; residual: x's shape and device, of x's dtype or (for a
// bf16 x) f32, or undefined; x1: x's shape, dtype and device, or undefined; dropout_p in [0, 1),
// the same p for x and x1, their masks drawn in that order from the dropout stream as dropout()
// draws them; weight1, bias1 as weight and bias (bias1 only with weight1); zero_centered_weight:
// the norm multiplies by weight + 1 and weight1 + 1 (Gemma's), made by the add op in x's dtype and
// saved (N elements each); residual_in_fp32: for a bf16 x without an f32 residual, s and the norm
// in f32; out_dtype: y's and y1's dtype (x's when unset); rowscale: x's shape without its last
// dimension, dtype and device, a constant (it requires no gradient), not with x1.
// Returns y (layer_norm(s)), with prenorm residual_out = s (x.contiguous() when nothing is added,
// scaled, dropped or widened), with weight1 y1 = x_hat * weight1 + bias1 (y and y1 then both from
// x_hat rounded to s's dtype). Saves what layer_norm(s) saves under options.policy (with weight1,
// or y cast to out_dtype, Output saves as Normalized: x_hat and rstd), and nothing of x, x1 or
// residual (the dropouts save their stream's seed and offset, no mask); with an f32 stream, also
// the weights cast to f32 (N elements each); with rowscale, rowscale (M elements). Backward gives
// residual and dropout(x * rowscale) + dropout(x1) the same gradient, the norm's ds (from dy and
// dy1) plus residual_out's gradient (=), which dropout's, add's, cast's and rowscale's backward
// carry to x and x1; dweight, dbias, dweight1, dbias1 as layer_norm's (+= into .grad). The residual
// add runs in the norm's kernel (on CUDA where the fast kernels apply; elsewhere the add op's
// kernel first); the rowscale, the dropouts, the add of x1, the casts and with weight1 y1's affine
// as their own kernels.
// Throws as layer_norm, naming layer_norm_fn; ShapeError, DTypeError or DeviceError for a residual,
// x1 or rowscale unlike x, or a weight1 or bias1 not [N] of x's dtype and device; DTypeError for an
// i64 out_dtype; Error for dropout_p outside [0, 1), bias1 without weight1, zero_centered_weight
// without a weight, a rowscale that requires grad, or rowscale with x1.
FusedNormOutputs layer_norm_fn(const Tensor& x, const Tensor& weight, const Tensor& bias, const FusedNormOptions& options);

}  // namespace normtape
