// tests/test_memory_plan.cpp: predict_peak (nn/memory_plan.h) against the allocator's peak over a
// training step as train_gpt runs it, on a grid of presets, sizes, dtypes and memory settings; and
// the saved bytes of partial checkpointing (predicted_checkpoint_every_saved_bytes); the planner
// (nn/memory_budget.h). CPU only: the CUDA terms of the replay are read from the code, not
// measured here (scripts/gpu_check.sh budget measures them with train_gpt --memory-sweep).
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// A tiny model of each preset, at sizes of its own (vocabularies 61, 72, 80; head sizes 8 and 12),
// whose activations and gradients make about three quarters of a [8, 32] step's peak, the
// parameters and AdamW state the rest: 2% of the peak is a small part of what is predicted.
GPTConfig small_config(const std::string& arch) {
    GPTConfig c = gpt_config(arch);
    c.block_size = 32;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.vocab_size = 72;
    if (arch == "nanochat") {
        c.n_layer = 3;
        c.vocab_size = 61;
    }
    if (arch == "llama") {
        c.n_embd = 48;  // hs 12, H = 128
        c.n_kv_head = 2;
        c.vocab_size = 80;
    }
    return c;
}

// What the allocator saw over one training step of train_gpt's loop (Note [The step replayed]),
// after one step before it, less what was allocated before the model was made: the peak, and
// allocated_bytes after each allocation (the trace's events of positive delta).
struct Measured {
    int64_t peak = 0;
    std::vector<int64_t> allocations;
};

Measured measure(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    const GPTConfig c = with_settings(config, s);
    const int64_t before = cpu_allocated();
    manual_seed(11);
    GPT model(c);
    std::vector<ParamGroup> groups(2);  // train_gpt's: weight decay for matrices only
    groups[0].weight_decay = 0.1;
    groups[1].weight_decay = 0.0;
    for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    AdamW optimizer(groups, AdamWOptions{});
    TokenBatch b = token_batch(c, B, T);
    const int64_t rows = s.micro_batch > 0 ? s.micro_batch : B, n = B / rows;
    // train_gpt's step (Note [Micro-batches], examples/train_gpt/train_gpt.cpp): each micro-batch's
    // rows copied, its loss scaled by 1/n and kept, detached, until the step ends.
    auto rows_of = [&](const Tensor& t, int64_t k) { return n == 1 ? t : t.narrow(0, k * rows, rows).clone(); };
    auto step = [&] {
        std::vector<Tensor> losses;
        for (int64_t k = 0; k < n; ++k) {
            Tensor loss = model.loss(rows_of(b.idx, k), rows_of(b.targets, k));
            if (n == 1) loss.backward();
            else scale(loss, 1.0 / static_cast<double>(n)).backward();
            losses.push_back(loss.detach());
        }
        Tensor norm = clip_grad_norm_tensor_(model.parameters(), 1.0);
        optimizer.set_lr(1e-3);
        optimizer.step_if_finite(norm);
        optimizer.zero_grad();
    };
    step();
    std::vector<MemoryEvent> trace;
    reset_peak_memory_stats(Device::CPU);
    set_memory_trace(Device::CPU, &trace);
    step();
    set_memory_trace(Device::CPU, nullptr);
    Measured m{memory_stats(Device::CPU).peak_allocated_bytes - before, {}};
    for (const MemoryEvent& e : trace)
        if (e.delta_bytes > 0) m.allocations.push_back(e.allocated_bytes - before);
    return m;
}

// The first allocation at which the replay and the allocator part, or -1. Two allocations in
// swapped order are the same step (a bf16 product's copies of its two operands are made in the
// order that the compiler evaluates a call's arguments).
int64_t first_difference(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
        if (i >= a.size() || i >= b.size()) return static_cast<int64_t>(i);
        if (a[i] == b[i]) continue;
        const int64_t before = i > 0 ? a[i - 1] : 0;
        if (i + 1 < a.size() && i + 1 < b.size() && a[i + 1] == b[i + 1] && a[i] - before == a[i + 1] - b[i]) {
            ++i;
            continue;
        }
        return static_cast<int64_t>(i);
    }
    return -1;
}

struct Setting {
    std::string arch;
    DType dtype;
    MemorySettings s;
    bool tie;
    double dropout = 0.0;
    int64_t vocab = 0;  // 0: small_config's
};

// The grid: every preset, dtype, policy and checkpoint_every (3 x 2 x 3 x 3 = 54), the five
// switches (recompute, offload, micro-batch B or B/2, tied embeddings, fused head loss) drawn per
// setting from a fixed sequence; and a few more (dropout, f64, checkpoint every 3, a large vocabulary).
std::vector<Setting> grid() {
    std::vector<Setting> g;
    uint32_t draw = 12345;
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (DType dtype : {DType::F32, DType::BF16})
            for (SavePolicy policy : kSavePolicies)
                for (int64_t every : {0, 1, 2}) {
                    draw = draw * 1103515245u + 12345u;  // a fixed sequence of 4-bit draws
                    const uint32_t bits = draw >> 16;
                    Setting t{arch, dtype, {}, (bits & 8) != 0};
                    t.s.policy = policy;
                    t.s.checkpoint_every = every;
                    t.s.recompute_activation = (bits & 1) != 0;
                    t.s.offload = (bits & 2) != 0;
                    t.s.micro_batch = (bits & 4) != 0 ? 4 : 0;  // of B = 8
                    t.s.fused_head_loss = (bits & 16) != 0;
                    g.push_back(t);
                }
    Setting dropout{"gpt2", DType::F32, {}, false, 0.1};
    dropout.s.checkpoint_every = 1;
    g.push_back(dropout);
    Setting f64{"llama", DType::F64, {}, true};
    f64.s.policy = SavePolicy::Output;
    f64.s.micro_batch = 4;
    g.push_back(f64);
    Setting every3{"nanochat", DType::BF16, {}, false};
    every3.s.checkpoint_every = 3;
    every3.s.policy = SavePolicy::Normalized;
    g.push_back(every3);
    // A vocabulary of 1000: the logits, their gradient and lm_head's products make the peak.
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (DType dtype : {DType::F32, DType::BF16}) {
            Setting big{arch, dtype, {}, dtype == DType::BF16, 0.0, 1000};
            big.s.checkpoint_every = dtype == DType::F32 ? 1 : 0;
            big.s.policy = dtype == DType::F32 ? SavePolicy::Output : SavePolicy::Input;
            big.s.micro_batch = dtype == DType::F32 ? 4 : 0;
            g.push_back(big);
        }
    return g;
}

}  // namespace

TEST_SUITE("memory_plan") {

TEST_CASE("memory_plan: predict_peak holds the measured peak of a training step, at most 2% above it") {
    const int64_t B = 8, T = 32;
    // One thread: the allocations do not depend on the thread count (Note [Deterministic parallel
    // cpu kernels]), and the grid's tiny kernels run far slower on threads that wait for a busy core.
    ThreadCountGuard one_thread(1);
    for (const Setting& t : grid()) {
        GPTConfig c = small_config(t.arch);
        c.dtype = t.dtype;
        c.tie_embeddings = t.tie;
        c.dropout = t.dropout;
        if (t.vocab > 0) c.vocab_size = t.vocab;
        INFO(t.arch, " ", std::string(dtype_name(t.dtype)), " policy ", std::string(policy_name(t.s.policy)),
             " recompute ", t.s.recompute_activation, " fused ", t.s.fused_head_loss, " checkpoint_every ",
             t.s.checkpoint_every, " offload ", t.s.offload, " micro_batch ", t.s.micro_batch, " tie ", t.tie,
             " dropout ", t.dropout, " V ", c.vocab_size);
        const Measured measured = measure(c, t.s, B, T);
        const StepMemory plan = step_memory(c, t.s, B, T);
        INFO("measured ", measured.peak, ", predicted ", plan.peak, " at ", plan.peak_at);
        CHECK(plan.parameters == num_parameters(c) * static_cast<int64_t>(element_size(t.dtype)));
        CHECK(plan.peak == predict_peak(c, t.s, B, T));
        CHECK(measured.peak <= plan.peak);
        CHECK(static_cast<double>(plan.peak) <= 1.02 * static_cast<double>(measured.peak));
        // The replay is the step's allocations themselves, not only their highest point.
        const int64_t at = first_difference(measured.allocations, plan.allocations);
        INFO("allocations: measured ", measured.allocations.size(), ", replayed ", plan.allocations.size(),
             "; first difference at ", at);
        CHECK(at == -1);
    }
}

TEST_CASE("memory_plan: on CUDA the replay adds the kernels' temporaries and AdamW's table (not measured here)") {
    // The CUDA terms are read from the code; here only their direction: an f32 step (no bf16 copies
    // on either device) on CUDA takes at least the cpu's bytes, and the resident bytes differ by the table.
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (int64_t every : {0, 1}) {
            INFO(arch, " checkpoint_every ", every);
            GPTConfig c = small_config(arch);
            MemorySettings s;
            s.checkpoint_every = every;
            s.offload = every == 1;
            const StepMemory cpu = step_memory(c, s, 4, 24);
            c.device = Device::CUDA;
            const StepMemory cuda = step_memory(c, s, 4, 24);
            CHECK(cuda.peak >= cpu.peak);
            CHECK(cuda.optimizer_state > cpu.optimizer_state);
            CHECK(cuda.parameters == cpu.parameters);
            CHECK_FALSE(cuda.peak_at.empty());
        }
}

TEST_CASE("memory_plan: with_settings sets the model's fields, and bad sizes are refused") {
    MemorySettings s;
    s.policy = SavePolicy::Normalized;
    s.recompute_activation = false;
    s.checkpoint_every = 2;
    s.offload = true;
    GPTConfig c = with_settings(small_config("gpt2"), s);
    CHECK(c.policy == SavePolicy::Normalized);
    CHECK_FALSE(c.recompute_activation);
    CHECK(c.checkpoint_blocks);
    CHECK(c.checkpoint_every == 2);
    CHECK(c.offload);
    CHECK_FALSE(with_settings(c, MemorySettings{}).checkpoint_blocks);
    s.micro_batch = 3;
    check_throws<Error>([&] { predict_peak(c, s, 4, 8); },
                        {"predict_peak", "micro_batch", "divisor of B = 4", "got 3"});
    check_throws<Error>([&] { predict_peak(c, MemorySettings{}, 4, 33); },
                        {"predict_peak", "block_size = 32", "got 33"});
    s.micro_batch = 0;
    s.checkpoint_every = -1;
    check_throws<Error>([&] { with_settings(c, s); }, {"with_settings", "checkpoint_every >= 0", "got -1"});
}

TEST_CASE("memory_plan: partial checkpointing saves predicted_checkpoint_every_saved_bytes, to the byte") {
    // One thread: the allocations do not depend on the thread count (Note [Deterministic parallel
    // cpu kernels]), and the grid's tiny kernels run far slower on threads that wait for a busy core.
    ThreadCountGuard one_thread(1);
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (SavePolicy policy : kSavePolicies)
            for (int64_t every : {1, 2, 3}) {
                INFO(arch, " policy ", std::string(policy_name(policy)), " checkpoint_every ", every);
                GPTConfig c = small_config(arch);
                c.n_layer = 4;
                c.policy = policy;
                c.checkpoint_blocks = true;
                c.checkpoint_every = every;
                manual_seed(3);
                GPT model(c);
                TokenBatch b = token_batch(c, 2, 9);
                const int64_t before = saved_bytes();
                Tensor loss = model.loss(b.idx, b.targets);
                CHECK(saved_bytes() - before == predicted_checkpoint_every_saved_bytes(c, 2, 9));
                if (every == 1)
                    CHECK(predicted_checkpoint_every_saved_bytes(c, 2, 9) == predicted_checkpoint_saved_bytes(c, 2, 9));
            }
}

TEST_CASE("memory_plan: with 4 micro-batches predict_peak holds the measured peak, the later losses kept") {
    // One thread: the allocations do not depend on the thread count (Note [Deterministic parallel
    // cpu kernels]), and the grid's tiny kernels run far slower on threads that wait for a busy core.
    ThreadCountGuard one_thread(1);
    for (const char* arch : {"gpt2", "llama"}) {
        INFO(arch);
        GPTConfig c = small_config(arch);
        MemorySettings s;
        s.micro_batch = 2;  // of B = 8
        const int64_t measured = measure(c, s, 8, 32).peak, predicted = predict_peak(c, s, 8, 32);
        CHECK(measured <= predicted);
        CHECK(static_cast<double>(predicted) <= 1.02 * static_cast<double>(measured));
    }
}

TEST_CASE("memory_plan: plan_memory picks the fastest setting predicted to fit, or says what would fit") {
    GPTConfig c = small_config("gpt2");
    const int64_t B = 8, T = 32;
    StepCostModel costs;  // fixed rates: the plan is a function of the config alone
    costs.flops_per_ms = 1e9;
    costs.small_flops_per_ms = 2e8;
    costs.bytes_per_ms = 1e8;
    costs.pass_ms = 0.5;
    int64_t smallest = INT64_MAX, largest = 0;
    for (const MemorySettings& s : memory_settings_grid(c, B)) {
        CHECK(!s.offload);  // not on the cpu
        smallest = std::min(smallest, predict_peak(c, s, B, T));
        largest = std::max(largest, predict_peak(c, s, B, T));
    }
    REQUIRE(smallest < largest);
    for (int64_t budget : {smallest, (smallest + largest) / 2, largest, 2 * largest}) {
        INFO("budget ", budget);
        const MemoryBudgetPlan plan = plan_memory(c, budget, B, T, costs);
        REQUIRE(plan.fits);
        CHECK(plan.predicted_peak == predict_peak(c, plan.settings, B, T));
        CHECK(plan.predicted_peak <= budget);
        CHECK(plan.smallest_peak == smallest);
        CHECK(plan.predicted_step_ms == predict_step_ms(c, plan.settings, B, T, costs));
        for (const MemorySettings& s : memory_settings_grid(c, B))  // nothing that fits is faster
            if (predict_peak(c, s, B, T) <= budget) CHECK(predict_step_ms(c, s, B, T, costs) >= plan.predicted_step_ms);
    }
    // The largest budget buys the plain step: Input, no recompute, no fused loss, no checkpoint, one batch.
    const MemoryBudgetPlan roomy = plan_memory(c, 2 * largest, B, T, costs);
    CHECK(settings_label(roomy.settings) == "input, micro 8");
    const MemoryBudgetPlan tight = plan_memory(c, smallest - 1, B, T, costs);
    CHECK(!tight.fits);
    CHECK(tight.predicted_peak == smallest);
    CHECK(tight.advice.find("the least budget that fits is " + std::to_string(smallest)) != std::string::npos);
    check_throws<Error>([&] { plan_memory(c, 0, B, T, costs); }, {"plan_memory", "budget", "0"});
}

TEST_CASE("memory_plan: calibrate_step_costs measures positive rates on the cpu, once") {
    GPTConfig c = small_config("gpt2");
    const StepCostModel a = calibrate_step_costs(c, 4, 16), b = calibrate_step_costs(c, 4, 16);
    CHECK(a.flops_per_ms > 0);
    CHECK(a.small_flops_per_ms > 0);
    CHECK(a.bytes_per_ms > 0);
    CHECK(a.pass_ms > 0);
    CHECK(a.host_bytes_per_ms == 0);
    CHECK(b.flops_per_ms == a.flops_per_ms);  // the cached measurement
}

}  // TEST_SUITE
