// ops/norm/norm.h: the forward that layer_norm (ops/norm/layer_norm.cpp) and rms_norm
// (ops/norm/rms_norm.cpp), and their fused forms, share: RMSNorm is LayerNorm with the mean fixed
// at 0 and no bias. Internal: not installed, not included by include/normtape.h. Not here: the
// public contracts (ops/norm/layer_norm.h, ops/norm/rms_norm.h, ops/norm/fused_norm.h), the policy
// (ops/norm/norm_policy.h), the CUDA kernels (ops/norm/norm_*.cu).
#pragma once

#include "core/tensor.h"
#include "ops/norm/fused_norm.h"
#include "ops/norm/norm_policy.h"

namespace normtape::detail {

// The norm both public ops call: checks the arguments, computes y (and mean, rstd) on x's device,
// records a NormBackward node that saves what `policy` asks (ops/norm/norm.cpp), and returns y.
// `centered` is true for LayerNorm, false for RMSNorm; `op` names the op in messages, `node_name`
// the node ("LayerNormBackward"). Contracts and what is thrown: ops/norm/layer_norm.h, ops/norm/rms_norm.h.
Tensor norm_forward(const char* op, const char* node_name, bool centered, const Tensor& x, const Tensor& weight,
                    const Tensor& bias, double eps, SavePolicy policy);

// The fused form both *_norm_fn call (Note [The fused norm], ops/norm/fused_norm.h): the norm of
// s = x + options.residual, with s as the node's second output under options.prenorm.
FusedNormOutputs fused_norm_forward(const char* op, const char* node_name, bool centered, const Tensor& x,
                                    const Tensor& weight, const Tensor& bias, const FusedNormOptions& options);

// y = x_hat * weight + bias, rows of x_hat [.., N] (weight, bias [N] or undefined), arithmetic in
// acc_t rounded once: how SavePolicy::Normalized makes y in the forward and again from its recipe
// (Note [SavePolicy::Normalized], ops/norm/norm_policy.h), so the two agree bit for bit. Records nothing.
Tensor norm_affine(const Tensor& x_hat, const Tensor& weight, const Tensor& bias);

}  // namespace normtape::detail
