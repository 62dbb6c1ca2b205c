// ops/norm/layer_norm.cpp: layer_norm; the kernels and node are shared with rms_norm
// (ops/norm/norm.cpp), which differs only in not centering.
#include "ops/norm/layer_norm.h"

#include "ops/norm/norm.h"

namespace normtape {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, SavePolicy policy) {
    return detail::norm_forward("layer_norm", "LayerNormBackward", /*centered=*/true, x, weight, bias, eps, policy);
}

FusedNormOutputs layer_norm_fn(const Tensor& x, const Tensor& weight, const Tensor& bias, const FusedNormOptions& options) {
    return detail::fused_norm_forward("layer_norm_fn", "LayerNormBackward", /*centered=*/true, x, weight, bias, options);
}

}  // namespace normtape
