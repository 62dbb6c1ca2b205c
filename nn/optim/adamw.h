// nn/optim/adamw.h: the AdamW optimizer and gradient-norm clipping.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace normtape {

namespace detail {
struct AdamWPlan;    // nn/optim/adamw.cpp: the cached device tables of the multi-tensor CUDA step
class StepScalars;  // nn/optim/step_scalars.h: the lr and step count on each device
}  // namespace detail

// Every value must be finite: lr >= 0, beta1 and beta2 in [0, 1), eps > 0, weight_decay >= 0
// (AdamW's constructor checks them, set_lr the lr).
struct AdamWOptions {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;  // default for groups that do not set their own
};

// A set of parameters sharing a weight decay (e.g. no decay for biases and norm weights) and a
// learning rate: the optimizer's lr times lr_scale (a schedule sets the one lr, each group keeps
// its ratio: nanochat's embeddings and head). Both finite and >= 0, checked by the optimizer.
struct ParamGroup {
    std::vector<Tensor> params;
    double weight_decay;
    double lr_scale = 1.0;
};

// AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101; as torch.optim.AdamW): for each parameter p
// with gradient g, at step t (from 1), in a group of learning rate lr = lr() * lr_scale:
//   p -= lr * weight_decay * p                         (decoupled weight decay)
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Moments m, v are kept in f64 for f64 parameters and f32 otherwise, on the parameter's device;
// a bf16 parameter also gets an f32 master copy, which is what is updated (the parameter is its
// rounding). Parameters whose grad() is undefined are skipped. Updates are in place (the
// storage version is bumped, so a graph that saved an old parameter refuses to run backward).
// The formula lives once, in nn/optim/adamw_update.h, for the cpu loop and the CUDA kernel.
// On CUDA, one step is one kernel launch per (device, dtype) of the parameters (more only past
// 400 parameters of one kind), over a table of their state that the optimizer builds on the first
// step and rebuilds when a parameter's or state's storage changes or another set of parameters has
// a gradient (that rebuild copies the table to the GPU and waits for it); otherwise a step never
// waits for the GPU. See Note [Multi-tensor AdamW and the gradient norm] in nn/optim/adamw.cu.
// The kernels read the lr and the bias corrections from device memory: set_lr writes the lr there,
// and a step first advances the count there and computes 1 - beta^t from it (pow in f64, on the
// GPU), so that a step captured in a CUDA graph (core/cuda_graph.h) replays with the current ones.
// A copy of an AdamW shares the original's state tensors and device scalars (tensors are handles).
class AdamW {
public:
    // The state of one parameter: moments m (torch's "exp_avg") and v ("exp_avg_sq") in
    // stat_dtype(p.dtype()) on p's device, and the f32 master copy of a bf16 parameter (else
    // undefined).
    struct ParamState {
        Tensor m, v;
        Tensor master;
    };

    // Throw Error naming AdamW, the option, the range and the value for an option or a group's
    // weight_decay or lr_scale that is not finite or out of range (torch.optim.AdamW's: lr >= 0, betas in
    // [0, 1), weight_decay >= 0; and eps > 0, where torch allows 0), or a parameter that is undefined,
    // not a leaf, not contiguous or does not require grad, or one that appears in two groups (as
    // torch.optim, naming both places); OutOfMemoryError or DeviceError when the state cannot be
    // allocated on a parameter's device. A parameter listed twice in one group is kept once, at
    // its first place (groups() shows the lists kept), so that a step updates it once.
    AdamW(std::vector<ParamGroup> groups, AdamWOptions options);
    AdamW(const std::vector<Tensor>& params, AdamWOptions options);

    // Throws DeviceError / DTypeError when a parameter changed device / dtype since construction,
    // DTypeError, DeviceError or ShapeError naming the parameter (its index and group) when its
    // gradient (which can be set directly) is not of its dtype, device and shape or not contiguous;
    // every parameter is checked first, so a step that throws changes nothing.
    void step();
    // As step(), except that no parameter, master copy or moment changes when `grad_norm` is NaN or
    // infinite. grad_norm: one element (any shape), floating dtype, on the device of every
    // parameter that has a gradient, e.g. what clip_grad_norm_tensor_ returned. On CUDA the kernel
    // reads the value, so nothing waits for the GPU; on the cpu it is read directly. The step count
    // (and so the bias correction of later steps) advances whether or not the update was skipped,
    // since the host does not know; a loop that learns of the skip later and wants the count to
    // exclude it calls set_step_count(step_count() - 1). Storage versions are bumped either way.
    // Throws as step(), and ShapeError if grad_norm has more than one element, DTypeError if it
    // is not floating, DeviceError if it is on another device than a parameter with a gradient,
    // Error if it is undefined; nothing changes when it throws.
    void step_if_finite(const Tensor& grad_norm);
    // Drops every parameter's gradient.
    void zero_grad();
    // Throws Error for lr < 0 or not finite, by the constructor's rule; the lr is then unchanged.
    void set_lr(double lr);
    double lr() const { return options_.lr; }
    // The steps taken: on CUDA the device's count, which a step replayed from a CUDA graph
    // (core/cuda_graph.h) advances (reading it waits for the GPU); else the host's.
    int64_t step_count() const;
    const AdamWOptions& options() const { return options_; }
    const std::vector<ParamGroup>& groups() const { return groups_; }

    // For checkpoints (nn/formats/checkpoint.h): the state of parameter `p`, matched by identity (the same
    // tensor handle's TensorImpl, not an equal copy). The tensors returned are the optimizer's own:
    // copy_ into them to restore a state. Throws Error if p is not one of this optimizer's.
    const ParamState& state(const Tensor& p) const;
    // Every parameter's state in order: states()[g][i] is groups()[g].params[i]'s.
    const std::vector<std::vector<ParamState>>& states() const { return state_; }
    // Sets the number of steps taken (the t of the bias corrections), to resume. Throws Error if
    // t < 0.
    void set_step_count(int64_t t);

private:
    void step_impl(const Tensor* grad_norm);

    std::vector<ParamGroup> groups_;
    std::vector<std::vector<ParamState>> state_;  // per group, per parameter
    AdamWOptions options_;
    int64_t t_ = 0;
    std::shared_ptr<const detail::AdamWPlan> plan_;  // replaced, never modified, when rebuilt
    std::shared_ptr<detail::StepScalars> scalars_;    // the lr and t that the CUDA kernels read
};

// Scales the gradients of `params` in place so that their global L2 norm is at most max_norm,
// as torch.nn.utils.clip_grad_norm_ (norm_type 2): norm = sqrt(sum over every element g of every
// defined grad() of g^2), accumulated in double; where norm > max_norm, every gradient is
// multiplied by max_norm / (norm + 1e-6), rounded as Tensor::mul_ rounds (in acc_t of its dtype);
// a NaN norm scales nothing, an infinite one scales by 0. Parameters without a gradient are
// skipped. Returns the norm before clipping, on the host: for CUDA gradients this waits for the
// GPU (it is clip_grad_norm_tensor_(params, max_norm).item<double>()). Throws Error if max_norm is
// not positive or a gradient is not contiguous, DTypeError for a non-floating gradient,
// DeviceError if the gradients are not all on one device; nothing changes when it throws.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// clip_grad_norm_ without waiting for the GPU: the same clipping, and the norm before clipping
// returned as a 0-dim f64 tensor on the gradients' device (with no gradient at all: params[0]'s
// device, or the cpu for an empty list). On CUDA the norm and the clip coefficient are computed
// and applied on the GPU, queued on its stream: one launch per gradient dtype for the sums of
// squares, one to add them in a fixed order (deterministic, no atomics), one per dtype to scale;
// every gradient's storage version is bumped, scaled or not. Read the norm when the value is needed
// (item<double>(), e.g. at log time) or pass it to AdamW::step_if_finite. Its value is bit for bit
// what clip_grad_norm_ returns for the same gradients. Throws as clip_grad_norm_.
Tensor clip_grad_norm_tensor_(const std::vector<Tensor>& params, double max_norm);

}  // namespace normtape
