// tests/test_nn.cpp: modules (names, counts, options, a parameter reachable twice, cycles) and
// safetensors checkpoints of a module (round trip and bad files). AdamW and gradient clipping:
// tests/test_adamw.cpp.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "optim_test_util.h"

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

// A module whose registrations the tests make from outside: weight tying, cycles.
class Open : public Module {
public:
    using Module::register_module;
    using Module::register_parameter;
};

std::vector<std::string> names_of(const NamedTensors& named) {
    std::vector<std::string> names;
    for (const auto& [name, t] : named) names.push_back(name);
    return names;
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

TEST_CASE("nn: a norm module's forward(x, residual) is the norm of x + residual, with it, bit for bit") {
    for (NormKind kind : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
            CAPTURE(norm_kind_name(kind));
            CAPTURE(policy_name(policy));
            NormOptions o;
            o.policy = policy;
            auto norm = make_norm(kind, 8, o);
            manual_seed(3);
            for (Tensor& p : norm->parameters()) {
                NoGradGuard no_grad;
                p.copy_(add(p, scale(randn(p.shape()), 0.2)));
            }
            Tensor x = randn({3, 8}), r = randn({3, 8});
            FusedNormOutputs out = norm->forward(x, r);
            Tensor s = add(x, r);
            CHECK_CLOSE(out.residual_out, s, (Tolerance{0, 0}));
            CHECK_CLOSE(out.y, norm->forward(s), (Tolerance{0, 0}));
            CHECK_FALSE(out.y1.defined());
            CHECK_THROWS_KIND_WITH(norm->forward(x, randn({3, 4})), ShapeError,
                                   kind == NormKind::Layer ? "layer_norm_fn" : "rms_norm_fn",
                                   "expected residual of x's shape [3, 8], got [3, 4]");
        }
}

TEST_CASE("nn: zero_grad drops every gradient") {
    GPT model(small_config());
    Tensor idx = from_vector(std::vector<int64_t>(8, 3), {1, 8});
    model.loss(idx, idx).backward();
    for (const Tensor& p : model.parameters()) CHECK(p.grad().defined());
    model.zero_grad();
    for (const Tensor& p : model.parameters()) CHECK_FALSE(p.grad().defined());
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

TEST_CASE("nn: a parameter reachable twice (weight tying) is listed once, under its first name, and saved and loaded once") {
    // One Linear registered under two names, and one tensor registered as the parameter of two modules.
    manual_seed(3);
    Open tied;
    auto a = tied.register_module("a", std::make_shared<Linear>(2, 3));
    tied.register_module("b", a);
    auto head = tied.register_module("head", std::make_shared<Open>());
    head->register_parameter("weight", a->weight);
    CHECK(names_of(tied.named_parameters()) == std::vector<std::string>{"a.weight", "a.bias"});
    CHECK(tied.parameters().size() == 2);
    CHECK(tied.num_parameters() == 3 * 2 + 3);
    std::vector<std::string> modules;
    for (const auto& [path, m] : tied.named_modules()) modules.push_back(path);
    CHECK(modules == std::vector<std::string>{"", "a", "head"});  // as torch's named_modules: a module once
    CHECK(tied.children().size() == 2);
    // A model without sharing keeps every name.
    CHECK(names_of(Linear(2, 3).named_parameters()) == std::vector<std::string>{"weight", "bias"});

    // The optimizer built from parameters() updates the tied weight once per step, as an untied copy.
    Linear ref(2, 3);
    ref.weight.detach().copy_(a->weight.detach());
    AdamW opt(tied.parameters(), AdamWOptions()), opt_ref(ref.parameters(), AdamWOptions());
    Tensor g = from_vector<float>({1, -2, 3, -4, 5, -6}, {3, 2});
    set_grad(a->weight, g);
    set_grad(ref.weight, g);
    opt.step();
    opt_ref.step();
    CHECK(a->weight.to_vector<float>() == ref.weight.to_vector<float>());

    // A checkpoint holds the tied tensor once, under its first name, and loads back into it.
    std::string path = temp_path("tied.safetensors");
    save_checkpoint(path, tied, {}, &opt);
    CHECK(names_of(load_safetensors(path)).size() == 2 + 2 * 2);  // the parameters, and m and v of each
    std::vector<float> saved = a->weight.to_vector<float>();
    {
        NoGradGuard no_grad;
        a->weight.fill_(0.0);
    }
    load_checkpoint(path, tied, &opt);
    CHECK(a->weight.to_vector<float>() == saved);
    std::remove(path.c_str());
}

TEST_CASE("nn: a module registered as its own descendant is refused, and the walks stay finite") {
    auto root = std::make_shared<Open>();
    auto child = root->register_module("child", std::make_shared<Open>());
    auto grandchild = child->register_module("grandchild", std::make_shared<Open>());
    REQUIRE_THROWS_AS(root->register_module("self", root), Error);  // else the walks below never end
    CHECK_THROWS_KIND_WITH(root->register_module("self", root), Error, "register_module", "\"self\"",
                           "cycle");
    CHECK_THROWS_KIND_WITH(grandchild->register_module("up", root), Error, "register_module", "\"up\"", "cycle");
    CHECK_THROWS_KIND_WITH(child->register_module("up", child), Error, "register_module", "cycle");
    CHECK_THROWS_KIND_WITH(root->register_module("none", std::shared_ptr<Open>()), Error, "register_module",
                           "\"none\"", "null");
    // Nothing was added; the tree walks as before.
    CHECK(root->named_modules().size() == 3);
    CHECK(grandchild->children().empty());
    int visits = 0;
    root->apply([&](Module&) { ++visits; });
    CHECK(visits == 3);
    root->eval();
    CHECK_FALSE(grandchild->is_training());
    // A module shared by two parents is a DAG, not a cycle: allowed.
    auto shared = std::make_shared<Open>();
    root->register_module("s1", shared);
    child->register_module("s2", shared);
    CHECK(root->named_modules().size() == 4);
}

}  // TEST_SUITE
