// nn/memory/memory_plan.cpp: predict_peak and step_memory, the training step (nn/train/gpt_step.h)
// run as a dry run (Note [The step dry-run], nn/memory/memory_plan.h); the settings' checks.
#include "nn/memory/memory_plan.h"

#include <new>

#include "core/allocator.h"
#include "core/check.h"
#include "core/distributed.h"
#include "core/dry_run.h"
#include "nn/parallel/data_parallel.h"

namespace normtape {

GPTConfig with_settings(GPTConfig config, const MemorySettings& s) {
    NT_CHECK(s.checkpoint_every >= 0, "with_settings: expected checkpoint_every >= 0 (0: no block checkpointed), got ",
             s.checkpoint_every);
    NT_CHECK(s.micro_batch >= 0, "with_settings: expected micro_batch >= 0 (0: the whole batch), got ", s.micro_batch);
    config.policy = s.policy;
    config.recompute_activation = s.recompute_activation;
    config.fused_head_loss = s.fused_head_loss;
    config.checkpoint_blocks = s.checkpoint_every > 0;
    config.checkpoint_every = s.checkpoint_every > 0 ? s.checkpoint_every : 1;
    config.offload = s.offload;
    return config;
}

void detail::check_step_settings(const char* op, const GPTConfig& config, const MemorySettings& s, int64_t B,
                                 int64_t T) {
    NT_CHECK(s.checkpoint_every >= 0, op, ": expected checkpoint_every >= 0 (0: no block checkpointed), got ",
             s.checkpoint_every);
    NT_CHECK(s.micro_batch >= 0, op, ": expected micro_batch 0 (the whole batch) or a divisor of B, got ",
             s.micro_batch);
    detail::check_step_shape(op, with_settings(config, s), B, T);
    NT_CHECK(s.micro_batch <= B && (s.micro_batch == 0 || B % s.micro_batch == 0), op,
             ": expected micro_batch 0 (the whole batch) or a divisor of B = ", B, ", got ", s.micro_batch);
    NT_CHECK(s.world_size >= 1 && s.rank >= 0 && s.rank < s.world_size, op, ": expected world_size >= 1 and "
             "a rank in [0, world_size), got world_size ", s.world_size, " and rank ", s.rank);
    NT_CHECK(!s.shard_optimizer_state || s.world_size > 1, op,
             ": expected shard_optimizer_state with world_size > 1 (there is nothing to shard across), got "
             "world_size 1");
    NT_CHECK(s.bucket_cap_bytes >= 1, op, ": expected bucket_cap_bytes >= 1, got ", s.bucket_cap_bytes);
    // A rank's buckets hold world_size parts, and a part of Muon's is a whole matrix.
    const int64_t parameters = num_parameters(config);
    NT_CHECK_AS(ShapeError, double(s.world_size) * double(parameters) * 8.0 <= 0x1p60, op,
                ": expected world_size * num_parameters * 8 bytes (a bound of the gradient buckets) to fit in 2^60 "
                "bytes, got world_size ", s.world_size, " and ", parameters, " parameters");
}

namespace {

// The bytes of a list of tensors.
int64_t bytes_of(const std::vector<Tensor>& tensors) {
    int64_t n = 0;
    for (const Tensor& t : tensors) n += t.nbytes();
    return n;
}

// "backward, in LayerNormBackward, at h.3.ln_1": where the event happened.
std::string where(const MemoryEvent& e) {
    std::string at = e.backward ? "backward" : "forward or optimizer";
    if (e.node) at += std::string(", in ") + e.node;
    if (e.scope && !e.scope->empty()) at += ", at " + *e.scope;
    return at;
}

// The step of with_settings(config, s), dry-run (Note [The step dry-run]); settings checked.
StepMemory dry_step(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    const GPTConfig c = with_settings(config, s);
    const Device device = c.device;
    StepMemory m;
    std::vector<MemoryEvent> trace;
    dry_run(device, [&] {
        GPT model(c);
        m.parameters = m.gradients = bytes_of(model.parameters());
        GPTParamGroups groups = gpt_param_groups(model, s.optimizer);
        std::unique_ptr<ProcessGroup> group;
        std::unique_ptr<DataParallel> dp;
        if (s.world_size > 1) {
            group = ProcessGroup::stand_in(s.rank, s.world_size, device.is_cuda() ? device.index : 0);
            DataParallelOptions options;
            options.shard_optimizer_state = s.shard_optimizer_state;
            options.bucket_cap_bytes = s.bucket_cap_bytes;
            const int64_t before = memory_stats(device).allocated_bytes;
            dp = std::make_unique<DataParallel>(*group, model.parameters(), groups.adamw, groups.muon, options);
            m.data_parallel = memory_stats(device).allocated_bytes - before;
            groups = {dp->adamw_groups(), dp->muon_groups()};  // the shards under ZeRO-1
        }
        GPTOptimizers optimizers = GPTOptimizers::make(std::move(groups));
        m.adamw_moments = optimizers.adamw_moment_bytes();
        m.muon_momentum = optimizers.muon_momentum_bytes();
        const TensorOptions i64 = TensorOptions().dtype(DType::I64).device(device);
        const Tensor idx = empty({B, T}, i64), targets = empty({B, T}, i64);
        m.batch = idx.nbytes() + targets.nbytes();
        std::vector<Tensor> losses;  // kept until the step ends, as train_gpt keeps them
        gpt_step(model, optimizers, dp.get(), idx, targets, s.micro_batch, true, &losses);
        losses.clear();
        m.optimizer_state = memory_stats(device).allocated_bytes - m.parameters - m.batch - m.data_parallel;
        reset_peak_memory_stats(device);
        set_memory_trace(device, &trace);
        gpt_step(model, optimizers, dp.get(), idx, targets, s.micro_batch, true, &losses);
        set_memory_trace(device, nullptr);
        m.peak = memory_stats(device).peak_allocated_bytes;
    });
    for (const MemoryEvent& e : trace) {
        if (e.delta_bytes <= 0) continue;
        m.allocations.push_back(e.allocated_bytes);
        if (m.peak_at.empty() && e.allocated_bytes == m.peak) m.peak_at = where(e);
    }
    if (m.peak_at.empty()) m.peak_at = "before the step (the resident bytes)";
    return m;
}

// The dry run's host memory per layer, an estimate: the modules, the graph's nodes and their closures,
// the allocation trace (a 10,000-layer gpt2 of width 8 held about 59 KB a layer at its highest).
constexpr int64_t kDryRunBytesPerLayer = 64 << 10;

// step_memory, naming `op` in its errors: the checks, then the dry run if the host can hold it.
StepMemory checked_dry_step(const char* op, const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    detail::check_step_settings(op, config, s, B, T);
    const double need = double(config.n_layer) * double(kDryRunBytesPerLayer);
    const int64_t available = memory_available_bytes(Device::CPU);
    NT_CHECK_AS(OutOfMemoryError, need <= double(available), op, ": the dry run of a step of ", config.n_layer,
                " layers needs about ", need, " bytes of host memory, more than the ", available, " available");
    try {
        return dry_step(config, s, B, T);
    } catch (const std::bad_alloc&) {
        detail::throw_error<OutOfMemoryError>(op, ": the dry run of a step of ", config.n_layer,
                                              " layers needs more host memory than this process can allocate");
    }
}

}  // namespace

StepMemory step_memory(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    return checked_dry_step("step_memory", config, s, B, T);
}

int64_t predict_peak(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    return checked_dry_step("predict_peak", config, s, B, T).peak;
}

int64_t predicted_checkpoint_every_saved_bytes(const GPTConfig& config, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_checkpoint_every_saved_bytes", config, B, T);
    GPTConfig c = config;
    c.checkpoint_blocks = false;
    const int64_t full = predicted_saved_bytes(c, B, T);
    if (!config.checkpoint_blocks) return full;
    const int64_t layer = detail::layer_saved_bytes(c, B, T);
    const int64_t x = B * T * c.n_embd * static_cast<int64_t>(element_size(c.dtype));
    const int64_t checkpointed = c.n_layer / config.checkpoint_every + (c.n_layer % config.checkpoint_every != 0);
    const bool first_input_saved = c.embedding_norm && c.policy != SavePolicy::Input;
    return full - checkpointed * (layer - x) - (first_input_saved ? x : 0);
}

}  // namespace normtape
