// nn/memory/memory_budget.cpp: the step's cost model, its calibration, and the planner (nn/memory/memory_budget.h).
#include "nn/memory/memory_budget.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "core/autograd.h"
#include "core/device.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace normtape {

namespace {

// The mean time of `runs` calls of fn on `device`, ms, after one call that is not timed.
template <class F>
double time_ms(Device device, int runs, F&& fn) {
    fn();
    synchronize(device);
    Event start(device), end(device);
    start.record();
    for (int i = 0; i < runs; ++i) fn();
    end.record();
    return Event::elapsed_ms(start, end) / runs;
}

// Kernel launches of one forward+backward pass: about 30 per layer and 20 outside the blocks.
double launches_per_pass(const GPTConfig& c) { return 30.0 * static_cast<double>(c.n_layer) + 20.0; }

StepCostModel measure(const GPTConfig& c, int64_t B, int64_t T) {
    NoGradGuard no_grad;
    const Device device = c.device;
    const TensorOptions opts = TensorOptions().dtype(c.dtype).device(device);
    const int64_t E = B * T, C = c.n_embd, H = 4 * C;
    StepCostModel m;
    Tensor x = randn({E, C}, opts), w = randn({H, C}, opts);
    m.flops_per_ms = 2.0 * static_cast<double>(E * C * H) / time_ms(device, 3, [&] { linear(x, w); });
    Tensor row = x.narrow(0, 0, T).contiguous();
    m.small_flops_per_ms = 2.0 * static_cast<double>(T * C * H) / time_ms(device, 5, [&] { linear(row, w); });
    const double bytes = static_cast<double>(x.numel()) * static_cast<double>(element_size(c.dtype));
    m.bytes_per_ms = 2.0 * bytes / time_ms(device, 5, [&] { x.clone(); });
    if (device.is_cuda()) m.host_bytes_per_ms = 2.0 * bytes / time_ms(device, 2, [&] { x.to(Device::CPU).to(device); });
    Tensor tiny = zeros({1}, opts);
    m.pass_ms = launches_per_pass(c) * time_ms(device, 100, [&] { add(tiny, tiny); });
    return m;
}

int64_t dtype_bytes(DType d) { return static_cast<int64_t>(element_size(d)); }

// Every rate positive and every cost non-negative, all finite, or Error naming `op` and the field.
void check_costs(const char* op, const StepCostModel& m) {
    const struct {
        const char* name;
        double value;
        bool positive;
    } fields[] = {{"flops_per_ms", m.flops_per_ms, true},
                  {"small_flops_per_ms", m.small_flops_per_ms, true},
                  {"bytes_per_ms", m.bytes_per_ms, true},
                  {"host_bytes_per_ms", m.host_bytes_per_ms, false},
                  {"pass_ms", m.pass_ms, false}};
    for (const auto& f : fields)
        NT_CHECK(std::isfinite(f.value) && (f.positive ? f.value > 0 : f.value >= 0), op, ": expected costs.", f.name,
                 f.positive ? " > 0" : " >= 0", " and finite (calibrate_step_costs measures them), got ", f.value);
}

// The smallest predict_peak over memory_settings_grid(config, B, optimizer), and its setting.
std::pair<int64_t, MemorySettings> smallest_peak(const GPTConfig& config, int64_t B, int64_t T, StepOptimizer optimizer) {
    std::pair<int64_t, MemorySettings> best{-1, {}};
    for (const MemorySettings& s : memory_settings_grid(config, B, optimizer)) {
        const int64_t peak = predict_peak(config, s, B, T);
        if (best.first < 0 || peak < best.first) best = {peak, s};
    }
    return best;
}

}  // namespace

StepCostModel calibrate_step_costs(const GPTConfig& c, int64_t B, int64_t T) {
    detail::check_step_shape("calibrate_step_costs", c, B, T);
    using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t>;
    static std::mutex mutex;
    static std::map<Key, StepCostModel> cache;
    const Key key{static_cast<int>(c.device.type), c.device.index, static_cast<int>(c.dtype), c.n_embd, B, T};
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (auto it = cache.find(key); it != cache.end()) return it->second;
    }
    StepCostModel m = measure(c, B, T);
    std::lock_guard<std::mutex> lock(mutex);
    return cache.emplace(key, m).first->second;
}

double predict_step_ms(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T,
                       const StepCostModel& costs) {
    detail::check_step_settings("predict_step_ms", config, s, B, T);
    check_costs("predict_step_ms", costs);
    const GPTConfig c = with_settings(config, s);
    const int64_t b = s.micro_batch > 0 ? s.micro_batch : B;
    const double n = static_cast<double>(B / b);
    const double E = static_cast<double>(B * T), C = static_cast<double>(c.n_embd), V = static_cast<double>(c.vocab_size);
    const double L = static_cast<double>(c.n_layer), H = static_cast<double>(c.hidden()), es = static_cast<double>(dtype_bytes(c.dtype));
    const double hs = C / static_cast<double>(c.n_head);
    const double fc = c.mlp == MLPKind::SwiGLU ? 2 * H : H;
    // Multiply-adds per position of a layer's Linears, and the causal attention's flops per layer.
    const double layer_macs = C * (static_cast<double>(c.n_head + 2 * c.kv_heads()) * hs) + C * C + C * fc + H * C;
    const double attention = 2.0 * static_cast<double>(B) * static_cast<double>(T) * static_cast<double>(T) * C;
    const double forward = 2.0 * E * (L * layer_macs + V * C) + L * attention;
    // The products' rate at the micro-batch's rows: log-linear from one row of T to the batch.
    double rate = costs.flops_per_ms;
    if (B > 1 && b < B) {
        const double f = std::log(static_cast<double>(b)) / std::log(static_cast<double>(B));
        rate = costs.small_flops_per_ms + (costs.flops_per_ms - costs.small_flops_per_ms) * f;
    }
    double ms = 3.0 * forward / rate + n * costs.pass_ms;
    if (c.fused_head_loss) ms += 2.0 * E * C * V / rate;
    if (c.checkpoint_blocks) {
        const double blocks = std::ceil(L / static_cast<double>(std::max<int64_t>(c.checkpoint_every, 1)));
        ms += blocks * (2.0 * E * layer_macs + attention) / rate;
    }
    if (c.policy != SavePolicy::Input) ms += (2.0 * L + 1.0) * 2.0 * E * C * es / costs.bytes_per_ms;
    if (c.recompute_activation) ms += L * 2.0 * E * H * es / costs.bytes_per_ms;
    if (c.offload && c.device.is_cuda() && costs.host_bytes_per_ms > 0) {
        GPTConfig plain = c;
        plain.offload = false;
        plain.checkpoint_blocks = false;
        const double saved = static_cast<double>(
            c.checkpoint_blocks ? predicted_checkpoint_every_saved_bytes(c, b, T) : predicted_saved_bytes(plain, b, T));
        ms += n * 2.0 * saved / costs.host_bytes_per_ms;
    }
    return ms;
}

std::vector<MemorySettings> memory_settings_grid(const GPTConfig& config, int64_t B, StepOptimizer optimizer) {
    std::vector<int64_t> micro;
    for (int64_t b = B; b >= 1; b /= 2) {
        micro.push_back(b);
        if (b % 2 != 0) break;
    }
    std::vector<MemorySettings> grid;
    for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized})
        for (bool recompute : {false, true})
            for (bool fused : {false, true})
                for (int64_t every : {0, 1, 2})
                    for (bool offload : {false, true}) {
                        if (offload && !config.device.is_cuda()) continue;
                        for (int64_t b : micro) {
                            MemorySettings s;
                            s.policy = policy;
                            s.recompute_activation = recompute;
                            s.fused_head_loss = fused;
                            s.checkpoint_every = every;
                            s.offload = offload;
                            s.micro_batch = b;
                            s.optimizer = optimizer;
                            grid.push_back(s);
                        }
                    }
    return grid;
}

std::string settings_label(const MemorySettings& s) {
    std::string label = policy_name(s.policy);
    if (s.recompute_activation) label += ", recompute";
    if (s.fused_head_loss) label += ", fused";
    if (s.checkpoint_every > 0) label += ", ckpt " + std::to_string(s.checkpoint_every);
    if (s.offload) label += ", offload";
    if (s.micro_batch > 0) label += ", micro " + std::to_string(s.micro_batch);
    return label;
}

MemoryBudgetPlan plan_memory(const GPTConfig& config, int64_t budget_bytes, int64_t B, int64_t T,
                             const StepCostModel& costs, StepOptimizer optimizer) {
    NT_CHECK(budget_bytes > 0, "plan_memory: expected a budget > 0 bytes, got ", budget_bytes);
    detail::check_step_settings("plan_memory", config, MemorySettings(), B, T);
    check_costs("plan_memory", costs);
    MemoryBudgetPlan plan;
    bool first = true;
    for (const MemorySettings& s : memory_settings_grid(config, B, optimizer)) {
        const int64_t peak = predict_peak(config, s, B, T);
        if (first || peak < plan.smallest_peak) {
            plan.smallest_peak = peak;
            if (!plan.fits) {
                plan.settings = s;
                plan.predicted_peak = peak;
            }
        }
        first = false;
        if (peak > budget_bytes) continue;
        const double ms = predict_step_ms(config, s, B, T, costs);
        if (!plan.fits || ms < plan.predicted_step_ms || (ms == plan.predicted_step_ms && peak < plan.predicted_peak)) {
            plan.fits = true;
            plan.settings = s;
            plan.predicted_peak = peak;
            plan.predicted_step_ms = ms;
        }
    }
    if (!plan.fits) {
        plan.predicted_step_ms = predict_step_ms(config, plan.settings, B, T, costs);
        const StepMemory parts = step_memory(config, plan.settings, B, T);
        // The largest batch of B / 2^k rows whose smallest peak fits.
        std::string smaller = "no batch of fewer rows fits either";
        for (int64_t b = B / 2; b >= 1 && plan.largest_batch == 0; b /= 2) {
            const auto [peak, s] = smallest_peak(config, b, T, optimizer);
            if (peak > budget_bytes) continue;
            plan.largest_batch = b;
            smaller = "the largest smaller batch that fits is B = " + std::to_string(b) + " (" + settings_label(s) +
                      ", a peak of " + std::to_string(peak) + " bytes)";
        }
        plan.advice = "nothing fits in " + std::to_string(budget_bytes) + " bytes: the least budget that fits is " +
                      std::to_string(plan.smallest_peak) + " bytes (" + settings_label(plan.settings) +
                      "), of which the parameters, their gradients and the optimizers' state take " +
                      std::to_string(parts.parameters + parts.gradients + parts.optimizer_state) +
                      " bytes whatever the settings; " + smaller +
                      ": a larger budget, a smaller batch, a shorter sequence or a smaller model";
    }
    return plan;
}

MemoryBudgetPlan plan_memory(const GPTConfig& config, int64_t budget_bytes, int64_t B, int64_t T,
                             StepOptimizer optimizer) {
    detail::check_step_settings("plan_memory", config, MemorySettings(), B, T);  // before the calibration
    return plan_memory(config, budget_bytes, B, T, calibrate_step_costs(config, B, T), optimizer);
}

}  // namespace normtape
