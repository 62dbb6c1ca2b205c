// tests/test_memory_plan.cpp: predict_peak (nn/memory/memory_plan.h), the dry run of a training
// step, against the allocator's peak over the same step run for real (gpt_step, as train_gpt runs
// it), on a grid of presets, sizes, dtypes and memory settings; the saved bytes of partial
// checkpointing (predicted_checkpoint_every_saved_bytes); the planner (nn/memory/memory_budget.h).
// On the cpu; scripts/gpu_check.sh budget measures CUDA's with train_gpt --memory-sweep.
#include <sys/resource.h>

#include <cmath>
#include <functional>
#include <memory>
#include <utility>

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

// Fixed rates, in place of calibrate_step_costs's measurement: a plan is then a function of the
// config alone.
StepCostModel fixed_costs() {
    StepCostModel costs;
    costs.flops_per_ms = 1e9;
    costs.small_flops_per_ms = 2e8;
    costs.bytes_per_ms = 1e8;
    costs.pass_ms = 0.5;
    return costs;
}

// What the allocator saw over one training step (gpt_step, Note [The training step]) run for
// real, after one step before it, less what was allocated before the model was made: the peak,
// and allocated_bytes after each allocation (the trace's events of positive delta); and the bytes
// of the optimizers' state.
struct Measured {
    int64_t peak = 0;
    std::vector<int64_t> allocations;
    int64_t adamw_moments = 0, muon_momentum = 0, masters = 0;
};

Measured measure(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T) {
    const GPTConfig c = with_settings(config, s);
    const Device device = c.device;
    const int64_t before = memory_stats(device).allocated_bytes;
    manual_seed(11);
    GPT model(c);
    GPTOptimizers optimizers = GPTOptimizers::make(gpt_param_groups(model, s.optimizer));
    TokenBatch b = token_batch(c, B, T);
    std::vector<Tensor> losses;
    gpt_step(model, optimizers, nullptr, b.idx, b.targets, s.micro_batch, true, &losses);
    losses.clear();
    std::vector<MemoryEvent> trace;
    synchronize(device);
    reset_peak_memory_stats(device);
    set_memory_trace(device, &trace);
    gpt_step(model, optimizers, nullptr, b.idx, b.targets, s.micro_batch, true, &losses);
    set_memory_trace(device, nullptr);
    Measured m{memory_stats(device).peak_allocated_bytes - before, {}, optimizers.adamw_moment_bytes(),
               optimizers.muon_momentum_bytes(), optimizers.master_bytes()};
    for (const MemoryEvent& e : trace)
        if (e.delta_bytes > 0) m.allocations.push_back(e.allocated_bytes - before);
    return m;
}

// The first allocation at which the dry run and the allocator part, or -1.
int64_t first_difference(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
        if (i >= a.size() || i >= b.size() || a[i] != b[i]) return static_cast<int64_t>(i);
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
// setting from a fixed sequence; and a few more (dropout, f64, checkpoint every 3, Muon, a large vocabulary).
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
    // Muon for the blocks' matrices (train_gpt --optimizer muon): its state in place of AdamW's,
    // and its step allocates nothing on the cpu (Eigen's heap); tied and untied, each dtype.
    for (const char* arch : {"gpt2", "nanochat"})
        for (DType dtype : {DType::F32, DType::BF16}) {
            Setting muon{arch, dtype, {}, dtype == DType::BF16};
            muon.s.optimizer = StepOptimizer::Muon;
            muon.s.policy = dtype == DType::F32 ? SavePolicy::Output : SavePolicy::Normalized;
            muon.s.checkpoint_every = std::string(arch) == "nanochat" ? 1 : 0;
            muon.s.micro_batch = std::string(arch) == "gpt2" ? 4 : 0;
            g.push_back(muon);
        }
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

TEST_CASE("memory_plan: predict_peak is the measured peak of a training step, to the byte") {
    const int64_t B = 8, T = 32;
    // One thread: the allocations do not depend on the thread count (Note [Deterministic parallel
    // cpu kernels]), and the grid's tiny kernels run far slower on threads that wait for a busy core.
    ThreadCountGuard one_thread(1);
    std::vector<Device> devices{Device::CPU};
    if (cuda_is_available()) devices.push_back(Device::CUDA);  // scripts/gpu_check.sh runs it there
    int64_t item = 0;
    for (Device device : devices)
        for (const Setting& t : grid()) {
            if (!in_test_part(item++)) continue;
            GPTConfig c = small_config(t.arch);
            c.device = device;
            c.dtype = t.dtype;
            c.tie_embeddings = t.tie;
            c.dropout = t.dropout;
            if (t.vocab > 0) c.vocab_size = t.vocab;
            INFO(device_name(device), " ", std::string(t.arch), " ", std::string(dtype_name(t.dtype)), " policy ",
                 std::string(policy_name(t.s.policy)), " recompute ", t.s.recompute_activation, " fused ",
                 t.s.fused_head_loss, " checkpoint_every ", t.s.checkpoint_every, " offload ", t.s.offload,
                 " micro_batch ", t.s.micro_batch, " tie ", t.tie, " dropout ", t.dropout, " V ", c.vocab_size,
                 " optimizer ", std::string(t.s.optimizer == StepOptimizer::Muon ? "muon" : "adamw"));
            const Measured measured = measure(c, t.s, B, T);
            const StepMemory plan = step_memory(c, t.s, B, T);
            INFO("measured ", measured.peak, ", predicted ", plan.peak, " at ", plan.peak_at);
            CHECK(plan.parameters == num_parameters(c) * static_cast<int64_t>(element_size(t.dtype)));
            // The resident state is the optimizers' own tensors, to the byte.
            CHECK(plan.adamw_moments == measured.adamw_moments);
            CHECK(plan.muon_momentum == measured.muon_momentum);
            if (device.is_cpu())  // on CUDA AdamW's device table besides
                CHECK(plan.optimizer_state == measured.adamw_moments + measured.muon_momentum + measured.masters);
            CHECK((plan.muon_momentum > 0) == (t.s.optimizer == StepOptimizer::Muon));
            CHECK(plan.peak == predict_peak(c, t.s, B, T));
            if (device.is_cuda() && t.s.offload) {  // a bound: the dry run cannot time the copies
                CHECK(measured.peak <= plan.peak);
                continue;
            }
            CHECK(measured.peak == plan.peak);
            // The dry run is the step's allocations themselves, not only their highest point.
            const int64_t at = first_difference(measured.allocations, plan.allocations);
            INFO("allocations: measured ", measured.allocations.size(), ", dry run ", plan.allocations.size(),
                 "; first difference at ", at);
            CHECK(at == -1);
        }
}

TEST_CASE("memory_plan: Muon's momentum is half of AdamW's moments for the same matrices, as step_memory says") {
    // The state only: made by the optimizers' constructors, no step needed.
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (DType dtype : {DType::F32, DType::BF16, DType::F64})
            for (bool tie : {false, true}) {
                INFO(arch, " ", std::string(dtype_name(dtype)), " tie ", tie);
                GPTConfig c = small_config(arch);
                c.dtype = dtype;
                c.tie_embeddings = tie;
                manual_seed(12);
                GPT model(c);
                MemorySettings s_adamw, s_muon;
                s_muon.optimizer = StepOptimizer::Muon;
                const StepMemory plan_adamw = step_memory(c, s_adamw, 8, 32), plan_muon = step_memory(c, s_muon, 8, 32);
                const GPTOptimizers adamw_run = GPTOptimizers::make(gpt_param_groups(model, StepOptimizer::AdamW)),
                                    muon_run = GPTOptimizers::make(gpt_param_groups(model, StepOptimizer::Muon));
                const Measured in_adamw{0, {}, adamw_run.adamw_moment_bytes(), 0, adamw_run.master_bytes()};
                const Measured in_muon{0, {}, muon_run.adamw_moment_bytes(), muon_run.muon_momentum_bytes(),
                                       muon_run.master_bytes()};
                CHECK(plan_adamw.adamw_moments == in_adamw.adamw_moments);
                CHECK(plan_adamw.muon_momentum == 0);
                CHECK(plan_muon.adamw_moments == in_muon.adamw_moments);
                CHECK(plan_muon.muon_momentum == in_muon.muon_momentum);
                CHECK(in_muon.masters == in_adamw.masters);  // a master per bf16 parameter, whichever optimizer
                CHECK(plan_muon.optimizer_state == in_muon.adamw_moments + in_muon.muon_momentum + in_muon.masters);
                // AdamW's moments of Muon's matrices, as the AdamW run holds them.
                int64_t matrices_in_adamw = 0;
                for (const Tensor& p : muon_run.muon->groups()[0].params) {
                    const AdamW::ParamState& st = adamw_run.adamw->state(p);
                    matrices_in_adamw += st.m.nbytes() + st.v.nbytes();
                }
                REQUIRE(matrices_in_adamw > 0);
                CHECK(2 * plan_muon.muon_momentum == matrices_in_adamw);
                CHECK(plan_adamw.adamw_moments - plan_muon.adamw_moments == matrices_in_adamw);
                // The rest of the step is the same: the peak moves by the state's difference only (cpu).
                CHECK(plan_adamw.peak - plan_muon.peak == plan_adamw.optimizer_state - plan_muon.optimizer_state);
            }
}

TEST_CASE("memory_plan: a CUDA prediction needs its GPU, and without one says so") {
    GPTConfig c = small_config("gpt2");
    c.device = Device::CUDA;
    if (cuda_is_available()) {  // the direction only; scripts/gpu_check.sh measures it to the byte
        const StepMemory cpu = step_memory(small_config("gpt2"), MemorySettings{}, 4, 24);
        const StepMemory cuda = step_memory(c, MemorySettings{}, 4, 24);
        CHECK(cuda.peak >= cpu.peak);
        CHECK(cuda.optimizer_state > cpu.optimizer_state);  // AdamW's device table
        CHECK(cuda.parameters == cpu.parameters);
        return;
    }
    check_throws<DeviceError>([&] { predict_peak(c, MemorySettings{}, 4, 24); },
                              {"dry_run", cuda_is_built() ? "expected a visible GPU" : "CUDA backend"});
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

TEST_CASE("memory_plan: sizes whose bytes would overflow int64 are ShapeErrors naming the product, at every entry point") {
    const GPTConfig gpt2 = gpt_config("gpt2");
    const MemorySettings plain;
    // The predicted peak wrapped from B ~ 2^43 at T 64, and B 2^50 divided by zero (SIGFPE).
    for (int64_t B : {int64_t(1) << 45, int64_t(1) << 50, INT64_MAX}) {
        INFO("B ", B);
        check_throws_in_child<ShapeError>([&] { predict_peak(gpt2, plain, B, 64); },
                                          {"predict_peak", "B * T positions", "B " + std::to_string(B), "2^58 bytes"});
        check_throws_in_child<ShapeError>([&] { predicted_saved_bytes(gpt2, B, 64); },
                                          {"predicted_saved_bytes", "B * T positions"});
    }
    CHECK(predict_peak(gpt2, plain, int64_t(1) << 20, 64) > predict_peak(gpt2, plain, int64_t(1) << 19, 64));
    // block_size INT64_MAX with T 2^62 divided by zero: learned positions are too many parameters,
    // rotary ones too many positions.
    GPTConfig long_context = gpt2;
    long_context.block_size = INT64_MAX;
    check_throws_in_child<ShapeError>([&] { predict_peak(long_context, plain, 1, int64_t(1) << 62); },
                                      {"GPTConfig", "2^54 parameters", "block_size 9223372036854775807"});
    GPTConfig rotary = gpt_config("llama");
    rotary.block_size = INT64_MAX;
    check_throws_in_child<ShapeError>([&] { predict_peak(rotary, plain, 1, int64_t(1) << 62); },
                                      {"predict_peak", "B 1 * T 4611686018427387904"});
    // V 2^44 with C 2^16: 2^61 parameters, whose bytes came out negative.
    GPTConfig wide = gpt2;
    wide.vocab_size = int64_t(1) << 44;
    wide.n_embd = int64_t(1) << 16;
    wide.n_head = 1024;
    for (const auto& call : std::vector<std::function<void()>>{[&] { num_parameters(wide); },
                                                               [&] { predict_peak(wide, plain, 1, 8); },
                                                               [&] { step_memory(wide, plain, 1, 8); },
                                                               [&] { check_config(wide); }})
        check_throws_in_child<ShapeError>(call, {"GPTConfig", "at most 2^54 parameters", "vocab_size 17592186044416"});
    // Negative batches are refused, not priced.
    for (const auto& [name, call] : std::vector<std::pair<std::string, std::function<void()>>>{
             {"predicted_saved_bytes", [&] { predicted_saved_bytes(gpt2, -16, 8); }},
             {"predicted_saving_bytes", [&] { predicted_saving_bytes(gpt2, -16, 8); }},
             {"predicted_checkpoint_saved_bytes", [&] { predicted_checkpoint_saved_bytes(gpt2, -16, 8); }},
             {"predicted_recompute_saving_bytes", [&] { predicted_recompute_saving_bytes(gpt2, -16, 8); }},
             {"predicted_checkpoint_every_saved_bytes", [&] { predicted_checkpoint_every_saved_bytes(gpt2, -16, 8); }},
             {"predict_peak", [&] { predict_peak(gpt2, plain, -16, 8); }}})
        check_throws<ShapeError>(call, {name, "B >= 1", "got -16"});
}

TEST_CASE("memory_plan: predict_step_ms prices a CUDA offload of one checkpointed layer, with no GPU") {
    // From predicted_checkpoint_every_saved_bytes, which a config of 0 layers once broke for 1.
    GPTConfig cuda = small_config("gpt2");
    cuda.n_layer = 1;
    cuda.device = Device::CUDA;
    StepCostModel costs = fixed_costs();
    costs.host_bytes_per_ms = 1e7;
    MemorySettings offload;
    offload.offload = true;
    offload.checkpoint_every = 1;
    CHECK(std::isfinite(predict_step_ms(cuda, offload, 2, 9, costs)));
}

TEST_CASE("memory_plan: Muon's buckets on many ranks that would overflow int64 are a ShapeError") {
    GPTConfig c = gpt_config("llama");  // 2^51.6 parameters, of which c_fc holds 2^50.4
    c.vocab_size = 2;
    c.n_embd = int64_t(1) << 24;
    c.n_head = int64_t(1) << 14;
    c.n_layer = 1;
    c.block_size = 1;
    MemorySettings s;
    s.optimizer = StepOptimizer::Muon;
    s.world_size = 2048;  // 2048 parts of a whole matrix in one rank's bucket: 2^63.4 bytes
    check_throws_in_child<ShapeError>([&] { predict_peak(c, s, 1, 1); },
                                      {"predict_peak", "world_size * num_parameters * 8 bytes", "world_size 2048"});
}

TEST_CASE("memory_plan: the formulas check the config first: n_head 0 is a ShapeError, not a division by zero") {
    GPTConfig c = small_config("gpt2");
    c.n_head = 0;
    check_throws_in_child<ShapeError>([&] { predicted_saved_bytes(c, 2, 8); }, {"GPTConfig", "positive sizes", "n_head 0"});
    c.checkpoint_blocks = true;
    check_throws_in_child<ShapeError>([&] { predicted_checkpoint_every_saved_bytes(c, 2, 8); },
                                      {"GPTConfig", "n_head 0"});
    check_throws_in_child<ShapeError>([&] { num_parameters(c); }, {"GPTConfig", "n_head 0"});
}

TEST_CASE("memory_plan: checkpoint_every past n_layer checkpoints block 0 alone, even at INT64_MAX") {
    GPTConfig c = small_config("gpt2");  // 2 layers
    c.checkpoint_blocks = true;
    c.checkpoint_every = 2;
    const int64_t every_two = predicted_checkpoint_every_saved_bytes(c, 2, 8);
    c.checkpoint_every = INT64_MAX;  // (L + k - 1) / k overflowed: more than no checkpointing at all
    CHECK(predicted_checkpoint_every_saved_bytes(c, 2, 8) == every_two);
    c.checkpoint_blocks = false;
    CHECK(every_two < predicted_checkpoint_every_saved_bytes(c, 2, 8));
}

TEST_CASE("memory_plan: 10,000 layers are dry-run without recursion, and a dry run the host cannot hold is OutOfMemoryError") {
    GPTConfig deep = small_config("gpt2");
    deep.n_layer = 10000;
    deep.n_embd = 8;
    deep.n_head = 2;
    // A graph released recursively would overflow the stack (SIGSEGV).
    const ChildOutcome o = outcome_in_child([&] {
        const int64_t peak = predict_peak(deep, MemorySettings{}, 1, 8);
        MemorySettings ckpt;
        ckpt.checkpoint_every = 3;
        if (peak <= 0 || step_memory(deep, ckpt, 1, 8).peak <= 0) throw Error("no peak");
    });
    CAPTURE(o.message);
    CHECK(o.how == ChildOutcome::Returned);
#if !defined(__SANITIZE_ADDRESS__)  // ASan's shadow memory leaves no room for an address-space cap
    deep.n_layer = 1'000'000'000;
    check_throws_in_child<OutOfMemoryError>(
        [&] {
            const rlimit cap{rlim_t(2) << 30, rlim_t(2) << 30};  // 2 GiB of address space
            ::setrlimit(RLIMIT_AS, &cap);
            predict_peak(deep, MemorySettings{}, 1, 8);
        },
        {"predict_peak", "1000000000 layers", "host memory"});
#endif
}

TEST_CASE("memory_plan: predict_step_ms and plan_memory refuse costs that are not rates and batches they cannot price") {
    const GPTConfig c = small_config("gpt2");
    const StepCostModel costs = fixed_costs();
    const MemorySettings plain;
    CHECK(std::isfinite(predict_step_ms(c, plain, 16, 8, costs)));
    // StepCostModel{} gave inf ms and still "fit"; NaN or negative rates gave NaN or negative times.
    check_throws<Error>([&] { predict_step_ms(c, plain, 16, 8, StepCostModel{}); },
                        {"predict_step_ms", "costs.flops_per_ms > 0", "got 0"});
    check_throws<Error>([&] { plan_memory(c, int64_t(1) << 40, 16, 8, StepCostModel{}); },
                        {"plan_memory", "costs.flops_per_ms > 0"});
    for (auto [field, value] : std::vector<std::pair<double StepCostModel::*, double>>{
             {&StepCostModel::flops_per_ms, NAN}, {&StepCostModel::small_flops_per_ms, -1.0},
             {&StepCostModel::bytes_per_ms, INFINITY}, {&StepCostModel::host_bytes_per_ms, -1.0},
             {&StepCostModel::pass_ms, NAN}}) {
        StepCostModel bad = costs;
        bad.*field = value;
        check_throws<Error>([&] { predict_step_ms(c, plain, 16, 8, bad); }, {"predict_step_ms", "costs.", "finite"});
    }
    MemorySettings three = plain;
    three.micro_batch = 3;  // was priced as 5 micro-batches of B 16
    check_throws<Error>([&] { predict_step_ms(c, three, 16, 8, costs); },
                        {"predict_step_ms", "divisor of B = 16", "got 3"});
    check_throws<ShapeError>([&] { predict_step_ms(c, plain, -16, 8, costs); }, {"predict_step_ms", "B >= 1", "got -16"});
    check_throws<ShapeError>([&] { plan_memory(c, int64_t(1) << 40, -16, 8, costs); }, {"plan_memory", "got -16"});
}

TEST_CASE("memory_plan: when nothing fits, plan_memory names the largest smaller batch that would") {
    const GPTConfig c = small_config("gpt2");
    const StepCostModel costs = fixed_costs();
    auto smallest = [&](int64_t B) {
        int64_t least = INT64_MAX;
        for (const MemorySettings& s : memory_settings_grid(c, B)) least = std::min(least, predict_peak(c, s, B, 32));
        return least;
    };
    REQUIRE(smallest(4) < smallest(8));
    REQUIRE(smallest(8) < smallest(16));
    const int64_t budget = (smallest(4) + smallest(8)) / 2;  // B 4 fits, B 8 does not
    const MemoryBudgetPlan plan = plan_memory(c, budget, 16, 32, costs);
    CHECK_FALSE(plan.fits);
    CHECK(plan.largest_batch == 4);
    CAPTURE(plan.advice);
    CHECK(plan.advice.find("the largest smaller batch that fits is B = 4 (") != std::string::npos);
    const MemoryBudgetPlan none = plan_memory(c, smallest(1) - 1, 16, 32, costs);
    CHECK(none.largest_batch == 0);
    CHECK(none.advice.find("no batch of fewer rows fits either") != std::string::npos);
}

TEST_CASE("memory_plan: partial checkpointing saves predicted_checkpoint_every_saved_bytes, to the byte, one layer too") {
    // One thread: the allocations do not depend on the thread count (Note [Deterministic parallel
    // cpu kernels]), and the grid's tiny kernels run far slower on threads that wait for a busy core.
    ThreadCountGuard one_thread(1);
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (SavePolicy policy : kSavePolicies)
            for (int64_t layers : {1, 4})
                for (int64_t every : {1, 2, 3}) {
                    INFO(arch, " policy ", std::string(policy_name(policy)), " layers ", layers, " every ", every);
                    GPTConfig c = small_config(arch);
                    c.n_layer = layers;
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
    const StepCostModel costs = fixed_costs();  // the plan is a function of the config alone
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
    // With Muon the grid is the same settings, each with Muon's state: the plan is one of them.
    const std::vector<MemorySettings> adamw_grid = memory_settings_grid(c, B),
                                      muon_grid = memory_settings_grid(c, B, StepOptimizer::Muon);
    REQUIRE(muon_grid.size() == adamw_grid.size());
    for (size_t i = 0; i < muon_grid.size(); ++i) {
        CHECK(muon_grid[i].optimizer == StepOptimizer::Muon);
        CHECK(settings_label(muon_grid[i]) == settings_label(adamw_grid[i]));
        CHECK(predict_peak(c, muon_grid[i], B, T) < predict_peak(c, adamw_grid[i], B, T));  // half the matrices' state
    }
    const MemoryBudgetPlan muon_plan = plan_memory(c, smallest, B, T, costs, StepOptimizer::Muon);
    REQUIRE(muon_plan.fits);
    CHECK(muon_plan.settings.optimizer == StepOptimizer::Muon);
    CHECK(muon_plan.predicted_peak == predict_peak(c, muon_plan.settings, B, T));
    CHECK(muon_plan.predicted_peak <= smallest);
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
