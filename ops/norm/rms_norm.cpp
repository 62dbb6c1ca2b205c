// ops/norm/rms_norm.cpp: rms_norm; the kernels and node are shared with layer_norm
// (ops/norm/norm.cpp): RMSNorm is LayerNorm with mean fixed at 0 and no bias.
#include "ops/norm/rms_norm.h"

#include "ops/norm/norm.h"

namespace normtape {

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps, SavePolicy policy) {
    return detail::norm_forward("rms_norm", "RMSNormBackward", /*centered=*/false, x, weight, Tensor(), eps, policy);
}

FusedNormOutputs rms_norm_fn(const Tensor& x, const Tensor& weight, const FusedNormOptions& options) {
    return detail::fused_norm_forward("rms_norm_fn", "RMSNormBackward", /*centered=*/false, x, weight, Tensor(),
                                      options);
}

}  // namespace normtape
