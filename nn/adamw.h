// nn/adamw.h: the AdamW optimizer and gradient-norm clipping.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace normtape {

struct AdamWOptions {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;  // default for groups that do not set their own
};

// A set of parameters sharing a weight decay (e.g. no decay for biases and norm weights).
struct ParamGroup {
    std::vector<Tensor> params;
    double weight_decay;
};

// AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101; as torch.optim.AdamW): for each parameter p
// with gradient g, at step t (from 1):
//   p -= lr * weight_decay * p                         (decoupled weight decay)
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Moments m, v are kept in f64 for f64 parameters and f32 otherwise, on the parameter's device;
// a bf16 parameter also gets an f32 master copy, which is what is updated (the parameter is its
// rounding). Parameters whose grad() is undefined are skipped. Updates are in place (the
// storage version is bumped, so a graph that saved an old parameter refuses to run backward).
// The formula lives once, in nn/adamw_update.h, for the cpu loop and the CUDA kernel.
class AdamW {
public:
    // The state of one parameter: moments m (torch's "exp_avg") and v ("exp_avg_sq") in
    // stat_dtype(p.dtype()) on p's device, and the f32 master copy of a bf16 parameter (else
    // undefined).
    struct ParamState {
        Tensor m, v;
        Tensor master;
    };

    // Throw Error for lr < 0, eps <= 0 or betas outside [0, 1), or a parameter that is undefined,
    // not a leaf, not contiguous or does not require grad; OutOfMemoryError or DeviceError when
    // the state cannot be allocated on a parameter's device.
    AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
    AdamW(const std::vector<Tensor>& params, AdamWOptions options);

    // Throws DeviceError / DTypeError when a parameter changed device / dtype since construction;
    // every parameter is checked first, so a step that throws changes nothing.
    void step();
    // Drops every parameter's gradient.
    void zero_grad();
    // Throws Error for lr < 0 or not finite, as the constructor does.
    void set_lr(double lr);
    double lr() const { return options_.lr; }
    int64_t step_count() const { return t_; }
    const AdamWOptions& options() const { return options_; }
    const std::vector<ParamGroup>& groups() const { return groups_; }

    // For checkpoints (nn/checkpoint.h): the state of parameter `p`, matched by identity (the same
    // tensor handle's TensorImpl, not an equal copy). The tensors returned are the optimizer's own:
    // copy_ into them to restore a state. Throws Error if p is not one of this optimizer's.
    const ParamState& state(const Tensor& p) const;
    // Sets the number of steps taken (the t of the bias corrections), to resume. Throws Error if
    // t < 0.
    void set_step_count(int64_t t);

private:
    std::vector<ParamGroup> groups_;
    std::vector<std::vector<ParamState>> state_;  // per group, per parameter
    AdamWOptions options_;
    int64_t t_ = 0;
};

// Scales the gradients of `params` in place so that their global L2 norm is at most max_norm,
// as torch.nn.utils.clip_grad_norm_. Returns the norm before clipping. Throws Error if max_norm
// is not positive.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace normtape
