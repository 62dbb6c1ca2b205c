// tests/test_gpt.cpp: the model end to end: it learns real text, it can overfit one batch, the
// two policies train identically, and bad input to the model is rejected clearly.
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
    CHECK(model.loss(ok, ok).numel() == 1);  // still usable after the errors
}

}  // TEST_SUITE
