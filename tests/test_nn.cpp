// tests/test_nn.cpp: modules (names, counts, options), AdamW against its formula, gradient
// clipping, and safetensors checkpoints (round trip and bad files).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

GPTConfig small_config() {
    return {.block_size = 8, .n_layer = 2, .n_head = 2, .n_embd = 8};
}

// A path unique to this process (ctest runs test cases in parallel processes).
std::string temp_path(const std::string& name) {
    std::string unique = "normtape_test_nn_" + std::to_string(getpid()) + "_" + name;
    return (std::filesystem::temp_directory_path() / unique).string();
}

}  // namespace

TEST_SUITE("nn") {

TEST_CASE("nn: GPT parameters have GPT-2 names and the expected count") {
    GPT model(small_config());
    NamedTensors params = model.named_parameters();
    std::vector<std::string> names;
    for (auto& [n, t] : params) names.push_back(n);
    for (const char* expected : {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                                 "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.ln_2.weight", "h.0.mlp.c_fc.weight",
                                 "h.1.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias", "lm_head.weight"}) {
        CAPTURE(expected);
        CHECK(std::find(names.begin(), names.end(), expected) != names.end());
    }
    const int64_t V = 256, T = 8, C = 8, L = 2;
    int64_t per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
    CHECK(model.num_parameters() == V * C + T * C + L * per_block + 2 * C + V * C);
    GPTConfig rms = small_config();
    rms.norm = NormKind::RMS;
    CHECK(GPT(rms).num_parameters() == model.num_parameters() - (2 * L + 1) * C);  // no norm biases
    CHECK(num_parameters(small_config()) == model.num_parameters());
    CHECK(num_parameters(rms) == GPT(rms).num_parameters());
}

TEST_CASE("nn: norm module options") {
    NormOptions o;
    o.elementwise_affine = false;
    CHECK(LayerNorm(8, o).named_parameters().empty());
    o.elementwise_affine = true;
    o.bias = false;
    CHECK(LayerNorm(8, o).named_parameters().size() == 1);
    CHECK(RMSNorm(8).named_parameters().size() == 1);
    CHECK_THROWS_KIND_WITH(LayerNorm(0), Error, "LayerNorm: expected normalized_shape > 0, got 0");
    Tensor x = randn({3, 8});
    LayerNorm ln(8);
    CHECK_CLOSE(ln.forward(x), layer_norm(x, ones({8}), zeros({8})), tolerance(DType::F32));
}

TEST_CASE("nn: zero_grad drops every gradient") {
    GPT model(small_config());
    Tensor idx = from_vector(std::vector<int64_t>(8, 3), {1, 8});
    model.loss(idx, idx).backward();
    for (const Tensor& p : model.parameters()) CHECK(p.grad().defined());
    model.zero_grad();
    for (const Tensor& p : model.parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("nn: AdamW follows its formula, with decoupled weight decay and bias correction") {
    Tensor p = from_vector(std::vector<double>{1.0, -2.0}).requires_grad_(true);
    AdamWOptions o;
    o.lr = 0.1;
    o.beta1 = 0.9;
    o.beta2 = 0.99;
    o.eps = 1e-8;
    o.weight_decay = 0.5;
    AdamW opt({p}, o);
    std::vector<double> ref = {1.0, -2.0}, m = {0, 0}, v = {0, 0};
    for (int t = 1; t <= 3; ++t) {
        std::vector<double> g = {0.3 * t, -0.7};
        opt.zero_grad();
        sum(mul(p, from_vector(g))).backward();  // grad = g
        opt.step();
        for (int k = 0; k < 2; ++k) {
            ref[k] *= 1 - o.lr * o.weight_decay;
            m[k] = o.beta1 * m[k] + (1 - o.beta1) * g[k];
            v[k] = o.beta2 * v[k] + (1 - o.beta2) * g[k] * g[k];
            double mh = m[k] / (1 - std::pow(o.beta1, t)), vh = v[k] / (1 - std::pow(o.beta2, t));
            ref[k] -= o.lr * mh / (std::sqrt(vh) + o.eps);
        }
    }
    CHECK_CLOSE(p, from_vector(ref), tolerance(DType::F64));
    CHECK(opt.step_count() == 3);
}

TEST_CASE("nn: clip_grad_norm_ scales gradients to the maximum norm and returns the old norm") {
    Tensor a = from_vector(std::vector<double>{0, 0}).requires_grad_(true);
    Tensor b = from_vector(std::vector<double>{0}).requires_grad_(true);
    add(sum(mul(a, from_vector(std::vector<double>{3, 0}))), sum(mul(b, from_vector(std::vector<double>{4})))).backward();
    double norm = clip_grad_norm_({a, b}, 1.0);
    CHECK(norm == doctest::Approx(5.0));
    CHECK(a.grad().to_vector<double>()[0] == doctest::Approx(0.6).epsilon(1e-6));
    CHECK(b.grad().to_vector<double>()[0] == doctest::Approx(0.8).epsilon(1e-6));
    CHECK(clip_grad_norm_({a, b}, 10.0) == doctest::Approx(1.0).epsilon(1e-5));  // below the limit: unchanged
    CHECK_THROWS_KIND_WITH(clip_grad_norm_({a}, 0.0), Error, "max_norm > 0");
}

TEST_CASE("nn: a checkpoint round-trips every parameter bit for bit") {
    manual_seed(1);
    GPT a(small_config());
    std::string path = temp_path("roundtrip.safetensors");
    save_checkpoint(path, a, {{"note", "test"}});
    manual_seed(2);
    GPT b(small_config());
    load_checkpoint(path, b);
    NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
        CAPTURE(pa[i].first);
        CHECK(pa[i].second.to_vector<float>() == pb[i].second.to_vector<float>());
    }
    std::map<std::string, std::string> meta;
    NamedTensors file = load_safetensors(path, &meta);
    CHECK(file.size() == pa.size());
    CHECK(meta["note"] == "test");
    std::remove(path.c_str());
}

TEST_CASE("nn: bad checkpoint files are rejected with the file and the reason") {
    GPT model(small_config());
    std::string path = temp_path("bad.safetensors");
    CHECK_THROWS_KIND_WITH(load_checkpoint(temp_path("missing.safetensors"), model), Error, "cannot open");
    {
        std::ofstream f(path, std::ios::binary);
        f << "abc";
    }
    CHECK_THROWS_KIND_WITH(load_safetensors(path), Error, "too short");
    {
        std::ofstream f(path, std::ios::binary);
        unsigned char len[8] = {200, 0, 0, 0, 0, 0, 0, 0};
        f.write(reinterpret_cast<char*>(len), 8);
        f << "{}";
    }
    CHECK_THROWS_KIND_WITH(load_safetensors(path), Error, "exceeds the file size");
    // A truncated data section.
    save_checkpoint(path, model);
    std::filesystem::resize_file(path, std::filesystem::file_size(path) - 16);
    CHECK_THROWS_KIND_WITH(load_safetensors(path), Error, "do not fit");
    // A checkpoint of another shape: nothing is modified.
    GPTConfig other = small_config();
    other.n_embd = 16;
    save_checkpoint(path, GPT(other));
    std::vector<float> before = model.wte->weight.to_vector<float>();
    CHECK_THROWS_KIND_WITH(load_checkpoint(path, model), Error, "parameter wte.weight expected [256, 8] f32");
    CHECK(model.wte->weight.to_vector<float>() == before);
    std::remove(path.c_str());
}

}  // TEST_SUITE
