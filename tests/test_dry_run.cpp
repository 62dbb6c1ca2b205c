// tests/test_dry_run.cpp: dry_run (core/dry_run.h) against the real run of the same code: the peak
// and the timeline of two models the library does not ship, written here with the public API only
// and no memory code of their own (an encoder block with bidirectional attention, an MLP-mixer
// with a custom autograd node and checkpointing); the placeholders; what a dry run refuses.
#include <cmath>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// ---- Two models a user could write --------------------------------------------------------------

// A post-attention encoder block on one sequence x [T, C]: LayerNorm (under `policy`), single-head
// bidirectional attention from matmuls and softmax, an MLP with GELU, two residual adds.
class EncoderBlock : public Module {
public:
    EncoderBlock(int64_t C, SavePolicy policy, TensorOptions o) : C_(C) {
        NormOptions n;
        n.policy = policy;
        n.dtype = o.dtype_;
        n.device = o.device_;
        ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(C, n));
        ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(C, n));
        q = register_module("q", std::make_shared<Linear>(C, C, true, o));
        k = register_module("k", std::make_shared<Linear>(C, C, true, o));
        v = register_module("v", std::make_shared<Linear>(C, C, true, o));
        proj = register_module("proj", std::make_shared<Linear>(C, C, true, o));
        fc = register_module("fc", std::make_shared<Linear>(C, 4 * C, true, o));
        out = register_module("out", std::make_shared<Linear>(4 * C, C, true, o));
    }
    Tensor forward(const Tensor& x) const {
        ModuleScope scope(*this);
        Tensor h = ln_1->forward(x);
        Tensor scores = scale(matmul(q->forward(h), k->forward(h).transpose(0, 1)), 1.0 / std::sqrt(double(C_)));
        Tensor y = add(x, proj->forward(matmul(softmax(scores), v->forward(h))));
        return add(y, out->forward(gelu(fc->forward(ln_2->forward(y)))));
    }
    std::shared_ptr<LayerNorm> ln_1, ln_2;
    std::shared_ptr<Linear> q, k, v, proj, fc, out;

private:
    int64_t C_;
};

// The user's loss: the mean squared distance to a target.
Tensor squared_error(const Tensor& y, const Tensor& target) {
    Tensor d = add(y, scale(target, -1.0));
    return mean(mul(d, d));
}

// A custom op with a node of its own: y = x^2 / 2, dx = g * x; saves x.
struct HalfSquareBackward : Node {
    SavedTensor x;
    const char* name() const override { return "HalfSquareBackward"; }
    std::vector<Tensor> apply(const Tensor& g) override { return {mul(g, x.unpack(name()))}; }
    std::vector<SavedSlot> saved_tensors() override { return {{"x", &x}}; }
};
Tensor half_square(const Tensor& x) {
    Tensor y;
    {
        NoGradGuard no_grad;
        y = scale(mul(x, x), 0.5);
    }
    if (should_record(x)) {
        auto node = std::make_shared<HalfSquareBackward>();
        node->x = SavedTensor(x);
        record(node, y, x);
    }
    return y;
}

// An MLP-mixer on x [P, C] (P patches): per layer a token-mixing MLP across patches and a
// channel-mixing MLP across channels, each after an RMSNorm, with half_square as the activation;
// each layer checkpointed when `checkpointed`.
class Mixer : public Module {
public:
    Mixer(int64_t P, int64_t C, int64_t layers, bool checkpointed, SavePolicy policy, TensorOptions o)
        : checkpointed_(checkpointed) {
        NormOptions n;
        n.policy = policy;
        n.dtype = o.dtype_;
        n.device = o.device_;
        for (int64_t l = 0; l < layers; ++l) {
            const std::string i = std::to_string(l);
            norms.push_back(register_module("norm_tokens." + i, std::make_shared<RMSNorm>(C, n)));
            norms.push_back(register_module("norm_channels." + i, std::make_shared<RMSNorm>(C, n)));
            tokens.push_back(register_module("tokens." + i, std::make_shared<Linear>(P, 2 * P, true, o)));
            tokens.push_back(register_module("tokens_out." + i, std::make_shared<Linear>(2 * P, P, true, o)));
            channels.push_back(register_module("channels." + i, std::make_shared<Linear>(C, 3 * C, false, o)));
            channels.push_back(register_module("channels_out." + i, std::make_shared<Linear>(3 * C, C, false, o)));
        }
    }
    Tensor layer(size_t l, const Tensor& x) const {
        Tensor t = norms[2 * l]->forward(x).transpose(0, 1);  // [C, P]: mixes the patches
        Tensor y = add(x, tokens[2 * l + 1]->forward(half_square(tokens[2 * l]->forward(t))).transpose(0, 1));
        Tensor c = channels[2 * l + 1]->forward(half_square(channels[2 * l]->forward(norms[2 * l + 1]->forward(y))));
        return add(y, c);
    }
    Tensor forward(Tensor x) const {
        ModuleScope scope(*this);
        for (size_t l = 0; l < norms.size() / 2; ++l)
            x = checkpointed_ ? checkpoint([this, l](const Tensor& in) { return layer(l, in); }, x) : layer(l, x);
        return x;
    }
    std::vector<std::shared_ptr<RMSNorm>> norms;
    std::vector<std::shared_ptr<Linear>> tokens, channels;

private:
    bool checkpointed_;
};

// Two training steps of `model` (built by make) on a fresh input, with AdamW, as a user writes them.
template <class M>
void train_two_steps(const std::function<std::shared_ptr<M>()>& make, const Shape& x_shape, TensorOptions o) {
    std::shared_ptr<M> model = make();
    AdamW optimizer({{model->parameters(), 0.01}}, AdamWOptions{});
    Tensor x = randn(x_shape, o), target = randn(x_shape, o);
    for (int step = 0; step < 2; ++step) {
        Tensor loss = squared_error(model->forward(x), target);
        loss.backward();
        Tensor norm = clip_grad_norm_tensor_(model->parameters(), 1.0);
        optimizer.step_if_finite(norm);
        optimizer.zero_grad();
    }
}

// fn's peak on `device`, less what was allocated before it, run for real; and its allocations.
struct Run {
    int64_t peak = 0;
    std::vector<int64_t> allocations;
};
Run real_run(Device device, const std::function<void()>& fn) {
    const int64_t before = memory_stats(device).allocated_bytes;
    std::vector<MemoryEvent> trace;
    synchronize(device);
    reset_peak_memory_stats(device);
    set_memory_trace(device, &trace);
    fn();
    set_memory_trace(device, nullptr);
    Run r{memory_stats(device).peak_allocated_bytes - before, {}};
    for (const MemoryEvent& e : trace)
        if (e.delta_bytes > 0) r.allocations.push_back(e.allocated_bytes - before);
    return r;
}
Run dry(Device device, const std::function<void()>& fn) {
    const DryRunResult d = dry_run(device, fn);
    Run r{d.stats.peak_allocated_bytes, {}};
    for (const MemoryEvent& e : d.timeline)
        if (e.delta_bytes > 0) r.allocations.push_back(e.allocated_bytes);
    return r;
}

// The cpu, and the GPU where one is visible (scripts/gpu_check.sh runs these there).
std::vector<Device> devices() {
    std::vector<Device> d{Device::CPU};
    if (cuda_is_available()) d.push_back(Device::CUDA);
    return d;
}

}  // namespace

TEST_SUITE("dry_run") {

TEST_CASE("dry_run: an encoder block of the user's, under each policy and dtype, peaks as it runs, to the byte") {
    ThreadCountGuard one_thread(1);
    for (Device device : devices())
        for (DType dtype : {DType::F32, DType::BF16})
            for (SavePolicy policy : kSavePolicies) {
                INFO(device_name(device), " ", std::string(dtype_name(dtype)), " ", std::string(policy_name(policy)));
                const TensorOptions o = TensorOptions().dtype(dtype).device(device);
                auto make = [&] { return std::make_shared<EncoderBlock>(24, policy, o); };
                auto fn = [&] { train_two_steps<EncoderBlock>(make, {16, 24}, o); };
                manual_seed(5);
                const Run real = real_run(device, fn);
                const int64_t before = memory_stats(device).allocated_bytes;
                const Run predicted = dry(device, fn);
                CHECK(memory_stats(device).allocated_bytes == before);  // a dry run holds no real byte
                CHECK(predicted.peak == real.peak);
                CHECK(predicted.allocations == real.allocations);
                CHECK(real.peak > 0);
            }
}

TEST_CASE("dry_run: an MLP-mixer with a custom node and checkpointed layers peaks as it runs, to the byte") {
    ThreadCountGuard one_thread(1);
    for (Device device : devices())
        for (bool checkpointed : {false, true})
            for (SavePolicy policy : kSavePolicies) {
                INFO(device_name(device), " checkpointed ", checkpointed, " ", std::string(policy_name(policy)));
                const TensorOptions o = TensorOptions().dtype(DType::F32).device(device);
                auto make = [&] { return std::make_shared<Mixer>(12, 20, 3, checkpointed, policy, o); };
                auto fn = [&] { train_two_steps<Mixer>(make, {12, 20}, o); };
                manual_seed(6);
                const Run real = real_run(device, fn);
                const Run predicted = dry(device, fn);
                CHECK(predicted.peak == real.peak);
                CHECK(predicted.allocations == real.allocations);
            }
}

TEST_CASE("dry_run: the timeline names the module and backward node, and the counters are the dry run's own") {
    const DryRunResult d = dry_run(Device::CPU, [] {
        CHECK(is_dry_run());
        CHECK(memory_stats(Device::CPU).allocated_bytes == 0);  // its own counters, from zero
        Tensor x = randn({64, 32}).requires_grad_();
        LayerNorm ln(32);
        Tensor loss = mean(ln.forward(x));
        CHECK(memory_stats(Device::CPU).allocated_bytes > 64 * 32 * 4);
        loss.backward();
    });
    CHECK_FALSE(is_dry_run());
    CHECK(d.device == Device::CPU);
    CHECK(d.stats.reserved_bytes == 0);
    CHECK(d.stats.peak_allocated_bytes >= 2 * 64 * 32 * 4);  // x and its gradient at least
    CHECK(d.stats.allocated_bytes == 0);                     // everything fn made was released
    bool named_node = false;
    for (const MemoryEvent& e : d.timeline) named_node = named_node || (e.node && std::string(e.node) == "LayerNormBackward");
    CHECK(named_node);
}

TEST_CASE("dry_run: host reads give placeholders, data_ptr refuses, and the generators do not advance") {
    Tensor kept;
    manual_seed(9);
    dry_run(Device::CPU, [&] {
        kept = randn({4});
        CHECK(kept.storage()->is_dry());
        CHECK(sum(kept).item<double>() == 0.0);
        CHECK(kept.to_vector<float>() == std::vector<float>(4, 0.0f));
        check_throws<Error>([&] { kept.data_ptr<float>(); }, {"dry run", "holds no data"});
        Tensor d = dropout(randn({8}), 0.5);  // advances the Philox offset inside
    });
    CHECK(kept.storage()->is_dry());  // stays dry after the run
    check_throws<Error>([&] { kept.data_ptr<float>(); }, {"dry run"});
    const std::vector<float> after_dry = randn({3}).to_vector<float>();
    manual_seed(9);
    CHECK(randn({3}).to_vector<float>() == after_dry);  // the dry run drew nothing
}

TEST_CASE("dry_run: refuses nesting, a device without a backend or GPU, and a collective of a stand-in group outside it") {
    check_throws<Error>([] { dry_run(Device::CPU, [] { dry_run(Device::CPU, [] {}); }); }, {"dry_run", "do not nest"});
    CHECK_FALSE(is_dry_run());  // ended by the throw
    if (!cuda_is_available())
        check_throws<DeviceError>([] { dry_run(Device::CUDA, [] {}); },
                                  {"dry_run", cuda_is_built() ? "expected a visible GPU" : "CUDA backend"});
    if (cuda_is_available())  // without a GPU, empty() itself refuses a CUDA tensor first
        check_throws<DeviceError>([] { dry_run(Device::CPU, [] { empty({4}, TensorOptions().device(Device::CUDA)); }); },
                                  {"dry run on cpu", "a tensor on cuda"});
    // What fn throws comes out, and the dry run is over.
    check_throws<ShapeError>([] { dry_run(Device::CPU, [] { add(randn({2, 3}), randn({4})); }); }, {"add"});
    CHECK_FALSE(is_dry_run());
    auto group = ProcessGroup::stand_in(1, 4);
    CHECK(group->world_size() == 4);
    CHECK(group->rank() == 1);
    CHECK(group->launcher() == "stand-in");
    Tensor t = zeros({8});
    check_throws<Error>([&] { group->all_reduce(t); }, {"all_reduce", "stand-in", "dry runs only"});
    dry_run(Device::CPU, [&] {
        Tensor u = zeros({8});
        group->all_reduce(u);  // checked, sent nowhere
        Tensor small = zeros({3});
        check_throws<ShapeError>([&] { group->reduce_scatter(u, small); }, {"reduce_scatter", "world_size (4)"});
    });
    check_throws<Error>([] { ProcessGroup::stand_in(4, 4); }, {"stand_in", "rank 4"});
    // A real group's collective would send the dry run's addresses: refused.
    ProcessGroup real;
    check_throws<Error>([&] { dry_run(Device::CPU, [&] { Tensor u = zeros({8}); real.all_reduce(u); }); },
                        {"all_reduce", "dry run", "stand-in"});
}

TEST_CASE("dry_run: a dry tensor that outlives its run counts on no later run's counters") {
    Tensor kept;
    dry_run(Device::CPU, [&] { kept = empty({1000}); });
    const DryRunResult later = dry_run(Device::CPU, [&] {
        kept = Tensor();  // released here: its bytes were the first run's
        Tensor a = empty({10});
    });
    CHECK(later.stats.allocated_bytes == 0);
    CHECK(later.stats.peak_allocated_bytes == 40);
    CHECK(later.timeline.size() == 2);  // a's allocation and release, nothing of kept's
}

}  // TEST_SUITE
