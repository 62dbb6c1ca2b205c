// nn/optim/optimizer_checks.h: the checks AdamW and Muon share (internal): their hyperparameters'
// ranges, their parameter groups, and a step's gradient norm and parameters. Each throws Error
// (or the kind named) with the optimizer's name `op` first, and changes nothing.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/optim/adamw.h"

namespace normtape::detail {

// lr >= 0 and finite (a NaN fails every comparison, so is refused too).
void check_lr(const char* op, double lr);
// weight_decay >= 0 and finite; `where` names the group ("" for the options).
void check_weight_decay(const char* op, const std::string& where, double weight_decay);

// The groups an optimizer keeps: each group's weight_decay and lr_scale checked (>= 0, finite),
// each parameter defined, a leaf, contiguous, requiring grad and of at least `min_dim`
// dimensions; as torch.optim, a parameter in two groups is refused (naming both places) and one
// listed twice in a group kept once, at its first place, so that a step updates it once.
std::vector<ParamGroup> checked_groups(const char* op, const std::vector<ParamGroup>& groups, int64_t min_dim);

// A step_if_finite's norm: defined (Error), one element (ShapeError), floating (DTypeError).
void check_grad_norm(const char* op, const Tensor& grad_norm);

// Before a step, for parameter p (parameter `index` of group `group`) with a gradient whose state
// tensor `state` (of stat_dtype of the dtype p had) and master copy `master` (bf16 only) were made
// at construction: DTypeError, DeviceError or ShapeError when the gradient is not of p's dtype,
// device and shape or not contiguous; DeviceError when p or `grad_norm` (may be null) is elsewhere
// than the state, DTypeError when p's dtype changed.
void check_stepped(const char* op, size_t group, size_t index, const Tensor& p, const Tensor& state,
                   const Tensor& master, const Tensor* grad_norm);

}  // namespace normtape::detail
