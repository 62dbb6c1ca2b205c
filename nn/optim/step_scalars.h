// nn/optim/step_scalars.h: an optimizer's learning rate and step count in device memory, so that a
// step replayed from a CUDA graph (core/cuda_graph.h) reads the current ones. Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace normtape::detail {

// Per CUDA device an f64 tensor [4]: [0] the lr, [1] the step count t, [2] 1 - beta1^t,
// [3] 1 - beta2^t (AdamW's bias corrections; 1 with betas 0). The optimizer keeps its lr and count
// on the host too, for the cpu and for a device's first step; a step replayed from a CUDA graph
// advances the devices' count only. set_lr and set_step_count queue their writes on each device's
// stream. Scalars made inside a dry run are dropped at the next step outside one.
class StepScalars {
public:
    StepScalars(double beta1, double beta2) : beta1_(beta1), beta2_(beta2) {}
    // One step: queues t += 1 and the bias corrections of the new t on every device's scalars,
    // made first for each of `devices` (CUDA) that has none (a copy of another device's, else from
    // lr and t_before), so that every device's count stays the step count. Throws as Tensor::to.
    void advance(const std::vector<Device>& devices, double lr, int64_t t_before);
    // `device`'s scalars (device memory, read by the step's kernels); advance made them. Throws
    // Error for a device that has none.
    const double* on(Device device) const;
    void set_lr(double lr);
    void set_step_count(int64_t t);
    // The count of the first device's scalars (waits for it), or `host` when there are none: a
    // replayed step advances the device's count only.
    int64_t step_count(int64_t host) const;

private:
    double beta1_, beta2_;
    std::vector<Tensor> scalars_;      // one per device used so far
    std::vector<Tensor> dry_scalars_;  // made inside a dry run: placeholders, never read
};

// scalars as above: t += 1, then [2] = 1 - beta1^t, [3] = 1 - beta2^t (pow in f64). One thread.
void step_scalars_advance_cuda(double* scalars, double beta1, double beta2, int device);

}  // namespace normtape::detail
