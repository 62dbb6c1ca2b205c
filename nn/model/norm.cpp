// nn/model/norm.cpp: LayerNorm and RMSNorm modules.
#include "nn/model/norm.h"

#include "ops/norm/layer_norm.h"
#include "ops/norm/rms_norm.h"

namespace normtape {

namespace {
void check_size(const char* module, int64_t n, const NormOptions& o) {
    NT_CHECK_AS(ShapeError, n > 0, module, ": expected normalized_shape > 0, got ", n);
    NT_CHECK_AS(DTypeError, is_floating(o.dtype), module, ": expected a floating dtype, got ", dtype_name(o.dtype));
}

// The fused norm's options of a module's forward(x, residual).
FusedNormOptions prenorm_options(const NormOptions& o, const Tensor& residual) {
    FusedNormOptions f;
    f.residual = residual;
    f.prenorm = true;
    f.eps = o.eps;
    f.policy = o.policy;
    return f;
}
}  // namespace

LayerNorm::LayerNorm(int64_t normalized_shape, NormOptions opts) : NormModule(opts) {
    check_size("LayerNorm", normalized_shape, opts);
    TensorOptions t = TensorOptions().dtype(opts.dtype).device(opts.device);
    if (opts.elementwise_affine) {
        weight = register_parameter("weight", ones({normalized_shape}, t));
        if (opts.bias) bias = register_parameter("bias", zeros({normalized_shape}, t));
    }
}

Tensor LayerNorm::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    return layer_norm(x, weight, bias, options.eps, options.policy);
}

FusedNormOutputs LayerNorm::forward(const Tensor& x, const Tensor& residual) const {
    ModuleScope scope(*this);
    return layer_norm_fn(x, weight, bias, prenorm_options(options, residual));
}

RMSNorm::RMSNorm(int64_t normalized_shape, NormOptions opts) : NormModule(opts) {
    check_size("RMSNorm", normalized_shape, opts);
    if (opts.elementwise_affine) weight = register_parameter("weight", ones({normalized_shape}, TensorOptions().dtype(opts.dtype).device(opts.device)));
}

Tensor RMSNorm::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    return rms_norm(x, weight, options.eps, options.policy);
}

FusedNormOutputs RMSNorm::forward(const Tensor& x, const Tensor& residual) const {
    ModuleScope scope(*this);
    return rms_norm_fn(x, weight, prenorm_options(options, residual));
}

const char* norm_kind_name(NormKind kind) { return kind == NormKind::Layer ? "layer" : "rms"; }

int64_t set_save_policy(Module& model, SavePolicy policy) {
    int64_t n = 0;
    model.apply([&](Module& m) {
        if (auto* norm = dynamic_cast<NormModule*>(&m)) {
            norm->options.policy = policy;
            ++n;
        }
    });
    return n;
}

std::shared_ptr<NormModule> make_norm(NormKind kind, int64_t normalized_shape, NormOptions options) {
    if (kind == NormKind::Layer) return std::make_shared<LayerNorm>(normalized_shape, options);
    return std::make_shared<RMSNorm>(normalized_shape, options);
}

}  // namespace normtape
