// nn/optim/optimizer_checks.cpp: the checks AdamW and Muon share.
#include "nn/optim/optimizer_checks.h"

#include <cmath>
#include <unordered_map>
#include <utility>

namespace normtape::detail {

void check_lr(const char* op, double lr) {
    NT_CHECK(std::isfinite(lr) && lr >= 0, op, ": expected lr >= 0 and finite, got lr ", lr);
}

void check_weight_decay(const char* op, const std::string& where, double weight_decay) {
    NT_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, op, ": expected ", where,
             "weight_decay >= 0 and finite, got weight_decay ", weight_decay);
}

std::vector<ParamGroup> checked_groups(const char* op, const std::vector<ParamGroup>& groups, int64_t min_dim) {
    for (size_t gi = 0; gi < groups.size(); ++gi) {
        check_weight_decay(op, "group " + std::to_string(gi) + "'s ", groups[gi].weight_decay);
        NT_CHECK(std::isfinite(groups[gi].lr_scale) && groups[gi].lr_scale >= 0, op, ": expected group ", gi,
                 "'s lr_scale >= 0 and finite, got lr_scale ", groups[gi].lr_scale);
    }
    std::vector<ParamGroup> kept;
    // Where each parameter was first seen: (group, index in the caller's list).
    std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> first;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
        kept.push_back({{}, groups[gi].weight_decay, groups[gi].lr_scale});
        for (size_t i = 0; i < groups[gi].params.size(); ++i) {
            const Tensor& p = groups[gi].params[i];
            NT_CHECK(p.defined() && p.requires_grad() && p.is_leaf() && p.is_contiguous(), op,
                     ": expected contiguous leaf parameters that require grad, got ",
                     !p.defined()          ? "an undefined tensor"
                     : !p.requires_grad()  ? "one that does not require grad"
                     : !p.is_leaf()        ? "a non-leaf"
                                           : "a non-contiguous one");
            NT_CHECK(p.dim() >= min_dim, op, ": expected parameters of at least ", min_dim, " dimensions",
                     min_dim >= 2 ? " (matrices: vectors and scalars belong to AdamW)" : "", ", got parameter ", i,
                     " of group ", gi, " of shape ", shape_str(p.shape()));
            auto [seen, inserted] = first.try_emplace(&p.impl(), gi, i);
            if (!inserted) {
                NT_CHECK(seen->second.first == gi, op, ": expected each parameter in one group only, got parameter ", i,
                         " of group ", gi, " that is also parameter ", seen->second.second, " of group ",
                         seen->second.first, " (some parameters appear in more than one parameter group)");
                continue;
            }
            kept.back().params.push_back(p);
        }
    }
    return kept;
}

void check_grad_norm(const char* op, const Tensor& grad_norm) {
    NT_CHECK(grad_norm.defined(), op, "::step_if_finite: expected a gradient norm, got an undefined tensor");
    NT_CHECK_AS(ShapeError, grad_norm.numel() == 1, op, "::step_if_finite: expected a one-element norm, got shape ",
                shape_str(grad_norm.shape()));
    NT_CHECK_AS(DTypeError, is_floating(grad_norm.dtype()), op, "::step_if_finite: expected a floating norm, got ",
                dtype_name(grad_norm.dtype()));
}

void check_stepped(const char* op, size_t group, size_t index, const Tensor& p, const Tensor& state,
                   const Tensor& master, const Tensor* grad_norm) {
    // The gradient can be set directly (p.impl().grad, as data parallelism does): the step reads it
    // with p's element type and size, so anything else would be read past its end.
    const Tensor g = p.grad();
    NT_CHECK_AS(DTypeError, g.dtype() == p.dtype(), op, ": parameter ", index, " of group ", group,
                ": expected a gradient of the parameter's dtype ", dtype_name(p.dtype()), ", got ",
                dtype_name(g.dtype()));
    NT_CHECK_AS(DeviceError, g.device() == p.device(), op, ": parameter ", index, " of group ", group,
                ": expected a gradient on the parameter's device ", device_name(p.device()), ", got ",
                device_name(g.device()));
    NT_CHECK_AS(ShapeError, g.shape() == p.shape() && g.is_contiguous(), op, ": parameter ", index, " of group ", group,
                ": expected a contiguous gradient of the parameter's shape ", shape_str(p.shape()), ", got ",
                shape_str(g.shape()), g.is_contiguous() ? "" : " (not contiguous)");
    NT_CHECK_AS(DeviceError, state.device() == p.device(), op, ": expected the parameter on ",
                device_name(state.device()), " (where its state is), got ", device_name(p.device()),
                ": it moved after the optimizer was built; build the optimizer after Module::to");
    NT_CHECK_AS(DTypeError, state.dtype() == stat_dtype(p.dtype()) && (p.dtype() == DType::BF16) == master.defined(),
                op, ": expected a parameter of the dtype it had when the optimizer was built (state ",
                dtype_name(state.dtype()), "), got ", dtype_name(p.dtype()), "; build the optimizer after Module::to");
    NT_CHECK_AS(DeviceError, !grad_norm || grad_norm->device() == p.device(), op,
                "::step_if_finite: expected the norm on ", device_name(p.device()), " (where the parameters are), got ",
                device_name(grad_norm->device()));
}

}  // namespace normtape::detail
