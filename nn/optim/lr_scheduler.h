// nn/optim/lr_scheduler.h: learning-rate schedules, the learning rate as a function of the step. Each is
// a pure function of the step (no state to save in a checkpoint): a training loop calls
// `optimizer.set_lr(schedule.lr(step))` before each step. Not here: the optimizer (nn/optim/adamw.h).
#pragma once

#include <cstdint>

namespace normtape {

// A schedule: lr(step) for step = 0, 1, ... (the step about to be taken, counted from 0).
class LRScheduler {
public:
    virtual ~LRScheduler() = default;
    // The learning rate of `step`. Throws Error naming the schedule when step < 0.
    virtual double lr(int64_t step) const = 0;
};

// lr(step) = lr for every step (PyTorch's ConstantLR with factor 1).
// Throws Error naming ConstantLR when lr is negative or not finite.
class ConstantLR final : public LRScheduler {
public:
    explicit ConstantLR(double lr);
    double lr(int64_t step) const override;

private:
    double lr_;
};

// Linear warm-up, then cosine decay (Loshchilov & Hutter 2017, without restarts), the shape of
// nanoGPT's get_lr():
//   step <  warmup_steps:                max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < decay_steps:  min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2,
//                                        p = (step - warmup_steps) / (decay_steps - warmup_steps)
//   step >= decay_steps:                 min_lr
// The warm-up reaches max_lr on its last step (nanoGPT's reaches max_lr * warmup / (warmup + 1)).
// Throws Error naming WarmupCosineLR unless 0 <= min_lr <= max_lr (finite), warmup_steps >= 0
// and decay_steps > warmup_steps.
class WarmupCosineLR final : public LRScheduler {
public:
    WarmupCosineLR(double max_lr, int64_t warmup_steps, int64_t decay_steps, double min_lr);
    double lr(int64_t step) const override;

private:
    double max_lr_, min_lr_;
    int64_t warmup_steps_, decay_steps_;
};

// lr(step) = lr * gamma^(step / step_size), integer division (PyTorch's StepLR).
// Throws Error naming StepLR when lr or gamma is negative or not finite, or step_size < 1.
class StepLR final : public LRScheduler {
public:
    StepLR(double lr, int64_t step_size, double gamma);
    double lr(int64_t step) const override;

private:
    double lr_, gamma_;
    int64_t step_size_;
};

}  // namespace normtape
