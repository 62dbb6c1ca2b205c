// nn/optim/lr_scheduler.cpp: the schedules of nn/optim/lr_scheduler.h.
#include "nn/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>

#include "core/check.h"

namespace normtape {

namespace {
void check_step(const char* schedule, int64_t step) {
    NT_CHECK(step >= 0, schedule, ": expected a step >= 0, got ", step);
}
void check_rate(const char* schedule, const char* what, double v) {
    NT_CHECK(std::isfinite(v) && v >= 0.0, schedule, ": expected ", what, " >= 0 and finite, got ", v);
}
}  // namespace

ConstantLR::ConstantLR(double lr) : lr_(lr) { check_rate("ConstantLR", "lr", lr); }

double ConstantLR::lr(int64_t step) const {
    check_step("ConstantLR", step);
    return lr_;
}

WarmupCosineLR::WarmupCosineLR(double max_lr, int64_t warmup_steps, int64_t decay_steps, double min_lr)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_steps_(warmup_steps), decay_steps_(decay_steps) {
    check_rate("WarmupCosineLR", "max_lr", max_lr);
    check_rate("WarmupCosineLR", "min_lr", min_lr);
    NT_CHECK(min_lr <= max_lr, "WarmupCosineLR: expected min_lr <= max_lr, got min_lr ", min_lr, " and max_lr ", max_lr);
    NT_CHECK(warmup_steps >= 0, "WarmupCosineLR: expected warmup_steps >= 0, got ", warmup_steps);
    NT_CHECK(decay_steps > warmup_steps, "WarmupCosineLR: expected decay_steps > warmup_steps, got decay_steps ",
             decay_steps, " and warmup_steps ", warmup_steps);
}

double WarmupCosineLR::lr(int64_t step) const {
    check_step("WarmupCosineLR", step);
    if (step < warmup_steps_) return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    if (step >= decay_steps_) return min_lr_;
    double p = static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
    return min_lr_ + (max_lr_ - min_lr_) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

StepLR::StepLR(double lr, int64_t step_size, double gamma) : lr_(lr), gamma_(gamma), step_size_(step_size) {
    check_rate("StepLR", "lr", lr);
    check_rate("StepLR", "gamma", gamma);
    NT_CHECK(step_size >= 1, "StepLR: expected step_size >= 1, got ", step_size);
}

double StepLR::lr(int64_t step) const {
    check_step("StepLR", step);
    return lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

}  // namespace normtape
