// tests/test_memory_report.cpp: memory a user can see and steer: saved_tensors_report()
// (core/saved_report.h) against saved_bytes() to the byte, its holders and module paths; the
// memory trace's labels (core/allocator.h MemoryEvent); Module::named_modules / children / apply
// and set_save_policy on a model written by a user.
#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

GPTConfig report_config(NormKind norm, SavePolicy policy, DType dtype = DType::F32) {
    return GPTConfig{.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 24, .norm = norm, .policy = policy, .dtype = dtype};
}

// The entry whose holders include (grad_fn, slot), or nullptr.
const SavedTensorEntry* find(const SavedTensorsReport& r, const std::string& grad_fn, const std::string& slot,
                             const std::string& module) {
    for (const SavedTensorEntry& e : r.entries)
        for (const SavedTensorHolder& h : e.holders)
            if (h.grad_fn == grad_fn && h.slot == slot && h.module == module) return &e;
    return nullptr;
}

// A model a user writes with the public API: its own module holding both norms and a Linear.
class TwoNorms : public Module {
public:
    TwoNorms() {
        a = register_module("a", std::make_shared<LayerNorm>(8));
        proj = register_module("proj", std::make_shared<Linear>(8, 8));
        b = register_module("b", std::make_shared<RMSNorm>(8));
    }
    Tensor forward(const Tensor& x) const {
        ModuleScope scope(*this);
        return b->forward(proj->forward(a->forward(x)));
    }
    std::shared_ptr<LayerNorm> a;
    std::shared_ptr<Linear> proj;
    std::shared_ptr<RMSNorm> b;
};

}  // namespace

TEST_SUITE("memory_report") {

TEST_CASE("saved_tensors_report: the total equals saved_bytes for a GPT of each norm under each policy") {
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : kSavePolicies)
            for (bool checkpoint_blocks : {false, true}) {
                INFO(norm_kind_name(norm), " policy ", static_cast<int>(policy), " checkpoint ", checkpoint_blocks);
                GPTConfig c = report_config(norm, policy);
                c.checkpoint_blocks = checkpoint_blocks;
                manual_seed(1);
                GPT model(c);
                TokenBatch b = token_batch(GPTConfig{}, 3, 10);
                Tensor loss = model.loss(b.idx, b.targets);
                SavedTensorsReport r = saved_tensors_report();
                CHECK(r.total_bytes == saved_bytes());
                int64_t sum = 0, by_module = 0, by_op = 0;
                for (const SavedTensorEntry& e : r.entries) sum += e.bytes;
                for (const auto& [name, bytes] : r.bytes_by_module) by_module += bytes;
                for (const auto& [name, bytes] : r.bytes_by_op) by_op += bytes;
                CHECK(sum == r.total_bytes);
                CHECK(by_module == r.total_bytes);
                CHECK(by_op == r.total_bytes);
                CHECK(r.bytes_on(Device::CPU) == r.total_bytes);
                loss.backward();
                CHECK(saved_tensors_report().entries.empty());
            }
}

TEST_CASE("saved_tensors_report: a storage shared by two nodes appears once, naming both") {
    manual_seed(1);
    GPT output(report_config(NormKind::Layer, SavePolicy::Output));
    TokenBatch b = token_batch(GPTConfig{}, 2, 8);
    Tensor loss = output.loss(b.idx, b.targets);
    SavedTensorsReport r = saved_tensors_report();
    // ln_1's y is saved by the norm (slot y) and by c_attn (slot input): one entry, two holders.
    const SavedTensorEntry* y = find(r, "LayerNormBackward", "y", "h.0.ln_1");
    REQUIRE(y != nullptr);
    CHECK(y == find(r, "LinearBackward", "input", "h.0.attn.c_attn"));
    CHECK(y->shared());
    CHECK(y->holders.size() == 2);
    CHECK(y->bytes == 2 * 8 * 24 * 4);
    CHECK(y->shape == Shape{2, 8, 24});
    loss = Tensor();

    // Under Normalized c_attn keeps y's recipe, which keeps x_hat alive: it holds x_hat "via" it.
    GPT normalized(report_config(NormKind::RMS, SavePolicy::Normalized));
    loss = normalized.loss(b.idx, b.targets);
    r = saved_tensors_report();
    const SavedTensorEntry* x_hat = find(r, "RMSNormBackward", "x_hat", "h.1.ln_2");
    REQUIRE(x_hat != nullptr);
    REQUIRE(x_hat->holders.size() == 2);
    CHECK(x_hat->holders[1].grad_fn == "LinearGeluBackward");
    CHECK(x_hat->holders[1].module == "h.1.mlp.c_fc");
    CHECK(x_hat->holders[1].via == "norm affine");
    CHECK(r.total_bytes == saved_bytes());
}

TEST_CASE("saved_tensors_report: module paths name the module that recorded each saved tensor") {
    manual_seed(1);
    GPT model(report_config(NormKind::Layer, SavePolicy::Input));
    TokenBatch b = token_batch(GPTConfig{}, 2, 8);
    Tensor loss = model.loss(b.idx, b.targets);
    std::set<std::pair<std::string, std::string>> seen;  // (module, grad_fn)
    for (const SavedTensorEntry& e : saved_tensors_report().entries)
        for (const SavedTensorHolder& h : e.holders) seen.insert({h.module, h.grad_fn});
    const std::set<std::pair<std::string, std::string>> expected{
        {"wte", "EmbeddingBackward"},
        {"h.0.ln_1", "LayerNormBackward"},       {"h.0.attn.c_attn", "LinearBackward"},
        {"h.0.attn", "CausalSelfAttentionBackward"}, {"h.0.attn.c_proj", "LinearBackward"},
        {"h.0.ln_2", "LayerNormBackward"},       {"h.0.mlp.c_fc", "LinearGeluBackward"},
        {"h.0.mlp.c_proj", "LinearBackward"},
        {"h.1.ln_1", "LayerNormBackward"},       {"h.1.attn.c_attn", "LinearBackward"},
        {"h.1.attn", "CausalSelfAttentionBackward"}, {"h.1.attn.c_proj", "LinearBackward"},
        {"h.1.ln_2", "LayerNormBackward"},       {"h.1.mlp.c_fc", "LinearGeluBackward"},
        {"h.1.mlp.c_proj", "LinearBackward"},
        {"ln_f", "LayerNormBackward"},          {"lm_head", "LinearBackward"},
        {"", "CrossEntropyBackward"}};
    CHECK(seen == expected);
}

TEST_CASE("saved_tensors_report: the table and the JSON say what the entries say") {
    manual_seed(1);
    GPT model(report_config(NormKind::Layer, SavePolicy::Normalized));
    TokenBatch b = token_batch(GPTConfig{}, 2, 8);
    Tensor loss = model.loss(b.idx, b.targets);
    SavedTensorsReport r = saved_tensors_report();
    nlohmann::json j = nlohmann::json::parse(r.json());
    CHECK(j["total_bytes"].get<int64_t>() == saved_bytes());
    CHECK(j["entries"].size() == r.entries.size());
    int64_t sum = 0;
    for (const auto& e : j["entries"]) sum += e["bytes"].get<int64_t>();
    CHECK(sum == r.total_bytes);
    CHECK(j["entries"][0]["holders"][0]["grad_fn"] == r.entries[0].holders[0].grad_fn);
    CHECK(j["bytes_by_module"]["h.0.attn"].get<int64_t>() > 0);
    std::string table = r.table(5);
    CHECK(table.find(std::to_string(r.total_bytes) + " bytes") != std::string::npos);
    CHECK(table.find("the 5 largest") != std::string::npos);
    CHECK(r.table().find("via norm affine") != std::string::npos);
    CHECK(table.find("by module:") != std::string::npos);
}

TEST_CASE("memory trace: each allocation names its module and phase, and the deltas add up") {
    manual_seed(1);
    GPT model(report_config(NormKind::Layer, SavePolicy::Input));
    TokenBatch b = token_batch(GPTConfig{}, 2, 8);
    std::vector<MemoryEvent> trace;
    const int64_t start = memory_stats(Device::CPU).allocated_bytes;
    set_memory_trace(Device::CPU, &trace);
    {
        Tensor loss = model.loss(b.idx, b.targets);
        loss.backward();
    }
    set_memory_trace(Device::CPU, nullptr);
    REQUIRE(!trace.empty());
    int64_t sum = 0;
    std::set<std::string> forward_scopes, backward_nodes;
    for (const MemoryEvent& e : trace) {
        sum += e.delta_bytes;
        CHECK(e.allocated_bytes == start + sum);
        REQUIRE(e.scope != nullptr);
        if (e.backward) {
            REQUIRE(e.node != nullptr);
            backward_nodes.insert(std::string(e.node) + " " + *e.scope);
        } else {
            CHECK(e.node == nullptr);
            forward_scopes.insert(*e.scope);
        }
    }
    CHECK(forward_scopes.count("h.1.mlp.c_fc") == 1);
    CHECK(forward_scopes.count("h.0.attn") == 1);
    CHECK(backward_nodes.count("LayerNormBackward h.1.ln_2") == 1);
    CHECK(backward_nodes.count("CausalSelfAttentionBackward h.0.attn") == 1);
}

TEST_CASE("Module: named_modules, children and apply walk a user's model") {
    TwoNorms m;
    std::vector<std::string> names;
    for (const auto& [name, module] : m.named_modules()) names.push_back(name);
    CHECK(names == std::vector<std::string>{"", "a", "proj", "b"});
    CHECK(m.children().size() == 3);
    CHECK(m.children()[1].get() == m.proj.get());
    CHECK(m.proj->name() == "proj");
    std::vector<std::string> order;
    m.apply([&](Module& x) { order.push_back(x.name()); });
    CHECK(order == std::vector<std::string>{"a", "proj", "b", ""});
    manual_seed(1);
    GPT gpt(report_config(NormKind::RMS, SavePolicy::Input));
    CHECK(gpt.named_modules().size() == 1 + 3 + 2 * (1 + 1 + 4 + 1 + 4) + 1 + 1);
    CHECK(gpt.named_modules()[4].first == "h.0");
}

TEST_CASE("set_save_policy: every norm of a user's model, with the saving the policy promises") {
    TwoNorms m;
    Tensor x = input({5, 8}, DType::F32);
    auto saved = [&] {
        const int64_t before = saved_bytes();
        Tensor y = m.forward(scale(x, 1.0));
        return std::pair<int64_t, SavedTensorsReport>{saved_bytes() - before, saved_tensors_report()};
    };
    CHECK(set_save_policy(m, SavePolicy::Input) == 2);
    auto [input_bytes, input_report] = saved();
    CHECK(find(input_report, "LayerNormBackward", "x", "a") != nullptr);
    CHECK(find(input_report, "RMSNormBackward", "x", "b") != nullptr);
    CHECK(set_save_policy(m, SavePolicy::Output) == 2);
    CHECK(m.a->options.policy == SavePolicy::Output);
    CHECK(m.b->options.policy == SavePolicy::Output);
    auto [output_bytes, output_report] = saved();
    CHECK(find(output_report, "LayerNormBackward", "y", "a") != nullptr);
    // a's input (5 x 8 f32 and its 5 means) is no longer held: proj saves a's y, which a saves too.
    CHECK(input_bytes - output_bytes == 5 * 8 * 4 + 5 * 4);
}

}  // TEST_SUITE
