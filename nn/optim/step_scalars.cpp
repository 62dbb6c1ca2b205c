// nn/optim/step_scalars.cpp: StepScalars (nn/optim/step_scalars.h).
#include "nn/optim/step_scalars.h"

#include <algorithm>

#include "core/check.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dry_run.h"

namespace normtape::detail {

void StepScalars::advance(const std::vector<Device>& devices, double lr, int64_t t_before) {
    if (!is_dry_run()) dry_scalars_.clear();
    std::vector<Tensor>& made = is_dry_run() ? dry_scalars_ : scalars_;
    auto has = [&](Device device) {
        auto on_device = [&](const Tensor& s) { return s.device() == device; };
        return std::any_of(scalars_.begin(), scalars_.end(), on_device) ||
               std::any_of(dry_scalars_.begin(), dry_scalars_.end(), on_device);
    };
    for (Device device : devices)
        if (!has(device))
            made.push_back(!scalars_.empty() ? scalars_[0].to(device)
                                             : from_vector<double>({lr, static_cast<double>(t_before), 1.0, 1.0}).to(device));
    for (const std::vector<Tensor>* list : {&scalars_, &dry_scalars_})
        for ([[maybe_unused]] const Tensor& s : *list)
            NT_CUDA(step_scalars_advance_cuda(device_ptr<double>(s), beta1_, beta2_, s.device().index));
}

const double* StepScalars::on(Device device) const {
    for (const std::vector<Tensor>* list : {&scalars_, &dry_scalars_})
        for (const Tensor& s : *list)
            if (s.device() == device) return device_ptr<double>(s);
    NT_CHECK(false, "StepScalars: expected scalars on ", device_name(device), ", got none");
    return nullptr;
}

void StepScalars::set_lr(double lr) {
    for (Tensor& s : scalars_) s.narrow(0, 0, 1).fill_(lr);
}

void StepScalars::set_step_count(int64_t t) {
    for (Tensor& s : scalars_) s.narrow(0, 1, 1).fill_(static_cast<double>(t));
}

int64_t StepScalars::step_count(int64_t host) const {
    return scalars_.empty() ? host : static_cast<int64_t>(scalars_[0].narrow(0, 1, 1).item<double>());
}

}  // namespace normtape::detail
