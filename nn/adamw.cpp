// nn/adamw.cpp: AdamW and clip_grad_norm_.
#include "nn/adamw.h"

#include <cmath>

#include "core/autograd.h"
#include "core/dispatch.h"

namespace normtape {

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : groups_(std::move(groups)), options_(options) {
    NT_CHECK(options.lr >= 0 && options.eps > 0 && options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 &&
                 options.beta2 < 1,
             "AdamW: expected lr >= 0, eps > 0 and betas in [0, 1), got lr ", options.lr, ", eps ", options.eps,
             ", betas (", options.beta1, ", ", options.beta2, ")");
    for (const ParamGroup& g : groups_) {
        m_.emplace_back();
        v_.emplace_back();
        for (const Tensor& p : g.params) {
            NT_CHECK(p.defined() && p.requires_grad() && p.is_leaf() && p.is_contiguous(),
                     "AdamW: expected contiguous leaf parameters that require grad");
            m_.back().push_back(zeros(p.shape(), TensorOptions().dtype(p.dtype())));
            v_.back().push_back(zeros(p.shape(), TensorOptions().dtype(p.dtype())));
        }
    }
}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{{params, options.weight_decay}}, options) {}

void AdamW::step() {
    NoGradGuard no_grad;
    ++t_;
    double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t_));
    double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t_));
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            Tensor p = groups_[gi].params[i];
            Tensor g = p.grad();
            if (!g.defined()) continue;
            dispatch_floating(p.dtype(), "AdamW", [&](auto tag) {
                using T = decltype(tag);
                T* pp = p.data_ptr<T>();
                const T* pg = g.data_ptr<T>();
                T* pm = m_[gi][i].data_ptr<T>();
                T* pv = v_[gi][i].data_ptr<T>();
                double lr = options_.lr, decay = 1.0 - options_.lr * groups_[gi].weight_decay;
                for (int64_t k = 0, end = p.numel(); k < end; ++k) {
                    pm[k] = static_cast<T>(options_.beta1 * pm[k] + (1 - options_.beta1) * pg[k]);
                    pv[k] = static_cast<T>(options_.beta2 * pv[k] + (1 - options_.beta2) * double(pg[k]) * pg[k]);
                    double update = (pm[k] / bc1) / (std::sqrt(pv[k] / bc2) + options_.eps);
                    pp[k] = static_cast<T>(pp[k] * decay - lr * update);
                }
            });
            p.storage()->bump_version();
        }
    }
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
            const T* pg = g.data_ptr<T>();
            for (int64_t k = 0, end = g.numel(); k < end; ++k) total += double(pg[k]) * pg[k];
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
