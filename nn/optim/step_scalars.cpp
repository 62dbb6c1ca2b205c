// nn/optim/step_scalars.cpp: StepScalars (nn/optim/step_scalars.h).
#include "nn/optim/step_scalars.h"

#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"

namespace normtape::detail {

const double* StepScalars::advance(Device device, double lr, int64_t t_before) {
    auto it = std::find_if(scalars_.begin(), scalars_.end(), [&](const Tensor& s) { return s.device() == device; });
    if (it == scalars_.end()) {
        scalars_.push_back(from_vector<double>({lr, static_cast<double>(t_before), 1.0, 1.0}).to(device));
        it = scalars_.end() - 1;
    }
    double* s = device_ptr<double>(*it);
    NT_CUDA(step_scalars_advance_cuda(s, beta1_, beta2_, device.index));
    return s;
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
