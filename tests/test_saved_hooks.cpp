// tests/test_saved_hooks.cpp: SavedTensorHooks (core/saved_hooks.h) and checkpoint()
// (core/activation_checkpoint.h): gradients bit-identical to a run without them, under each norm
// policy, on the cpu (f64, f32) and on the GPU (bf16); nesting order; the version check through
// them; the saved bytes of a checkpointed GPT against predicted_checkpoint_saved_bytes; each error.
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

GPTConfig hooks_config(DType dtype, NormKind norm, SavePolicy policy) {
    GPTConfig c{.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24, .norm = norm, .policy = policy, .dtype = dtype};
    return c;
}

// The loss and every parameter's gradient (as f64, which holds f32 and bf16 exactly) of one
// forward and backward of a fresh GPT(c) with the same weights; `forward` runs the loss, inside
// whatever guards the test wants.
struct Grads {
    double loss;
    std::vector<std::vector<double>> grads;
    bool operator==(const Grads&) const = default;
};
Grads gradients(GPTConfig c, const std::function<Tensor(GPT&, const TokenBatch&)>& forward) {
    manual_seed(17);
    GPT model(c);
    TokenBatch b = token_batch(c, 2, 12);
    Tensor loss = forward(model, b);
    loss.backward();
    Grads g{as_f64(loss.to(Device::CPU))[0], {}};
    for (const Tensor& p : model.parameters()) g.grads.push_back(as_f64(p.grad().to(Device::CPU)));
    return g;
}

Tensor plain_loss(GPT& m, const TokenBatch& b) { return m.loss(b.idx, b.targets); }

}  // namespace

TEST_SUITE("saved_hooks") {

TEST_CASE("saved_hooks: every saved tensor but the parameters goes through pack and unpack, gradients bit-identical") {
    for (DType dtype : kFloatTypes)
        for (NormKind norm : {NormKind::Layer, NormKind::RMS})
            for (SavePolicy policy : kSavePolicies) {
                INFO(dtype_name(dtype), " ", norm_kind_name(norm), " policy ", static_cast<int>(policy));
                GPTConfig c = hooks_config(dtype, norm, policy);
                int64_t packs = 0, unpacks = 0, parameters_packed = 0;
                Grads hooked = gradients(c, [&](GPT& m, const TokenBatch& b) {
                    SavedTensorHooks hooks(
                        [&](const Tensor& t) {
                            ++packs;
                            if (t.storage()->is_parameter()) ++parameters_packed;
                            return t.clone();  // a copy: the saved tensor itself is no longer held
                        },
                        [&](const Tensor& t) {
                            ++unpacks;
                            return t.clone();
                        });
                    return m.loss(b.idx, b.targets);  // the backward runs after the guard is gone
                });
                CHECK(hooked == gradients(c, plain_loss));
                CHECK(packs > 0);
                CHECK(parameters_packed == 0);
                CHECK(unpacks >= packs);  // a recipe's inputs are unpacked once per tensor it makes
            }
}

TEST_CASE("saved_hooks: nested hooks pack innermost first and unpack outermost first") {
    std::vector<std::string> log;
    auto pair = [&](const std::string& name, double factor) {
        return std::pair<PackHook, UnpackHook>{[&log, name, factor](const Tensor& t) {
                                                   log.push_back(name + " pack");
                                                   return scale(t, factor);
                                               },
                                               [&log, name, factor](const Tensor& t) {
                                                   log.push_back(name + " unpack");
                                                   return scale(t, 1.0 / factor);
                                               }};
    };
    Tensor x = input({4, 5}, DType::F64);
    x.requires_grad_(true);
    Tensor h = scale(x, 3.0), y;
    {
        auto [outer_pack, outer_unpack] = pair("outer", 4.0);
        SavedTensorHooks outer(outer_pack, outer_unpack);
        auto [inner_pack, inner_unpack] = pair("inner", 2.0);
        SavedTensorHooks inner(inner_pack, inner_unpack);
        y = sum(gelu(h));  // gelu saves h
    }
    CHECK(log == std::vector<std::string>{"inner pack", "outer pack"});
    // What is kept is outer(inner(h)) = 8 h.
    SavedTensorsReport report = saved_tensors_report();
    REQUIRE(report.entries.size() == 1);
    CHECK(report.entries[0].packed);
    y.backward();
    CHECK(log == std::vector<std::string>{"inner pack", "outer pack", "outer unpack", "inner unpack"});
    Tensor x2 = x.detach().clone();
    x2.requires_grad_(true);
    sum(gelu(scale(x2, 3.0))).backward();
    CHECK(as_f64(x.grad()) == as_f64(x2.grad()));  // powers of two: exact
}

TEST_CASE("saved_hooks: a tensor modified in place after it was saved is caught on unpack") {
    Tensor x = input({3}, DType::F64);
    x.requires_grad_(true);
    Tensor h = scale(x, 1.0), y;
    {
        SavedTensorHooks hooks([](const Tensor& t) { return t.clone(); }, [](const Tensor& t) { return t.clone(); });
        y = sum(gelu(h));
    }
    {
        NoGradGuard no_grad;
        h.add_(ones({3}, TensorOptions().dtype(DType::F64)));  // the packed copy is unchanged, h is not
    }
    CHECK_THROWS_KIND_WITH(y.backward(), Error, "GeluBackward", "modified by an in-place operation");
}

TEST_CASE("saved_hooks: errors: empty functions, and an unpack of the wrong shape, dtype or device") {
    CHECK_THROWS_KIND_WITH(SavedTensorHooks(PackHook(), [](const Tensor& t) { return t; }), Error, "SavedTensorHooks",
                           "empty pack");
    CHECK_THROWS_KIND_WITH(SavedTensorHooks([](const Tensor& t) { return t; }, UnpackHook()), Error, "SavedTensorHooks",
                           "empty unpack");
    for (int wrong = 0; wrong < 3; ++wrong) {
        Tensor x = input({2, 3}, DType::F64);
        x.requires_grad_(true);
        Tensor y;
        {
            SavedTensorHooks hooks([](const Tensor& t) { return t; },
                                   [wrong](const Tensor& t) {
                                       if (wrong == 0) return t.reshape({3, 2});
                                       if (wrong == 1) return t.to(DType::F32);
                                       return Tensor();
                                   });
            y = sum(gelu(scale(x, 1.0)));
        }
        CHECK_THROWS_KIND_WITH(y.backward(), Error, "GeluBackward", "expected saved-tensor hooks to unpack a tensor",
                               "[2, 3] f64 cpu");
    }
}

TEST_CASE("saved_hooks: guards destroyed out of order each remove their own pair") {
    std::vector<std::string> log;
    auto named = [&](const std::string& name) {
        return std::make_unique<SavedTensorHooks>(
            [&log, name](const Tensor& t) {
                log.push_back(name + " pack");
                return t;
            },
            [](const Tensor& t) { return t; });
    };
    Tensor x = input({3}, DType::F64);
    x.requires_grad_(true);
    Tensor h = scale(x, 2.0);
    auto outer = named("outer");
    auto inner = named("inner");
    outer.reset();  // the outer guard ends first: only the inner pair is left
    Tensor y = sum(gelu(h));
    CHECK(log == std::vector<std::string>{"inner pack"});
    inner.reset();
    log.clear();
    Tensor z = sum(gelu(scale(x, 2.0)));
    CHECK(log.empty());
    CHECK(detail::save_scopes().empty());
    y.backward();
    z.backward();
}

TEST_CASE("saved_hooks: a hook's own ops run without the hooks and record nothing, so a pack that saves does not run itself again") {
    Tensor w = input({3}, DType::F64);
    w.requires_grad_(true);
    int64_t packs = 0, unpacks = 0;
    bool recorded = false, repacked = false;
    // What a hook does: an op that would record and save (scale's output, by gelu), and a tensor
    // saved directly, as a user's node would.
    auto side_work = [&](const Tensor& t) {
        Tensor side = gelu(scale(w, 1.0));
        recorded = recorded || side.requires_grad();
        SavedTensor own(t);
        repacked = repacked || own.packed();
    };
    Tensor x = input({3}, DType::F64);
    x.requires_grad_(true);
    Tensor y;
    {
        SavedTensorHooks hooks(
            [&](const Tensor& t) {
                ++packs;
                side_work(t);
                return t.clone();
            },
            [&](const Tensor& t) {
                ++unpacks;
                side_work(t);
                return t.clone();
            });
        y = sum(gelu(scale(x, 3.0)));  // gelu saves one tensor
    }
    CHECK(packs == 1);
    y.backward();
    CHECK(unpacks == 1);
    CHECK_FALSE(recorded);  // grad mode is off inside a hook, as PyTorch runs pack
    CHECK_FALSE(repacked);
    Tensor x2 = x.detach().clone();
    x2.requires_grad_(true);
    sum(gelu(scale(x2, 3.0))).backward();
    CHECK(as_f64(x.grad()) == as_f64(x2.grad()));
}

TEST_CASE("checkpoint: gradients bit-identical to a run without it, each norm and policy, f64 and f32, with dropout") {
    for (DType dtype : kFloatTypes)
        for (NormKind norm : {NormKind::Layer, NormKind::RMS})
            for (SavePolicy policy : kSavePolicies)
                for (double p : {0.0, 0.2}) {
                    INFO(dtype_name(dtype), " ", norm_kind_name(norm), " policy ", static_cast<int>(policy), " dropout ", p);
                    GPTConfig c = hooks_config(dtype, norm, policy);
                    c.dropout = p;
                    Grads plain = gradients(c, plain_loss);
                    c.checkpoint_blocks = true;
                    CHECK(gradients(c, plain_loss) == plain);
                }
}

TEST_CASE("checkpoint: every k-th block (checkpoint_every), gradients bit-identical to a run without it") {
    for (SavePolicy policy : kSavePolicies)
        for (int64_t every : {2, 3}) {
            INFO("policy ", static_cast<int>(policy), " checkpoint_every ", every);
            GPTConfig c = hooks_config(DType::F64, NormKind::Layer, policy);
            c.n_layer = 4;  // blocks 0, 2 (every 2) or 0, 3 (every 3) checkpointed, the others not
            c.dropout = 0.2;
            Grads plain = gradients(c, plain_loss);
            c.checkpoint_blocks = true;
            c.checkpoint_every = every;
            CHECK(gradients(c, plain_loss) == plain);
        }
    GPTConfig c = hooks_config(DType::F64, NormKind::Layer, SavePolicy::Input);
    c.checkpoint_every = 0;
    check_throws<ShapeError>([&] { GPT model(c); }, {"GPTConfig", "checkpoint_every >= 1", "got 0"});
}

TEST_CASE("checkpoint: a GPT saves the block inputs and what the outside of the blocks saves, to the byte") {
    for (DType dtype : {DType::F64, DType::F32, DType::BF16})
        for (NormKind norm : {NormKind::Layer, NormKind::RMS})
            for (SavePolicy policy : kSavePolicies) {
                INFO(dtype_name(dtype), " ", norm_kind_name(norm), " policy ", static_cast<int>(policy));
                GPTConfig c = hooks_config(dtype, norm, policy);
                c.checkpoint_blocks = true;
                c.dropout = 0.1;
                manual_seed(3);
                GPT model(c);
                TokenBatch b = token_batch(c, 3, 10);
                const int64_t before = saved_bytes();
                Tensor loss = model.loss(b.idx, b.targets);
                CHECK(saved_bytes() - before == predicted_checkpoint_saved_bytes(c, 3, 10));
                {  // the fused head loss: the same less the logits
                    GPTConfig fused = c;
                    fused.fused_head_loss = true;
                    GPT fused_model(fused);
                    const int64_t ours = saved_bytes();
                    Tensor fused_loss = fused_model.loss(b.idx.clone(), b.targets.clone());  // ids not saved yet
                    CHECK(saved_bytes() - ours == predicted_checkpoint_saved_bytes(fused, 3, 10));
                    CHECK(predicted_checkpoint_saved_bytes(c, 3, 10) - predicted_checkpoint_saved_bytes(fused, 3, 10) ==
                          3 * 10 * c.vocab_size * static_cast<int64_t>(element_size(c.dtype)));
                }
                // Every block's saved tensors are kept as the checkpoint's recipe, which keeps its input.
                int64_t via_checkpoint = 0;
                for (const SavedTensorEntry& e : saved_tensors_report().entries)
                    for (const SavedTensorHolder& h : e.holders) via_checkpoint += h.via == "checkpoint";
                CHECK(via_checkpoint > 0);
            }
}

TEST_CASE("checkpoint: hooks around it pack its inputs, and only them") {
    GPTConfig c = hooks_config(DType::F64, NormKind::Layer, SavePolicy::Input);
    Grads plain = gradients(c, plain_loss);
    c.checkpoint_blocks = true;
    int64_t packs = 0;
    Grads hooked = gradients(c, [&](GPT& m, const TokenBatch& b) {
        std::vector<Tensor> inputs{m.drop->forward(add(m.wte->forward(b.idx), m.wpe->weight.narrow(0, 0, 12)))};
        Tensor x;
        {
            SavedTensorHooks hooks(
                [&](const Tensor& t) {
                    ++packs;
                    return t.clone();
                },
                [](const Tensor& t) { return t.clone(); });
            x = checkpoint([&m](const Tensor& in) { return m.h[1]->forward(m.h[0]->forward(in)); }, inputs[0]);
        }
        return cross_entropy(m.lm_head->forward(m.ln_f->forward(x)), b.targets);
    });
    CHECK(packs == 1);
    CHECK(hooked == plain);
}

TEST_CASE("checkpoint: backward with retain_graph reruns the function each time, with the same gradients") {
    Tensor x = input({3, 4}, DType::F64), w = input({3, 4}, DType::F64);
    x.requires_grad_(true);
    w.requires_grad_(true);
    int64_t calls = 0;
    Tensor y = checkpoint(
        [&](const Tensor& a, const Tensor& b) {
            ++calls;
            return gelu(mul(a, b));
        },
        x, w);
    Tensor loss = sum(gelu(y));
    CHECK(calls == 1);
    loss.backward(Tensor(), /*retain_graph=*/true);
    CHECK(calls == 2);
    std::vector<double> first = as_f64(x.grad());
    loss.backward();
    CHECK(calls == 3);
    std::vector<double> twice = as_f64(x.grad());
    for (size_t i = 0; i < first.size(); ++i) CHECK(twice[i] == 2 * first[i]);
}

TEST_CASE("checkpoint: errors: an empty function, an undefined input, a rerun that saves other tensors, an input modified in place") {
    Tensor x = input({2, 3}, DType::F64);
    x.requires_grad_(true);
    CHECK_THROWS_KIND_WITH(checkpoint(CheckpointFunction(), {x}), Error, "checkpoint", "empty");
    CHECK_THROWS_KIND_WITH(checkpoint([](const Tensor& a) { return a; }, Tensor()), Error, "checkpoint",
                           "undefined tensor at input 0");
    int64_t calls = 0;
    Tensor y = checkpoint(
        [&](const Tensor& a) { return ++calls == 1 ? gelu(a) : gelu(gelu(a)); }, scale(x, 1.0));
    CHECK_THROWS_KIND_WITH(sum(y).backward(), Error, "checkpoint", "expected the function's rerun in backward to save 1",
                           "got 2");
    Tensor h = scale(x, 1.0);
    Tensor z = sum(checkpoint([](const Tensor& a) { return gelu(a); }, h));
    {
        NoGradGuard no_grad;
        h.add_(ones({2, 3}, TensorOptions().dtype(DType::F64)));
    }
    CHECK_THROWS_KIND_WITH(z.backward(), Error, "modified by an in-place operation");
    {
        NoGradGuard no_grad;  // nothing recorded, nothing saved: fn is called once
        calls = 0;
        Tensor n = checkpoint([&](const Tensor& a) { ++calls; return gelu(a); }, x);
        CHECK(calls == 1);
        CHECK(!n.requires_grad());
    }
}

}  // TEST_SUITE

TEST_SUITE("cuda") {

TEST_CASE("cuda: checkpoint and saved-tensor hooks give a bf16 GPT bit-identical gradients under each policy") {
    REQUIRE_CUDA_OR_SKIP();
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : kSavePolicies) {
            INFO(norm_kind_name(norm), " policy ", static_cast<int>(policy));
            GPTConfig c = hooks_config(DType::BF16, norm, policy);
            c.n_embd = 128;  // head size 64: the tensor-core attention
            c.device = Device::CUDA;
            c.dropout = 0.1;
            Grads plain = gradients(c, plain_loss);
            Grads hooked = gradients(c, [](GPT& m, const TokenBatch& b) {
                SavedTensorHooks hooks([](const Tensor& t) { return t.to(Device::CPU); },
                                       [](const Tensor& t) { return t.to(Device::CUDA); });
                return m.loss(b.idx, b.targets);
            });
            CHECK(hooked == plain);
            c.checkpoint_blocks = true;
            CHECK(gradients(c, plain_loss) == plain);
            manual_seed(3);
            GPT model(c);
            TokenBatch bt = token_batch(c, 2, 12);
            const int64_t before = saved_bytes();
            Tensor loss = model.loss(bt.idx, bt.targets);
            CHECK(saved_bytes() - before == predicted_checkpoint_saved_bytes(c, 2, 12));
        }
}

}  // TEST_SUITE
