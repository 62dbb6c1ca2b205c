// nn/model/norm.h: the LayerNorm and RMSNorm modules over ops/norm/layer_norm.h and ops/norm/rms_norm.h.
#pragma once

#include <memory>

#include "nn/model/module.h"
#include "ops/norm/fused_norm.h"
#include "ops/norm/norm_policy.h"

namespace normtape {

// Options of both norm modules, as PyTorch's nn.LayerNorm / nn.RMSNorm constructors, plus the
// save policy. `bias` is ignored by RMSNorm.
struct NormOptions {
    double eps = 1e-5;
    bool elementwise_affine = true;  // learnable weight (ones) and, for LayerNorm, bias (zeros)
    bool bias = true;
    SavePolicy policy = SavePolicy::Input;
    DType dtype = DType::F32;
    Device device = Device::CPU;
};

// The interface Block uses so that it can hold either norm.
class NormModule : public Module {
public:
    explicit NormModule(NormOptions o) : options(o) {}
    // x: [..., normalized_shape] -> same shape; with affine parameters x must have their dtype
    // (options.dtype) and device (options.device), without them any floating dtype and device.
    // What is saved, how gradients are written and what is thrown: ops/norm/layer_norm.h,
    // ops/norm/rms_norm.h (eps is checked there, at the first forward).
    virtual Tensor forward(const Tensor& x) const = 0;
    // The norm of s = x + residual, returning y and s (residual_out), as layer_norm_fn and
    // rms_norm_fn with prenorm (Note [The fused norm], ops/norm/fused_norm.h): x and residual of one
    // shape, dtype and device; the policy saves s under Input, never x or residual. Throws as they do.
    virtual FusedNormOutputs forward(const Tensor& x, const Tensor& residual) const = 0;

    NormOptions options;  // policy may be changed between forwards
};

// LayerNorm(normalized_shape): y = layer_norm(x, weight, bias, eps, policy) over the last dim.
class LayerNorm : public NormModule {
public:
    explicit LayerNorm(int64_t normalized_shape, NormOptions options = {});
    Tensor forward(const Tensor& x) const override;
    FusedNormOutputs forward(const Tensor& x, const Tensor& residual) const override;

    Tensor weight, bias;  // [normalized_shape] or undefined
};

// RMSNorm(normalized_shape): y = rms_norm(x, weight, eps, policy) over the last dim.
class RMSNorm : public NormModule {
public:
    explicit RMSNorm(int64_t normalized_shape, NormOptions options = {});
    Tensor forward(const Tensor& x) const override;
    FusedNormOutputs forward(const Tensor& x, const Tensor& residual) const override;

    Tensor weight;  // [normalized_shape] or undefined
};

// Sets the save policy of every LayerNorm and RMSNorm in `model` (itself included, found by
// Module::apply), from their next forward on; no parameter changes. Returns how many norms it set.
// Graphs already recorded keep what they saved. Never throws.
int64_t set_save_policy(Module& model, SavePolicy policy);

enum class NormKind { Layer, RMS };
// "layer" or "rms".
const char* norm_kind_name(NormKind kind);
// A LayerNorm or an RMSNorm. The constructors (and this) throw ShapeError if normalized_shape <= 0,
// DTypeError for a non-floating options.dtype; with elementwise_affine, DeviceError for a device
// this build or machine lacks and OutOfMemoryError when the parameters cannot be allocated.
std::shared_ptr<NormModule> make_norm(NormKind kind, int64_t normalized_shape, NormOptions options);

}  // namespace normtape
