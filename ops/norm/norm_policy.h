// ops/norm/norm_policy.h: what LayerNorm and RMSNorm save for backward (SavePolicy), the rule for
// weights near zero, and x_hat_from_saved(), the one function where the policy matters. Public.
// Not here: the ops, layer_norm() (ops/norm/layer_norm.h) and rms_norm() (ops/norm/rms_norm.h); the forward,
// node and kernels they share (ops/norm/norm.h, ops/norm/norm.cpp, ops/norm_*.cu).
//
// Note [Why saving y saves memory]
// Every policy saves rstd ([M] statistics), weight and bias. SavePolicy::Input also saves x and
// (LayerNorm) mean; SavePolicy::Output saves y instead and recomputes
//     x_hat = (y - bias) / weight        (RMSNorm: y / weight)
// in backward (NVIDIA Apex PR 1715, memory_efficient=True). Saving y costs nothing extra when
// the consumer of y saves it anyway, as the Linear after every norm of a pre-LN transformer does
// (saved tensors share storage, core/autograd.h). With nothing else holding x (the residual),
// x is freed after the forward: per norm, Output saves numel(x) elements (+ M f32 means for
// LayerNorm) fewer than Input.
//
// Note [SavePolicy::Normalized]
// Output's division is where it loses accuracy (next Note). SavePolicy::Normalized saves x_hat
// itself (x's dtype) and computes y from that rounded x_hat, y = x_hat * weight + bias
// (detail::norm_affine, ops/norm/norm.h), so that y can be made again bit for bit: y carries a recipe
// (core/autograd.h, Note [Rematerialization]) and the Linear that saves y keeps the recipe, which
// keeps x_hat alive, not y. The saved bytes equal Output's (x_hat is y's size); the gradients
// are Input's to rounding, at any weight, 0 included, with no fallback and no host read of the
// weight. The cost: the forward writes x_hat beside y (on the GPU in the same kernel, one more
// write of the row), and the backward of the Linear makes y again (a pass over the row). A forward
// that records nothing (NoGradGuard) computes y as Input does and writes no x_hat.
//
// Note [Weights near zero under SavePolicy::Output]
// x_hat cannot be recovered from y where weight_j == 0 (y_j == bias_j whatever x was), and the
// division amplifies the rounding of y by |bias_j / weight_j| where weight_j is tiny. Apex clamps
// |weight| to at least eps and so returns wrong gradients for such columns. Our rule keeps the
// gradients right: the forward checks the weight, and if any |weight_j| < kOutputPolicyMinWeight
// (1e-3) it saves x and mean exactly as SavePolicy::Input would, for that call only; the result is
// counted by output_policy_fallbacks(). At |weight_j| >= 1e-3 the absolute error of the recovered
// x_hat is at most about u * (|x_hat| + 2 * 1e3 * |bias_j|), u the unit roundoff of the dtype
// (6e-8 for f32). Negative weights are divided by as they are. Tests: tests/test_layer_norm.cpp,
// tests/test_rms_norm.cpp, "weights near zero".
#pragma once

#include <cstdint>

#include "core/bf16.h"

namespace normtape {

// What a norm saves for backward: its input (textbook), its output (memory-efficient, Apex's), or
// its normalized input x_hat with y made again where it is saved (memory-efficient and exact).
enum class SavePolicy { Input, Output, Normalized };

// "input", "output" or "normalized", as the CLI and JSON spell them.
const char* policy_name(SavePolicy policy);

// Note [Weights near zero under SavePolicy::Output].
constexpr double kOutputPolicyMinWeight = 1e-3;

// How many norm forwards under SavePolicy::Output saved their input instead because a weight was
// below kOutputPolicyMinWeight in magnitude, since the process started.
int64_t output_policy_fallbacks();

// x_hat of element j of a row, from what the policy saved: Input passes (x_j, mean, rstd),
// Output passes (y_j) and the affine parameters (nullptr when absent), Normalized passes x_hat_j.
// For RMSNorm mean is 0. T is the data type, S the statistics type (f32, or f64 for f64 data);
// the result is in S.
template <class T, class S>
NT_HOST_DEVICE inline S x_hat_from_saved(SavePolicy policy, T saved, S mean, S rstd, const T* weight, const T* bias, int64_t j) {
    if (policy == SavePolicy::Input) return (S(saved) - mean) * rstd;
    if (policy == SavePolicy::Normalized) return S(saved);
    S shifted = bias ? S(saved) - S(bias[j]) : S(saved);
    return weight ? shifted / S(weight[j]) : shifted;
}

}  // namespace normtape
