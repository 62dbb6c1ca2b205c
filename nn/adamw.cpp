// nn/adamw.cpp: AdamW and clip_grad_norm_.
#include "nn/adamw.h"

#include <cmath>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "nn/adamw_update.h"

namespace normtape {

namespace detail {
// nn/adamw.cu
template <class T>
void adamw_step_cuda(T* p, acc_t<T>* master, const T* g, acc_t<T>* m, acc_t<T>* v, int64_t n, const AdamWStep& s,
                     int device);
template <class T>
double sum_squares_cuda(const T* x, int64_t n, int device);
}  // namespace detail

namespace {
using detail::device_ptr;
}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : groups_(std::move(groups)), options_(options) {
    NT_CHECK(options.lr >= 0 && options.eps > 0 && options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                 options.beta2 < 1,
             "AdamW: expected lr >= 0, eps > 0 and betas in [0, 1), got lr ", options.lr, ", eps ", options.eps,
             ", betas (", options.beta1, ", ", options.beta2, ")");
    for (const ParamGroup& g : groups_) {
        state_.emplace_back();
        for (const Tensor& p : g.params) {
            NT_CHECK(p.defined() && p.requires_grad() && p.is_leaf() && p.is_contiguous(),
                     "AdamW: expected contiguous leaf parameters that require grad, got ",
                     !p.defined()          ? "an undefined tensor"
                     : !p.requires_grad()  ? "one that does not require grad"
                     : !p.is_leaf()        ? "a non-leaf"
                                           : "a non-contiguous one");
            TensorOptions opts = TensorOptions().dtype(stat_dtype(p.dtype())).device(p.device());
            ParamState st{zeros(p.shape(), opts), zeros(p.shape(), opts), Tensor()};
            if (p.dtype() == DType::BF16) st.master = p.detach().to(DType::F32);
            state_.back().push_back(st);
        }
    }
}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{params, options.weight_decay}}, options) {}

void AdamW::set_lr(double lr) {
    NT_CHECK(lr >= 0 && std::isfinite(lr), "AdamW::set_lr: expected a finite lr >= 0, got ", lr);
    options_.lr = lr;
}

void AdamW::step() {
    NoGradGuard no_grad;
    // Every parameter is checked before any is updated, so a failed step changes nothing.
    for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            const Tensor& p = groups_[gi].params[i];
            if (!p.grad().defined()) continue;
            const ParamState& st = state_[gi][i];
            NT_CHECK_AS(DeviceError, st.m.device() == p.device(), "AdamW: expected the parameter on ",
                        device_name(st.m.device()), " (where its state is), got ", device_name(p.device()),
                        ": it moved after the optimizer was built; build the optimizer after Module::to");
            NT_CHECK_AS(DTypeError,
                        st.m.dtype() == stat_dtype(p.dtype()) && (p.dtype() == DType::BF16) == st.master.defined(),
                        "AdamW: expected a parameter of the dtype it had when the optimizer was built (state ",
                        dtype_name(st.m.dtype()), "), got ", dtype_name(p.dtype()),
                        "; build the optimizer after Module::to");
        }
    ++t_;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
        detail::AdamWStep s{options_.lr, options_.beta1, options_.beta2, options_.eps, groups_[gi].weight_decay,
                            1.0 - std::pow(options_.beta1, static_cast<double>(t_)),
                            1.0 - std::pow(options_.beta2, static_cast<double>(t_))};
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            Tensor p = groups_[gi].params[i];
            Tensor g = p.grad();
            if (!g.defined()) continue;
            ParamState& st = state_[gi][i];
            dispatch_floating(p.dtype(), "AdamW", [&](auto tag) {
                using T = decltype(tag);
                using A = acc_t<T>;
                if (p.device().is_cuda()) {
                    NT_CUDA(detail::adamw_step_cuda<T>(device_ptr<T>(p), device_ptr<A>(st.master), device_ptr<T>(g),
                                                       device_ptr<A>(st.m), device_ptr<A>(st.v), p.numel(), s,
                                                       p.device().index));
                    return;
                }
                T* pp = device_ptr<T>(p);
                A* master = device_ptr<A>(st.master);
                const T* pg = device_ptr<T>(g);
                A *pm = device_ptr<A>(st.m), *pv = device_ptr<A>(st.v);
                for (int64_t k = 0, end = p.numel(); k < end; ++k)
                    detail::adamw_update<T>(pp + k, master ? master + k : nullptr, pg[k], pm + k, pv + k, s);
            });
            p.storage()->bump_version();
        }
    }
}

const AdamW::ParamState& AdamW::state(const Tensor& p) const {
    NT_CHECK(p.defined(), "AdamW::state: expected a parameter, got an undefined tensor");
    for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t i = 0; i < groups_[gi].params.size(); ++i)
            if (&groups_[gi].params[i].impl() == &p.impl()) return state_[gi][i];
    throw Error("AdamW::state: the tensor " + shape_str(p.shape()) + " is not a parameter of this optimizer");
}

void AdamW::set_step_count(int64_t t) {
    NT_CHECK(t >= 0, "AdamW::set_step_count: expected t >= 0, got ", t);
    t_ = t;
}

void AdamW::zero_grad() {
    for (ParamGroup& g : groups_)
        for (Tensor& p : g.params) p.zero_grad();
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
    NT_CHECK(max_norm > 0, "clip_grad_norm_: expected max_norm > 0, got ", max_norm);
    double total = 0.0;
    for (const Tensor& p : params) {
        Tensor g = p.grad();
        if (!g.defined()) continue;
        dispatch_floating(g.dtype(), "clip_grad_norm_", [&](auto tag) {
            using T = decltype(tag);
            if (g.device().is_cuda()) {
                NT_CUDA(total += detail::sum_squares_cuda<T>(device_ptr<T>(g), g.numel(), g.device().index));
                return;
            }
            const T* pg = device_ptr<T>(g);
            for (int64_t k = 0, end = g.numel(); k < end; ++k) total += double(pg[k]) * double(pg[k]);
        });
    }
    double norm = std::sqrt(total);
    if (norm > max_norm) {
        NoGradGuard no_grad;
        for (const Tensor& p : params)
            if (p.grad().defined()) p.grad().mul_(max_norm / (norm + 1e-6));
    }
    return norm;
}

}  // namespace normtape
