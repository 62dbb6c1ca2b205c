// tests/test_gpt.cpp: the model end to end: it learns real text, it can overfit one batch, the
// two policies train identically, and bad input to the model is rejected clearly; the presets
// (gpt2, nanochat, llama): their parameters, their gradients against f64 finite differences, tied
// embeddings, weightless norms under Output and Normalized, and the fused head loss; the blocks'
// residual adds inside the norms against the add op; a batch's gradient as the sum of its
// micro-batches' (gradient accumulation).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

GPTConfig tiny_config(NormKind norm, SavePolicy policy) {
    return {.block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64, .norm = norm, .policy = policy};
}

// Trains for `steps` on random windows of `text` and returns the loss of every step.
std::vector<double> train(const GPTConfig& c, const std::string& text, int steps, int64_t B, double lr,
                          bool same_batch = false) {
    manual_seed(7);
    GPT model(c);
    AdamWOptions o;
    o.lr = lr;
    o.weight_decay = 0.0;
    AdamW opt(model.parameters(), o);
    std::mt19937_64 rng(7);
    const int64_t T = c.block_size;
    std::vector<double> losses;
    std::vector<int64_t> x(B * T), y(B * T);
    for (int step = 0; step < steps; ++step) {
        if (step == 0 || !same_batch)
            for (int64_t b = 0; b < B; ++b) {
                size_t s = rng() % (text.size() - T - 1);
                for (int64_t t = 0; t < T; ++t) {
                    x[b * T + t] = static_cast<unsigned char>(text[s + t]);
                    y[b * T + t] = static_cast<unsigned char>(text[s + t + 1]);
                }
            }
        Tensor loss = model.loss(from_vector(x, {B, T}), from_vector(y, {B, T}));
        loss.backward();
        clip_grad_norm_(model.parameters(), 1.0);
        opt.step();
        opt.zero_grad();
        losses.push_back(loss.item<float>());
    }
    return losses;
}

// A preset at a small size: V = 29, block_size 8, two layers, C = 16, NH = 4 (NKV 2 for the
// others), every parameter drawn (zero_init_proj off, so that each gradient path carries signal).
GPTConfig preset(const std::string& arch, DType dtype = DType::F64, SavePolicy policy = SavePolicy::Input) {
    GPTConfig c = gpt_config(arch);
    c.vocab_size = 29, c.block_size = 8, c.n_layer = 2, c.n_head = 4, c.n_embd = 16, c.dtype = dtype;
    c.policy = policy;
    c.zero_init_proj = false;
    if (arch != "gpt2") c.n_kv_head = 2;
    return c;
}

// Fixed tokens for a [B, T] batch.
Tensor tokens(int64_t B, int64_t T, int64_t V, int64_t shift) {
    std::vector<int64_t> v(B * T);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + shift) % V);
    return from_vector(v, {B, T});
}

double mean_of_last(const std::vector<double>& v, size_t n) {
    double s = 0;
    for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i];
    return s / static_cast<double>(n);
}

}  // namespace

TEST_SUITE("gpt") {

TEST_CASE("gpt: the loss falls when training on tinyshakespeare") {
    std::string path = shakespeare_path();
    std::ifstream f(path, std::ios::binary);
    INFO(path << " is part of the repository; it must be there and readable");
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    REQUIRE(ss.str().size() > 100000);
    for (NormKind norm : {NormKind::Layer, NormKind::RMS}) {
        CAPTURE(norm_kind_name(norm));
        std::vector<double> losses = train(tiny_config(norm, SavePolicy::Output), ss.str(), 80, 8, 3e-3);
        CHECK(losses.front() > 5.0);                // about ln(256) = 5.55 at initialization
        CHECK(mean_of_last(losses, 10) < 3.0);      // well below the 3.31 nats of a unigram model
    }
}

TEST_CASE("gpt: the model overfits one batch") {
    std::string text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.";
    GPTConfig c = tiny_config(NormKind::Layer, SavePolicy::Input);
    c.block_size = 16;
    std::vector<double> losses = train(c, text, 80, 2, 1e-2, /*same_batch=*/true);
    CHECK(losses.back() < 0.2);
}

TEST_CASE("gpt: both policies train to the same losses") {
    std::string text;
    for (int i = 0; i < 50; ++i) text += "Norms save what backward needs; the output policy saves y. ";
    for (NormKind norm : {NormKind::Layer, NormKind::RMS}) {
        CAPTURE(norm_kind_name(norm));
        std::vector<double> in = train(tiny_config(norm, SavePolicy::Input), text, 15, 4, 3e-3);
        std::vector<double> out = train(tiny_config(norm, SavePolicy::Output), text, 15, 4, 3e-3);
        for (size_t i = 0; i < in.size(); ++i) CHECK(std::abs(in[i] - out[i]) <= 1e-4 * std::abs(in[i]));
    }
}

TEST_CASE("gpt: each preset has num_parameters(config) parameters, a tied table counted once") {
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (bool tie : {false, true}) {
            CAPTURE(arch);
            CAPTURE(tie);
            GPTConfig c = preset(arch, DType::F32);
            c.tie_embeddings = tie;
            manual_seed(9);
            GPT model(c);
            CHECK(model.num_parameters() == num_parameters(c));
            CHECK(arch_name(c) == arch);
            if (tie) {
                CHECK(model.lm_head->weight.impl_ptr() == model.wte->weight.impl_ptr());
                int64_t listed = 0;
                for (const auto& [name, p] : model.named_parameters()) listed += p.impl_ptr() == model.wte->weight.impl_ptr();
                CHECK(listed == 1);
            }
        }
}

TEST_CASE("gpt: every preset's parameter gradients match f64 finite differences of the loss") {
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (SavePolicy policy : kSavePolicies)
            for (bool tie : {false, true}) {
                CAPTURE(arch);
                CAPTURE(policy_name(policy));
                CAPTURE(tie);
                GPTConfig c = preset(arch, DType::F64, policy);
                c.tie_embeddings = tie;
                manual_seed(10);
                GPT model(c);
                const Tensor idx = tokens(2, 8, c.vocab_size, 1), targets = tokens(2, 8, c.vocab_size, 4);
                model.loss(idx, targets).backward();
                std::mt19937_64 rng(11);
                for (auto& [name, p] : model.named_parameters()) {
                    CAPTURE(name);
                    NoGradGuard no_grad;
                    const std::vector<double> grad = p.grad().to_vector<double>();
                    for (int k = 0; k < 3; ++k) {  // three coordinates of each parameter
                        const int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(p.numel()));
                        Tensor flat = p.view({p.numel()}).narrow(0, i, 1);
                        const double x = flat.item<double>(), h = 1e-6;
                        flat.fill_(x + h);
                        const double plus = model.loss(idx, targets).item<double>();
                        flat.fill_(x - h);
                        const double minus = model.loss(idx, targets).item<double>();
                        flat.fill_(x);
                        CHECK(grad[i] == doctest::Approx((plus - minus) / (2 * h)).epsilon(1e-6).scale(1e-3));
                    }
                }
            }
}

TEST_CASE("gpt: with weightless norms Output's gradients equal Normalized's bit for bit, and nothing falls back") {
    for (DType dtype : {DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dtype));
        std::vector<std::vector<double>> grads[2];
        const int64_t fallbacks = output_policy_fallbacks();
        for (int k = 0; k < 2; ++k) {
            manual_seed(12);
            GPT model(preset("nanochat", dtype, k == 0 ? SavePolicy::Output : SavePolicy::Normalized));
            model.loss(tokens(2, 8, 29, 1), tokens(2, 8, 29, 3)).backward();
            for (const Tensor& p : model.parameters()) grads[k].push_back(as_f64(p.grad()));
        }
        CHECK(grads[0] == grads[1]);
        CHECK(output_policy_fallbacks() == fallbacks);
    }
}

TEST_CASE("gpt: fused_head_loss gives the unfused loss and gradients for every preset and policy, tied or not") {
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (SavePolicy policy : kSavePolicies)
            for (bool tie : {false, true}) {
                CAPTURE(arch);
                CAPTURE(policy_name(policy));
                CAPTURE(tie);
                std::vector<std::vector<double>> grads[2];
                double losses[2];
                for (int fused = 0; fused < 2; ++fused) {
                    GPTConfig c = preset(arch, DType::F64, policy);
                    c.tie_embeddings = tie;
                    c.fused_head_loss = fused == 1;
                    manual_seed(13);
                    GPT model(c);
                    Tensor loss = model.loss(tokens(2, 8, c.vocab_size, 1), tokens(2, 8, c.vocab_size, 5));
                    loss.backward();
                    losses[fused] = loss.item<double>();
                    for (const Tensor& p : model.parameters()) grads[fused].push_back(as_f64(p.grad()));
                }
                CHECK(losses[1] == doctest::Approx(losses[0]).epsilon(1e-13));
                for (size_t k = 0; k < grads[0].size(); ++k)
                    for (size_t i = 0; i < grads[0][k].size(); ++i)
                        CHECK(grads[1][k][i] == doctest::Approx(grads[0][k][i]).epsilon(1e-11).scale(1e-9));
            }
}

TEST_CASE("gpt: the blocks' residual adds inside the norms give the unfused adds' loss and gradients bit for bit") {
    // The unfused model, from the same modules: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), each
    // add the add op; logits = lm_head(ln_f(x)). GPT::loss makes each add in the next norm's kernel
    // (ResidualStream); with checkpoint_blocks, a checkpointed block takes the sum. In f64 too, where
// only an add kept apart from the product before it gives the same bits.
    auto unfused_loss = [](const GPT& m, const Tensor& idx, const Tensor& targets) {
        Tensor x = m.embed(idx);
        for (const auto& b : m.h) {
            x = add(x, b->attn->forward(b->ln_1->forward(x)));
            x = add(x, b->mlp->forward(b->ln_2->forward(x)));
        }
        return cross_entropy(m.head(x), targets, m.config().logit_softcap);
    };
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (DType dtype : {DType::F64, DType::F32, DType::BF16})
            for (SavePolicy policy : kSavePolicies)
                for (bool checkpointed : {false, true}) {
                    CAPTURE(arch);
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(policy_name(policy));
                    CAPTURE(checkpointed);
                    GPTConfig c = preset(arch, dtype, policy);
                    c.n_layer = 3;
                    c.checkpoint_blocks = checkpointed;
                    c.checkpoint_every = 2;  // blocks 0 and 2: a checkpointed block after a fused one
                    manual_seed(17);
                    GPT model(c);
                    const Tensor idx = tokens(2, 8, c.vocab_size, 1), targets = tokens(2, 8, c.vocab_size, 3);
                    std::vector<Tensor> grads[2];
                    Tensor losses[2];
                    for (int fused = 0; fused < 2; ++fused) {
                        model.zero_grad();
                        losses[fused] = fused ? model.loss(idx, targets) : unfused_loss(model, idx, targets);
                        losses[fused].backward();
                        for (const Tensor& p : model.parameters()) grads[fused].push_back(p.grad().clone());
                    }
                    CHECK_CLOSE(losses[1], losses[0], (Tolerance{0, 0}));
                    for (size_t k = 0; k < grads[0].size(); ++k) {
                        CAPTURE(k);
                        CHECK_CLOSE(grads[1][k], grads[0][k], (Tolerance{0, 0}));
                    }
                }
}

TEST_CASE("gpt: a batch's gradient is the sum of its micro-batches' gradients, each loss scaled by its share") {
    // What train_gpt --micro-batch relies on (Note [Micro-batches] in examples/train_gpt/train_gpt.cpp):
    // the mean loss of a batch of 4 is the mean of its two halves' mean losses, and backward()
    // adds the gradients of the halves' losses, each times 2/4, into the parameters' grads. f64:
    // equal to 1e-12 (relative, or absolute below 1), the summation order being the only
    // difference. No dropout: each micro-batch would draw its own masks. With the head and the
    // loss fused or not (train_gpt --fused-loss).
    for (const char* arch : {"gpt2", "nanochat", "llama"})
        for (bool fused : {false, true}) {
            CAPTURE(arch);
            CAPTURE(fused);
            GPTConfig c = preset(arch);
            c.fused_head_loss = fused;
            manual_seed(13);
            GPT model(c);
            const Tensor idx = tokens(4, 8, 29, 1), targets = tokens(4, 8, 29, 5);
            Tensor whole = model.loss(idx, targets);
            whole.backward();
            std::vector<std::vector<double>> expected;
            for (const Tensor& p : model.parameters()) expected.push_back(p.grad().to_vector<double>());
            model.zero_grad();
            double mean = 0;
            for (int64_t k = 0; k < 2; ++k) {
                Tensor loss = model.loss(idx.narrow(0, 2 * k, 2).clone(), targets.narrow(0, 2 * k, 2).clone());
                scale(loss, 2.0 / 4.0).backward();
                mean += loss.item<double>() / 2;
            }
            CHECK(std::abs(mean - whole.item<double>()) <= 1e-12 * std::abs(whole.item<double>()));
            const std::vector<Tensor> params = model.parameters();
            REQUIRE(params.size() == expected.size());
            for (size_t i = 0; i < params.size(); ++i) {
                const std::vector<double> got = params[i].grad().to_vector<double>();
                REQUIRE(got.size() == expected[i].size());
                double worst = 0;  // |got - expected| / max(1, |expected|)
                for (size_t j = 0; j < got.size(); ++j)
                    worst = std::max(worst, std::abs(got[j] - expected[i][j]) / std::max(1.0, std::abs(expected[i][j])));
                CAPTURE(i);
                CHECK(worst <= 1e-12);
            }
        }
}

TEST_CASE("gpt: bad input to the model") {
    manual_seed(8);
    GPT model(tiny_config(NormKind::Layer, SavePolicy::Input));
    Tensor ok = from_vector(std::vector<int64_t>(8, 1), {2, 4});
    CHECK_THROWS_KIND_WITH(model.forward(from_vector(std::vector<int64_t>(66, 1), {2, 33})), Error,
                           "sequence length in [1, block_size = 32], got 33");
    CHECK_THROWS_KIND_WITH(model.forward(from_vector(std::vector<int64_t>{1, 2, 256, 3}, {1, 4})), Error,
                           "expected ids in [0, 256), got 256");
    CHECK_THROWS_KIND_WITH(model.forward(from_vector(std::vector<int64_t>{1, -1}, {1, 2})), Error, "got -1");
    CHECK_THROWS_KIND_WITH(model.forward(zeros({2, 4})), Error, "[B, T] i64, got [2, 4] f32");
    CHECK_THROWS_KIND_WITH(model.forward(from_vector(std::vector<int64_t>(8, 1))), Error, "got [8] i64");
    CHECK_THROWS_KIND_WITH(model.loss(ok, from_vector(std::vector<int64_t>(6, 1), {2, 3})), Error,
                           "expected targets of shape [2, 4]");
    GPTConfig bad = tiny_config(NormKind::Layer, SavePolicy::Input);
    bad.n_embd = 30;
    CHECK_THROWS_KIND_WITH(GPT{bad}, Error, "n_embd divisible by n_head");
    bad.n_embd = 0;
    CHECK_THROWS_KIND_WITH(GPT{bad}, Error, "expected positive sizes");
    bad = tiny_config(NormKind::Layer, SavePolicy::Input);
    bad.n_kv_head = 3;
    CHECK_THROWS_KIND_WITH(GPT{bad}, ShapeError, "n_kv_head dividing n_head", "got n_kv_head 3");
    bad = preset("llama");
    bad.n_embd = 12, bad.n_head = 4;  // hs = 3
    CHECK_THROWS_KIND_WITH(GPT{bad}, ShapeError, "even head size", "got 3");
    bad = preset("llama");
    bad.mlp = MLPKind::GELU;
    CHECK_THROWS_KIND_WITH(GPT{bad}, Error, "bias on with mlp gelu");
    bad = preset("nanochat");
    bad.logit_softcap = -1;
    CHECK_THROWS_KIND_WITH(GPT{bad}, Error, "logit_softcap >= 0", "got -1");
    bad = preset("nanochat");
    bad.rope_theta = 0;
    CHECK_THROWS_KIND_WITH(GPT{bad}, Error, "rope_theta > 0", "got 0");
    bad = preset("nanochat");
    bad.mlp_hidden = -4;
    CHECK_THROWS_KIND_WITH(GPT{bad}, ShapeError, "mlp_hidden >= 0", "got -4");
    CHECK_THROWS_KIND_WITH(gpt_config("gpt3"), Error, "gpt2, nanochat or llama", "'gpt3'");
    CHECK(model.loss(ok, ok).numel() == 1);  // still usable after the errors
}

}  // TEST_SUITE
