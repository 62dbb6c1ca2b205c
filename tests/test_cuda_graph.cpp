// tests/test_cuda_graph.cpp: CUDAGraph (core/cuda_graph.h): a replay computes what the eager run
// computes, bit for bit (ops, AdamW and Muon with changing rates, a GPT's training step); the
// graph's pool keeps its addresses from other tensors; the statistics count a capture as an eager
// run; what cannot be captured is refused, and train_gpt's --cuda-graph refusals and MFU.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device_ptr.h"
#include "optim_test_util.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

TEST_SUITE("cuda_graph") {

TEST_CASE("cuda_graph: capture refuses the cpu, a graph already captured, and replay refuses an empty graph") {
    CUDAGraph graph;
    CHECK_FALSE(graph.captured());
    check_throws<DeviceError>([&] { graph.capture(Device::CPU, [] {}); }, {"CUDAGraph::capture", "CUDA device", "cpu"});
    check_throws<Error>([&] { graph.replay(); }, {"CUDAGraph::replay", "empty"});
    if (!cuda_is_available()) {
        check_throws<DeviceError>([&] { graph.capture(Device::CUDA, [] {}); }, {"CUDAGraph::capture", "GPU"});
        return;
    }
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    graph.capture(Device::CUDA, [] {});
    CHECK(graph.captured());
    check_throws<Error>([&] { graph.capture(Device::CUDA, [] {}); }, {"CUDAGraph::capture", "reset()"});
    graph.replay();
    graph.reset();
    CHECK_FALSE(graph.captured());
    check_throws<Error>([&] { graph.replay(); }, {"CUDAGraph::replay", "empty"});
}

TEST_CASE("cuda_graph: a replay computes the eager result of its inputs' current values, bit for bit") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    manual_seed(3);
    Tensor x = randn({37, 129}).to(Device::CUDA), w = randn({129, 65}).to(Device::CUDA);
    auto f = [&] { return add(gelu(matmul(x, w)), scale(matmul(x, w), 0.5)); };
    Tensor y;
    CUDAGraph graph;
    graph.capture(Device::CUDA, [&] { y = f(); });
    for (int i = 0; i < 3; ++i) {
        x.copy_(randn({37, 129}).to(Device::CUDA));
        graph.replay();
        CHECK(same_bits(y, f()));
    }
}

TEST_CASE("cuda_graph: the pool keeps the capture's addresses from later tensors, and the statistics count the capture") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    const Device dev = Device::CUDA;
    Tensor x = ones({1 << 18}, TensorOptions().device(dev));
    synchronize(dev);
    const MemoryStats before = memory_stats(dev);
    reset_peak_memory_stats(dev);
    const void* temporary = nullptr;
    Tensor y;
    CUDAGraph graph;
    graph.capture(dev, [&] {
        Tensor t = scale(x, 2.0);  // 1 MiB, released within the capture
        temporary = detail::byte_ptr(t);
        y = add(t, x);
    });
    const MemoryStats after = memory_stats(dev);
    CHECK(after.allocated_bytes == before.allocated_bytes + y.nbytes());
    CHECK(after.peak_allocated_bytes == before.allocated_bytes + 2 * y.nbytes());
    // A tensor made after the capture does not take the captured temporary's place, which every
    // replay writes.
    Tensor other = zeros({1 << 18}, TensorOptions().device(dev));
    CHECK(detail::byte_ptr(other) != temporary);
    const MemoryStats before_replay = memory_stats(dev);
    graph.replay();
    synchronize(dev);
    const MemoryStats replayed = memory_stats(dev);  // a replay allocates nothing
    CHECK(replayed.num_allocs == before_replay.num_allocs);
    CHECK(replayed.allocated_bytes == after.allocated_bytes + other.nbytes());
    CHECK(same_bits(other, zeros({1 << 18})));
    CHECK(same_bits(y, full({1 << 18}, 3.0)));
}

TEST_CASE("cuda_graph: two graphs reset in either order give back every block, one's output released in the other's capture") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    const Device dev = Device::CUDA;
    Tensor x = ones({1 << 16}, TensorOptions().device(dev));
    for (bool a_first : {true, false}) {
        CAPTURE(a_first);
        synchronize(dev);
        const int64_t before = memory_stats(dev).allocated_bytes;
        auto a = std::make_unique<CUDAGraph>(), b = std::make_unique<CUDAGraph>();
        Tensor ya, yb;
        a->capture(dev, [&] { ya = scale(x, 2.0); });
        b->capture(dev, [&] {
            ya = Tensor();  // a block of a's pool, released during b's capture: held until b goes
            yb = scale(x, 3.0);
        });
        a->replay();
        b->replay();
        if (a_first) a.reset(), b.reset();
        else b.reset(), a.reset();
        CHECK(same_bits(yb, full({1 << 16}, 3.0)));
        CHECK(memory_stats(dev).allocated_bytes == before + yb.nbytes());
        yb = Tensor();
        empty_cache(dev);  // every segment back in the shared pools, wholly free ones to the driver
        CHECK(same_bits(scale(x, 4.0), full({1 << 16}, 4.0)));
        CHECK(memory_stats(dev).allocated_bytes == before);
    }
}

TEST_CASE("cuda_graph: a host read, a dry run and a second capture inside a capture are refused, and the next capture works") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    Tensor x = ones({16}, TensorOptions().device(Device::CUDA));
    CUDAGraph graph;
    check_throws<Error>([&] { graph.capture(Device::CUDA, [&] { (void)sum(x).item<double>(); }); },
                        {"CUDAGraph::capture", "CUDA refused", "item()"});
    CHECK_FALSE(graph.captured());
    check_throws<Error>([&] { graph.capture(Device::CUDA, [&] { dry_run(Device::CUDA, [] {}); }); },
                        {"dry_run", "capture"});
    CUDAGraph inner;
    check_throws<Error>([&] { graph.capture(Device::CUDA, [&] { inner.capture(Device::CUDA, [] {}); }); },
                        {"CUDAGraph::capture", "other capture"});
    check_throws<Error>([&] { (void)dry_run(Device::CUDA, [&] { inner.capture(Device::CUDA, [] {}); }); },
                        {"CUDAGraph::capture", "dry run"});
    Tensor y;
    graph.capture(Device::CUDA, [&] { y = scale(x, 3.0); });
    graph.replay();
    CHECK(same_bits(y, full({16}, 3.0)));
}

TEST_CASE("cuda_graph: fn's own error is rethrown as it was, and the pool is given back") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    const Device dev = Device::CUDA;
    Tensor x = ones({4, 16}, TensorOptions().device(dev));
    synchronize(dev);
    const int64_t before = memory_stats(dev).allocated_bytes;
    Tensor kept;
    CUDAGraph graph;
    check_throws<ShapeError>([&] {
        graph.capture(dev, [&] {
            kept = scale(x, 2.0);
            (void)matmul(x, x);  // [4, 16] @ [4, 16]: inner dimensions differ
        });
    }, {"matmul"}, KindMatch::Exactly);
    CHECK_FALSE(graph.captured());
    kept = Tensor();  // back to the shared pools, from a pool that is gone
    CHECK(memory_stats(dev).allocated_bytes == before);
    Tensor y;
    graph.capture(dev, [&] { y = scale(x, 3.0); });
    graph.replay();
    CHECK(same_bits(y, full({4, 16}, 3.0)));
}

TEST_CASE("cuda_graph: capture refuses the caching allocator off") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope off(false);
    CUDAGraph graph;
    check_throws<Error>([&] { graph.capture(Device::CUDA, [] {}); }, {"NORMTAPE_NO_CUDA_MEMORY_CACHING"});
}

// AdamW and Muon stepped by replays of one captured step, with new gradients and a new lr before
// each, give the eager steps' parameters and step counts bit for bit.
TEST_CASE("cuda_graph: AdamW and Muon steps replayed with changing gradients and rates equal eager steps bit for bit") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    for (bool muon : {false, true})
        for (DType dtype : {DType::F32, DType::BF16}) {
            CAPTURE(muon);
            CAPTURE(dtype_name(dtype));
            manual_seed(21);
            std::vector<Tensor> eager, replayed;
            for (Shape s : {Shape{64, 48}, Shape{48, 96}}) {
                Tensor p = randn(s).to(Device::CUDA).to(dtype);
                eager.push_back(p.clone().requires_grad_(true));
                replayed.push_back(p.clone().requires_grad_(true));
            }
            auto make = [&](const std::vector<Tensor>& params) {
                struct Both {
                    std::unique_ptr<AdamW> adamw;
                    std::unique_ptr<Muon> muon;
                    void set_lr(double lr) { adamw ? adamw->set_lr(lr) : muon->set_lr(lr); }
                    void step() { adamw ? adamw->step() : muon->step(); }
                    int64_t step_count() const { return adamw ? adamw->step_count() : muon->step_count(); }
                } o;
                if (muon) o.muon = std::make_unique<Muon>(params, MuonOptions{.weight_decay = 0.1});
                else o.adamw = std::make_unique<AdamW>(params, AdamWOptions{.lr = 1e-2});
                return o;
            };
            auto a = make(eager), b = make(replayed);
            auto grads = [&](int k) {
                std::vector<Tensor> g;
                manual_seed(100 + k);
                for (const Tensor& p : eager) g.push_back(randn(p.shape()).to(Device::CUDA).to(dtype));
                return g;
            };
            CUDAGraph graph;
            for (int k = 0; k < 6; ++k) {
                const double lr = 0.01 / (k + 1);
                std::vector<Tensor> g = grads(k);
                for (size_t i = 0; i < g.size(); ++i) set_grad(eager[i], g[i]);
                a.set_lr(lr);
                a.step();
                b.set_lr(lr);
                if (k == 0) {  // an eager first step makes the state and AdamW's table
                    for (size_t i = 0; i < g.size(); ++i) set_grad(replayed[i], g[i]);
                    b.step();
                    continue;
                }
                for (size_t i = 0; i < g.size(); ++i) replayed[i].grad().copy_(g[i]);
                if (!graph.captured()) graph.capture(Device::CUDA, [&] { b.step(); });
                graph.replay();
            }
            for (size_t i = 0; i < eager.size(); ++i) CHECK(same_bits(replayed[i], eager[i]));
            CHECK(b.step_count() == 6);
            CHECK(a.step_count() == 6);
        }
}

TEST_CASE("cuda_graph: the optimizers' count on the device counts a step without gradients, and set_step_count sets it") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    Tensor p = ones({8, 4}, TensorOptions().device(Device::CUDA)).requires_grad_(true);
    AdamW adamw(std::vector<Tensor>{p}, AdamWOptions{});
    Tensor q = ones({8, 4}, TensorOptions().device(Device::CUDA)).requires_grad_(true);
    Muon muon_q(std::vector<Tensor>{q}, MuonOptions{});
    set_grad(p, ones({8, 4}, TensorOptions().device(Device::CUDA)));
    set_grad(q, ones({8, 4}, TensorOptions().device(Device::CUDA)));
    adamw.step();
    muon_q.step();
    p.zero_grad();
    q.zero_grad();
    adamw.step();  // no gradient: nothing updated, the step counted on the device as on the host
    muon_q.step();
    CHECK(adamw.step_count() == 2);
    CHECK(muon_q.step_count() == 2);
    adamw.set_step_count(7);
    muon_q.set_step_count(7);
    CHECK(adamw.step_count() == 7);
    CHECK(muon_q.step_count() == 7);
}

TEST_CASE("cuda_graph: a GPT's training step replayed gives the eager steps' losses and parameters bit for bit") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);  // a capture needs it (the sanitizers' runs turn it off)
    for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Normalized}) {
        CAPTURE(policy_name(policy));
        GPTConfig c{.block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64, .policy = policy};
        auto make_model = [&] {
            manual_seed(8);
            auto m = std::make_unique<GPT>(c);
            m->to(Device::CUDA, DType::BF16);
            return m;
        };
        auto eager_model = make_model(), graph_model = make_model();
        GPTOptimizers eager_opt = GPTOptimizers::make(gpt_param_groups(*eager_model, StepOptimizer::AdamW));
        GPTOptimizers graph_opt = GPTOptimizers::make(gpt_param_groups(*graph_model, StepOptimizer::AdamW));
        auto batch = [&](int k) {
            std::vector<int64_t> ids(4 * 32);
            for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 131 + 7 * k) % 256);
            return std::pair{from_vector(ids, {4, 32}).to(Device::CUDA),
                             from_vector(std::vector<int64_t>(ids.rbegin(), ids.rend()), {4, 32}).to(Device::CUDA)};
        };
        CUDAGraph graph;
        Tensor idx, targets, norm;
        std::vector<Tensor> losses;
        for (int k = 0; k < 6; ++k) {
            auto [x, y] = batch(k);
            const double lr = 1e-3 * (k + 1);
            eager_opt.adamw->set_lr(lr);
            graph_opt.adamw->set_lr(lr);
            std::vector<Tensor> eager_losses;
            Tensor eager_norm = gpt_step(*eager_model, eager_opt, nullptr, x, y, 2, true, &eager_losses);
            if (k < 2) {
                (void)gpt_step(*graph_model, graph_opt, nullptr, x, y, 2, true);
                continue;
            }
            if (!graph.captured()) {
                idx = x.clone();
                targets = y.clone();
                graph.capture(Device::CUDA, [&] { norm = gpt_step(*graph_model, graph_opt, nullptr, idx, targets, 2, true, &losses); });
            } else {
                idx.copy_(x);
                targets.copy_(y);
            }
            graph.replay();
            CAPTURE(k);
            REQUIRE(losses.size() == 2);
            CHECK(same_bits(losses[0], eager_losses[0]));
            CHECK(same_bits(losses[1], eager_losses[1]));
            CHECK(same_bits(norm, eager_norm));
        }
        NamedTensors pe = eager_model->named_parameters(), pg = graph_model->named_parameters();
        for (size_t i = 0; i < pe.size(); ++i) {
            CAPTURE(pe[i].first);
            CHECK(same_bits(pg[i].second, pe[i].second));
        }
        CHECK(graph_opt.adamw->step_count() == 6);
    }
}

TEST_CASE("train_gpt: --cuda-graph on refuses dropout, offload, the fused loss, --detect-anomaly, a memory budget and the cpu") {
    TempDir dir("cuda_graph_refusals");
    const std::string run = "--steps 3 --layers 1 --embd 32 --heads 2 --seq 16 --batch 2 --cuda-graph on ";
    check_refused(run_train_gpt(dir, run + "--device cuda --dropout 0.1"), {"--cuda-graph on", "dropout", "same masks"});
    check_refused(run_train_gpt(dir, run + "--device cuda --offload on"), {"--cuda-graph on", "--offload on"});
    check_refused(run_train_gpt(dir, run + "--device cuda --fused-loss on"), {"--cuda-graph on", "--fused-loss on"});
    check_refused(run_train_gpt(dir, run + "--device cuda --detect-anomaly"), {"--cuda-graph on", "--detect-anomaly"});
    check_refused(run_train_gpt(dir, run + "--device cuda --memory-budget 1GiB"), {"--cuda-graph on", "--memory-budget"});
    check_refused(run_train_gpt(dir, run + "--device cpu"), {"--cuda-graph on", "--device cpu"});
    check_refused(run_train_gpt(dir, run + "--device cuda --cuda-graph maybe"), {"cuda-graph"});
}

TEST_CASE("train_gpt: the JSON's model FLOPs per step are 6 N + 12 L C T per token, N the weights that multiply") {
    TempDir dir("model_flops");
    const int64_t B = 2, T = 16, L = 2, C = 32, V = 256;
    for (const char* tie : {"off", "on"}) {
        CAPTURE(tie);
        RunResult r = run_train_gpt(dir, "--steps 2 --layers 2 --embd 32 --heads 2 --seq 16 --batch 2 --policy input "
                                         "--device cpu --data random --tie " + std::string(tie) + " --json f.json");
        REQUIRE(r.code == 0);
        nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "f.json"));
        GPTConfig c{.vocab_size = V, .block_size = T, .n_layer = L, .n_head = 2, .n_embd = C,
                    .tie_embeddings = std::string(tie) == "on"};
        // Every parameter but the looked-up tables: wpe [T, C], and wte [V, C] when it is not the head.
        const double n = double(num_parameters(c) - T * C - (c.tie_embeddings ? 0 : V * C));
        CHECK(j["runs"][0]["model_flops_per_step"].get<double>() == (6 * n + 12.0 * L * C * T) * double(B * T));
        CHECK(j["runs"][0]["mfu"].is_null());  // the cpu has no peak in the table
        CHECK(r.out.find("model FLOPs per step") != std::string::npos);
    }
}

}  // TEST_SUITE
