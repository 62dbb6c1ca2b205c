// nn/optim/adamw.cpp: AdamW and clip_grad_norm_: checks, the cpu loops (chunks on parallel threads,
// core/parallel.h), and on CUDA the tables and
// launches of the multi-tensor kernels (nn/optim/adamw.cu; Note [Multi-tensor AdamW and the gradient
// norm] there).
#include "nn/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/dry_run.h"
#include "core/parallel.h"
#include "nn/optim/adamw_update.h"
#include "nn/optim/optimizer_checks.h"
#include "nn/optim/step_scalars.h"

namespace normtape {

namespace detail {

// The device tables of an AdamW's multi-tensor CUDA step (Note [Multi-tensor AdamW and the
// gradient norm], nn/optim/adamw.cu), one bucket per (device, dtype) of the parameters stepped.
struct AdamWPlan {
    struct Bucket {
        Device device;
        DType dtype;
        std::vector<std::pair<size_t, size_t>> members;  // (group, index) of each table entry, in order
        std::vector<int64_t> chunk_begin;  // member k's chunks: [chunk_begin[k], chunk_begin[k + 1])
        Tensor table;  // on `device`: AdamWTensor<T>[members.size()], then AdamWChunk[chunk_begin.back()]
    };
    // What the tables were built from: whether in a dry run (core/dry_run.h), then per bucket its
    // device, dtype and size, then per member its group, index, pointers (parameter, master, m, v)
    // and numel. A step whose key differs rebuilds.
    std::vector<uintptr_t> key;
    std::vector<Bucket> buckets;
};

}  // namespace detail

namespace {
using detail::AdamWPlan;
using detail::device_ptr;

#if NORMTAPE_WITH_CUDA
// Fills the table of bucket b on the host and copies it to b.device (waits for the copy).
template <class T>
void build_table(AdamWPlan::Bucket& b, const std::vector<ParamGroup>& groups,
                 const std::vector<std::vector<AdamW::ParamState>>& state) {
    using A = acc_t<T>;
    std::vector<detail::AdamWTensor<T>> entries;
    std::vector<detail::AdamWChunk> chunks;
    b.chunk_begin.assign(1, 0);
    for (size_t k = 0; k < b.members.size(); ++k) {
        auto [gi, i] = b.members[k];
        const Tensor& p = groups[gi].params[i];
        const AdamW::ParamState& st = state[gi][i];
        entries.push_back({device_ptr<T>(p), device_ptr<A>(st.master), device_ptr<A>(st.m), device_ptr<A>(st.v),
                           p.numel(), groups[gi].weight_decay, groups[gi].lr_scale});
        const int64_t n = detail::chunks_of(p.numel());
        for (int64_t c = 0; c < n; ++c) chunks.push_back({static_cast<int32_t>(k), static_cast<int32_t>(c)});
        b.chunk_begin.push_back(b.chunk_begin.back() + n);
    }
    static_assert(sizeof(detail::AdamWTensor<T>) % 8 == 0 && sizeof(detail::AdamWChunk) == 8);
    const size_t entry_bytes = entries.size() * sizeof(entries[0]), bytes = entry_bytes + chunks.size() * 8;
    Tensor words = zeros({static_cast<int64_t>(bytes / 8) + 1}, TensorOptions().dtype(DType::I64));
    if (!is_dry_run()) {  // Note [The dry run]: the table's bytes counted, not written
        std::memcpy(words.data_ptr<int64_t>(), entries.data(), entry_bytes);
        std::memcpy(reinterpret_cast<char*>(words.data_ptr<int64_t>()) + entry_bytes, chunks.data(), chunks.size() * 8);
    }
    b.table = words.to(b.device);
}

// Queues the update of every parameter of bucket b: one launch per kAdamWGradsPerLaunch members.
template <class T>
void launch_bucket(const AdamWPlan::Bucket& b, const std::vector<ParamGroup>& groups, const detail::AdamWStep& s,
                   const double* scalars, const double* skip_if_nonfinite) {
    const auto* tensors = reinterpret_cast<const detail::AdamWTensor<T>*>(device_ptr<int64_t>(b.table));
    const auto* chunks = reinterpret_cast<const detail::AdamWChunk*>(tensors + b.members.size());
    const size_t n = b.members.size();
    for (size_t first = 0; first < n; first += detail::kAdamWGradsPerLaunch) {
        const size_t last = std::min(n, first + detail::kAdamWGradsPerLaunch);
        detail::AdamWGrads<T> grads{};
        grads.first_tensor = static_cast<int32_t>(first);
        for (size_t k = first; k < last; ++k)
            grads.grad[k - first] = device_ptr<T>(groups[b.members[k].first].params[b.members[k].second].grad());
        const int64_t c0 = b.chunk_begin[first], c1 = b.chunk_begin[last];
        detail::adamw_multi_tensor_cuda<T>(tensors, chunks + c0, c1 - c0, grads, s, scalars, skip_if_nonfinite,
                                           b.device.index);
    }
}

// Queues the update of every parameter on a GPU that has a gradient, with s (weight decay: each
// table entry's; lr and bias corrections: each device's scalars, advanced from step t_before).
// Returns `plan` if its key matches these parameters, else the plan rebuilt.
std::shared_ptr<const AdamWPlan> step_cuda(std::shared_ptr<const AdamWPlan> plan, const std::vector<ParamGroup>& groups,
                                           const std::vector<std::vector<AdamW::ParamState>>& state,
                                           const detail::AdamWStep& s, const Tensor* grad_norm,
                                           detail::StepScalars& scalars, int64_t t_before) {
    // The parameters by (device, dtype), in order of first appearance, and the key of their tables.
    std::vector<AdamWPlan::Bucket> buckets;
    for (size_t gi = 0; gi < groups.size(); ++gi)
        for (size_t i = 0; i < groups[gi].params.size(); ++i) {
            const Tensor& p = groups[gi].params[i];
            if (!p.grad().defined() || !p.device().is_cuda()) continue;
            size_t b = 0;
            while (b < buckets.size() && !(buckets[b].device == p.device() && buckets[b].dtype == p.dtype())) ++b;
            if (b == buckets.size()) buckets.push_back({p.device(), p.dtype(), {}, {}, Tensor()});
            buckets[b].members.emplace_back(gi, i);
        }
    std::vector<uintptr_t> key{uintptr_t(is_dry_run())};  // a dry run's table is no real run's
    for (const AdamWPlan::Bucket& b : buckets) {
        key.insert(key.end(), {uintptr_t(b.device.index), uintptr_t(b.dtype), b.members.size()});
        for (auto [gi, i] : b.members) {
            const Tensor& p = groups[gi].params[i];
            const AdamW::ParamState& st = state[gi][i];
            key.insert(key.end(), {gi, i, reinterpret_cast<uintptr_t>(detail::byte_ptr(p)),
                                   reinterpret_cast<uintptr_t>(detail::byte_ptr(st.master)),
                                   reinterpret_cast<uintptr_t>(detail::byte_ptr(st.m)),
                                   reinterpret_cast<uintptr_t>(detail::byte_ptr(st.v)), uintptr_t(p.numel())});
        }
    }
    if (!plan || plan->key != key) {
        auto rebuilt = std::make_shared<AdamWPlan>();
        for (AdamWPlan::Bucket& b : buckets)
            dispatch_floating(b.dtype, "AdamW", [&](auto tag) { build_table<decltype(tag)>(b, groups, state); });
        rebuilt->key = std::move(key);
        rebuilt->buckets = std::move(buckets);
        plan = std::move(rebuilt);
    }
    Tensor norm;  // f64, on the device of every parameter stepped (step_impl checked it)
    if (grad_norm) norm = grad_norm->dtype() == DType::F64 ? *grad_norm : grad_norm->to(DType::F64);
    std::vector<Device> devices;
    for (const AdamWPlan::Bucket& b : plan->buckets)
        if (std::find(devices.begin(), devices.end(), b.device) == devices.end()) devices.push_back(b.device);
    scalars.advance(devices, s.lr, t_before);
    for (const AdamWPlan::Bucket& b : plan->buckets)
        dispatch_floating(b.dtype, "AdamW", [&](auto tag) {
            launch_bucket<decltype(tag)>(b, groups, s, scalars.on(b.device), device_ptr<double>(norm));
        });
    return plan;
}

// clip_grad_norm_tensor_ for gradients on one GPU, `device`, checked by the caller. Lists of
// gradients by dtype (f32, bf16, f64), at most kGradListTensors each; their chunks' partial sums
// are laid out in that order in `partial`, followed by the clip coefficient.
Tensor clip_grad_norm_cuda(const std::vector<Tensor>& grads, double max_norm, Device device) {
    std::vector<std::pair<DType, detail::GradList>> lists;
    int64_t chunks = 0;
    for (DType dtype : {DType::F32, DType::BF16, DType::F64})
        for (const Tensor& g : grads) {
            if (g.dtype() != dtype) continue;
            if (lists.empty() || lists.back().first != dtype || lists.back().second.count == detail::kGradListTensors)
                lists.push_back({dtype, detail::GradList{}});
            detail::GradList& list = lists.back().second;
            const int64_t before = list.count > 0 ? list.chunk_end[list.count - 1] : 0;
            list.data[list.count] = detail::byte_ptr(g);
            list.numel[list.count] = g.numel();
            list.chunk_end[list.count] = static_cast<int32_t>(before + detail::chunks_of(g.numel()));
            ++list.count;
            chunks += detail::chunks_of(g.numel());
        }
    const TensorOptions f64 = TensorOptions().dtype(DType::F64).device(device);
    Tensor partial = empty({chunks + 1}, f64), norm = empty({}, f64);
    double* pp = device_ptr<double>(partial);
    double* coef = pp + chunks;
    int64_t offset = 0;
    for (const auto& [dtype, list] : lists) {
        dispatch_floating(dtype, "clip_grad_norm_", [&](auto tag) {
            detail::grad_sum_squares_cuda<decltype(tag)>(pp + offset, list, device.index);
        });
        offset += list.chunk_end[list.count - 1];
    }
    detail::clip_coef_cuda(device_ptr<double>(norm), coef, pp, chunks, max_norm, device.index);
    for (const auto& [dtype, list] : lists)
        dispatch_floating(dtype, "clip_grad_norm_",
                          [&](auto tag) { detail::grad_scale_cuda<decltype(tag)>(list, coef, device.index); });
    for (const Tensor& g : grads) g.storage()->bump_version();
    return norm;
}
#endif  // NORMTAPE_WITH_CUDA

// AdamW's options: finite, with torch.optim.AdamW's ranges (lr >= 0, betas in [0, 1),
// weight_decay >= 0) except eps, which must be > 0: with eps 0 an element whose gradient has
// always been 0 (an embedding row never drawn) becomes 0 / 0.
void check_options(const char* op, const AdamWOptions& o) {
    detail::check_lr(op, o.lr);
    NT_CHECK(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, op, ": expected betas in [0, 1), got betas (",
             o.beta1, ", ", o.beta2, ")");
    NT_CHECK(std::isfinite(o.eps) && o.eps > 0, op, ": expected eps > 0 and finite, got eps ", o.eps);
    detail::check_weight_decay(op, "", o.weight_decay);
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : options_(options), scalars_(std::make_shared<detail::StepScalars>(options.beta1, options.beta2)) {
    check_options("AdamW", options);
    groups_ = detail::checked_groups("AdamW", groups, 0);
    for (const ParamGroup& g : groups_) {
        state_.emplace_back();
        for (const Tensor& p : g.params) {
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
    detail::check_lr("AdamW::set_lr", lr);
    options_.lr = lr;
    scalars_->set_lr(lr);
}

void AdamW::step() { step_impl(nullptr); }

void AdamW::step_if_finite(const Tensor& grad_norm) { step_impl(&grad_norm); }

void AdamW::step_impl(const Tensor* grad_norm) {
    NoGradGuard no_grad;
    if (grad_norm) detail::check_grad_norm("AdamW", *grad_norm);
    // Every parameter is checked before any is updated, so a failed step changes nothing.
    for (size_t gi = 0; gi < groups_.size(); ++gi)
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            const Tensor& p = groups_[gi].params[i];
            if (p.grad().defined())
                detail::check_stepped("AdamW", gi, i, p, state_[gi][i].m, state_[gi][i].master, grad_norm);
        }
    const int64_t t_before = t_++;
    const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(t_));
    const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(t_));
    bool on_cuda = false;
    for (const ParamGroup& g : groups_)
        for (const Tensor& p : g.params) on_cuda = on_cuda || (p.grad().defined() && p.device().is_cuda());
    if (on_cuda) {  // weight_decay 0 here: each table entry carries its group's
        NT_CUDA(plan_ = step_cuda(plan_, groups_, state_,
                                  {options_.lr, options_.beta1, options_.beta2, options_.eps, 0.0, bias_correction1,
                                   bias_correction2},
                                  grad_norm, *scalars_, t_before));
    } else {
        scalars_->advance({}, options_.lr, t_before);  // every device's count counts the step
    }
    // A norm on the cpu means every parameter stepped is on the cpu.
    const bool skip_on_cpu = grad_norm && !grad_norm->device().is_cuda() && !std::isfinite(grad_norm->item<double>());
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
        detail::AdamWStep s{options_.lr * groups_[gi].lr_scale,
                            options_.beta1,
                            options_.beta2,
                            options_.eps,
                            groups_[gi].weight_decay,
                            bias_correction1,
                            bias_correction2};
        for (size_t i = 0; i < groups_[gi].params.size(); ++i) {
            Tensor p = groups_[gi].params[i];
            Tensor g = p.grad();
            if (!g.defined()) continue;
            p.storage()->bump_version();
            if (p.device().is_cuda() || skip_on_cpu) continue;  // CUDA: queued above
            ParamState& st = state_[gi][i];
            dispatch_floating(p.dtype(), "AdamW", [&](auto tag) {
                using T = decltype(tag);
                using A = acc_t<T>;
                T* pp = device_ptr<T>(p);
                A* master = device_ptr<A>(st.master);
                const T* pg = device_ptr<T>(g);
                A *pm = device_ptr<A>(st.m), *pv = device_ptr<A>(st.v);
                detail::parallel_for(0, p.numel(), detail::kGrain / 4, [&](int64_t k0, int64_t k1) {
                    for (int64_t k = k0; k < k1; ++k)
                        detail::adamw_update<T>(pp + k, master ? master + k : nullptr, pg[k], pm + k, pv + k, s);
                });
            });
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

int64_t AdamW::step_count() const { return scalars_->step_count(t_); }

void AdamW::set_step_count(int64_t t) {
    NT_CHECK(t >= 0, "AdamW::set_step_count: expected t >= 0, got ", t);
    t_ = t;
    scalars_->set_step_count(t);
}

void AdamW::zero_grad() {
    for (ParamGroup& g : groups_)
        for (Tensor& p : g.params) p.zero_grad();
}

Tensor clip_grad_norm_tensor_(const std::vector<Tensor>& params, double max_norm) {
    NT_CHECK(max_norm > 0, "clip_grad_norm_: expected max_norm > 0, got ", max_norm);
    std::vector<Tensor> grads;
    for (const Tensor& p : params)
        if (p.grad().defined()) grads.push_back(p.grad());
    const Device device = !grads.empty() ? grads[0].device() : !params.empty() ? params[0].device() : Device::CPU;
    for (const Tensor& g : grads) {
        NT_CHECK_AS(DeviceError, g.device() == device, "clip_grad_norm_: expected every gradient on ",
                    device_name(device), ", got one on ", device_name(g.device()));
        NT_CHECK_AS(DTypeError, is_floating(g.dtype()), "clip_grad_norm_: expected floating gradients, got ",
                    dtype_name(g.dtype()));
        NT_CHECK(g.is_contiguous(), "clip_grad_norm_: expected contiguous gradients, got one of shape ",
                 shape_str(g.shape()), " with strides ", shape_str(g.strides()));
    }
    if (device.is_cuda()) {
        NT_CUDA(return clip_grad_norm_cuda(grads, max_norm, device));
    }
    NoGradGuard no_grad;
    // The sum of squares in double: per gradient by chunks added in chunk order, then over the
    // gradients in order (Note [Deterministic parallel cpu kernels], core/parallel.h).
    double total = 0.0;
    for (const Tensor& g : grads)
        dispatch_floating(g.dtype(), "clip_grad_norm_", [&](auto tag) {
            using T = decltype(tag);
            const T* pg = device_ptr<T>(g);
            double sum = 0.0;
            detail::parallel_reduce(0, g.numel(), detail::kGrain, 1, &sum, [&](int64_t k0, int64_t k1, double* acc) {
                double chunk = 0.0;
                for (int64_t k = k0; k < k1; ++k) chunk += double(pg[k]) * double(pg[k]);
                *acc = chunk;
            });
            total += sum;
        });
    const double norm = std::sqrt(total);
    if (norm > max_norm)
        for (Tensor& g : grads) g.mul_(max_norm / (norm + 1e-6));
    return full({}, norm, TensorOptions().dtype(DType::F64));
}

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
    return clip_grad_norm_tensor_(params, max_norm).item<double>();
}

}  // namespace normtape
