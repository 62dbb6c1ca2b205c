// nn/memory/memory_budget.h: the fastest memory settings of a training step that fit a byte budget: a
// cost model of what each setting adds to the step's time, calibrated once per device by a short
// measurement, and the planner that searches every setting, whose peaks predict_peak predicts
// (nn/memory/memory_plan.h).
//
// Dimensions as nn/model/gpt.h: B batch rows, T sequence length, C, L, V, H; E = B * T positions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/memory/memory_plan.h"

namespace normtape {

// What a device does per ms, measured by calibrate_step_costs; the step's time is modelled from it.
struct StepCostModel {
    double flops_per_ms = 0;        // a product of the model's shape at full batch ([E, C] @ [C, 4C])
    double small_flops_per_ms = 0;  // the same product at one row of the batch ([T, C] @ [C, 4C])
    double bytes_per_ms = 0;        // a device copy (read + write counted), for the elementwise passes
    double host_bytes_per_ms = 0;   // device -> host -> device (offload); 0 on the cpu (no copy)
    double pass_ms = 0;             // the fixed cost of one forward+backward (launches), at any size
};

// Measures the costs on config.device in config.dtype with products of config's width at [B, T]
// (a few runs each after a warm-up; about a second on a GPU). The result is cached per device,
// dtype and shape: later calls return it at once. Throws as detail::check_step_shape (nn/model/gpt.h),
// naming calibrate_step_costs, and as the ops it runs (DeviceError for a device this build or
// machine lacks, OutOfMemoryError).
StepCostModel calibrate_step_costs(const GPTConfig& config, int64_t B, int64_t T);

// The modelled time of one training step, ms: the step's products (6 flops per parameter of a
// Linear per position, the causal attention's 6 B T^2 C per layer) at the micro-batch's rate
// (flops_per_ms at the full batch, small_flops_per_ms at one row, log-linear between), plus
// what each setting adds: the fused head loss one more [E, C] @ [C, V] product; each checkpointed
// block its forward again; Output and Normalized a pass over each norm's [E, C] in backward;
// activation recompute a pass over each MLP's [E, H]; offload the saved bytes to the host and
// back; every micro-batch a pass_ms. Offload on the cpu changes nothing and costs nothing.
// Throws, naming predict_step_ms, as detail::check_step_settings (nn/memory/memory_plan.h: B, T, the
// micro-batch, the settings, the config), and Error for costs whose rates (flops_per_ms,
// small_flops_per_ms, bytes_per_ms) are not > 0 or whose host_bytes_per_ms or pass_ms are < 0, or
// any of them not finite.
double predict_step_ms(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T,
                       const StepCostModel& costs);

// Every setting the planner considers for B rows: the 3 policies x activation recompute on/off x
// fused head loss on/off x checkpoint_every 0, 1, 2 x offload on/off (CUDA only) x micro-batches
// B, B/2, B/4, ... down to 1 (the divisors of B by powers of two). In that order; each with
// `optimizer`, which the planner does not choose.
std::vector<MemorySettings> memory_settings_grid(const GPTConfig& config, int64_t B,
                                                 StepOptimizer optimizer = StepOptimizer::AdamW);

// A short label of a setting: "normalized, recompute, fused, ckpt 2, offload, micro 4" (the
// settings that are off are left out; "input" alone is the plain step).
std::string settings_label(const MemorySettings& s);

// The planner's answer.
struct MemoryBudgetPlan {
    bool fits = false;              // some setting's predicted peak is within the budget
    MemorySettings settings;        // the fastest that fits (fits), else the one of the smallest peak
    int64_t predicted_peak = 0;     // predict_peak of `settings`, bytes
    double predicted_step_ms = 0;   // predict_step_ms of `settings`
    int64_t smallest_peak = 0;      // the smallest predicted peak over the grid: the least budget that fits
    int64_t largest_batch = 0;      // when nothing fits: the largest B / 2^k (k >= 1) some setting fits, 0 if none
    std::string advice;             // when nothing fits: what would (a budget, a smaller batch)
};

// The fastest setting of memory_settings_grid(config, B, optimizer) whose predict_peak on [B, T] is at most
// budget_bytes, by predict_step_ms with `costs` (ties: the smaller peak). When none fits, fits is
// false, settings the smallest-peak setting, and advice says the least budget that fits and the
// largest batch B / 2, B / 4, ... 1 that some setting fits in the budget (largest_batch), or that
// none does. Throws, naming plan_memory, Error for budget_bytes <= 0, as predict_step_ms for B, T,
// the config and `costs`, and as predict_peak.
MemoryBudgetPlan plan_memory(const GPTConfig& config, int64_t budget_bytes, int64_t B, int64_t T,
                             const StepCostModel& costs, StepOptimizer optimizer = StepOptimizer::AdamW);
// The same with calibrate_step_costs(config, B, T).
MemoryBudgetPlan plan_memory(const GPTConfig& config, int64_t budget_bytes, int64_t B, int64_t T,
                             StepOptimizer optimizer = StepOptimizer::AdamW);

}  // namespace normtape
