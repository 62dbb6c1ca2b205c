// tests/test_checkpoint.cpp: checkpoints of a model and its optimizer (nn/formats/checkpoint.h) and
// resuming train_gpt.
// - the model and the optimizers' state (AdamW's, and Muon's beside it) round-trip bit for bit,
//   and training goes on identically;
// - loading refuses a file without optimizer state, of another optimizer or of other
//   hyperparameters or shape, a parameter in neither optimizer or in both, or a file holding a
//   NaN or an Inf, changing nothing; a file written before groups had lr_scale loads;
// - train_gpt stopped at step k and resumed gives the losses of the run that never stopped, bit
//   for bit (with --micro-batch and --optimizer muon too), and refuses to resume another run,
//   saying why;
// - a failed save leaves the previous file intact and no temporary file behind;
// - loading leaks nothing.
// The safetensors format itself (bad files, other writers' files): tests/test_safetensors.cpp.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;

namespace {

GPTConfig small_config(DType dtype = DType::F32) {
    return {.block_size = 8, .n_layer = 1, .n_head = 2, .n_embd = 8, .dtype = dtype};
}

AdamW make_optimizer(const GPT& model, double beta2 = 0.95) {
    std::vector<ParamGroup> groups(2);
    groups[0].weight_decay = 0.1;
    groups[1].weight_decay = 0.0;
    for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta2 = beta2;
    return AdamW(groups, o);
}

// train_gpt --optimizer muon's two optimizers (examples/train_gpt/optimizers.cpp, make_optimizers):
// AdamW for param_groups_for_muon's embeddings, head and vectors, one group each with its own
// lr_scale; Muon for the blocks' matrices, in one group of lr scale `muon_lr_scale`.
struct MuonOptimizers {
    AdamW adamw;
    Muon muon;
};
MuonOptimizers make_muon_optimizers(const GPT& model, MuonOptions muon = {}, double muon_lr_scale = 1.0) {
    const MuonParamSplit split = param_groups_for_muon(model);
    AdamWOptions o;
    o.lr = 1e-2;
    o.beta1 = 0.8;
    o.eps = 1e-10;
    return {AdamW({{split.embeddings, 0.0, 20.0}, {split.head, 0.0, 0.4}, {split.vectors, 0.0, 0.4}}, o),
            Muon(std::vector<ParamGroup>{{split.matrices, 0.0, muon_lr_scale}}, muon)};
}

// One training step on a fixed batch drawn from `seed`, with `muon` too (it steps after AdamW, as
// train_gpt's).
void train_step(GPT& model, AdamW& optimizer, uint64_t seed, Muon* muon = nullptr) {
    std::vector<int64_t> idx(16), targets(16);
    for (int i = 0; i < 16; ++i) {
        idx[i] = static_cast<int64_t>((seed * 31 + i * 7) % 256);
        targets[i] = static_cast<int64_t>((seed * 17 + i * 13) % 256);
    }
    Tensor loss = model.loss(from_vector(idx, {2, 8}), from_vector(targets, {2, 8}));
    loss.backward();
    optimizer.step();
    if (muon) muon->step();
    optimizer.zero_grad();
    if (muon) muon->zero_grad();
}
void train_step(GPT& model, MuonOptimizers& o, uint64_t seed) { train_step(model, o.adamw, seed, &o.muon); }

// The raw bytes of a cpu tensor, to compare bit for bit (NaN-safe, -0 != +0).
std::string bytes_of(const Tensor& t) {
    Tensor c = t.contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

// The losses of the single run in train_gpt's JSON, and the step of the first one.
std::vector<double> losses_of(const std::string& json_path, int64_t* first_step = nullptr) {
    nlohmann::json j = nlohmann::json::parse(slurp(json_path));
    REQUIRE(j["runs"].size() == 1);
    if (first_step) *first_step = j["runs"][0]["first_step"].get<int64_t>();
    return j["runs"][0]["losses"].get<std::vector<double>>();
}

}  // namespace

TEST_SUITE("checkpoint") {

TEST_CASE("checkpoint: model and AdamW state round-trip bit for bit, and training goes on identically") {
    for (DType dtype : {DType::F32, DType::BF16}) {  // bf16: the f32 master copies are part of the state
        CAPTURE(dtype_name(dtype));
        TempDir dir("roundtrip");
        manual_seed(1);
        GPT a(small_config(dtype));
        AdamW opt_a = make_optimizer(a);
        for (uint64_t s = 0; s < 3; ++s) train_step(a, opt_a, s);
        save_checkpoint(dir / "ck.safetensors", a, {{"note", "three steps"}}, &opt_a);

        manual_seed(2);  // other initial weights: everything must come from the file
        GPT b(small_config(dtype));
        AdamW opt_b = make_optimizer(b);
        std::map<std::string, std::string> meta;
        NamedTensors file = load_safetensors(dir / "ck.safetensors", &meta);
        CHECK(meta["note"] == "three steps");
        load_checkpoint(dir / "ck.safetensors", file, meta, b, &opt_b);
        CHECK(opt_b.step_count() == 3);
        NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
        REQUIRE(pa.size() == pb.size());
        // every parameter plus m and v of each, plus a master copy of each bf16 parameter
        CHECK(file.size() == pa.size() * (dtype == DType::BF16 ? 4 : 3));
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            const AdamW::ParamState &sa = opt_a.state(pa[i].second), &sb = opt_b.state(pb[i].second);
            CHECK(bytes_of(sa.m) == bytes_of(sb.m));
            CHECK(bytes_of(sa.v) == bytes_of(sb.v));
            CHECK(sa.master.defined() == (dtype == DType::BF16));
            if (sa.master.defined()) CHECK(bytes_of(sa.master) == bytes_of(sb.master));
        }
        // Two more steps on each: the same parameters, bit for bit.
        for (uint64_t s = 3; s < 5; ++s) {
            train_step(a, opt_a, s);
            train_step(b, opt_b, s);
        }
        pa = a.named_parameters();
        pb = b.named_parameters();
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
        }
    }
}

TEST_CASE("checkpoint: a model with AdamW and Muon round-trips bit for bit, and training goes on identically") {
    for (DType dtype : {DType::F32, DType::BF16}) {  // bf16: both optimizers' f32 master copies are state
        CAPTURE(dtype_name(dtype));
        TempDir dir("roundtrip_muon");
        const std::string path = dir / "ck.safetensors";
        manual_seed(1);
        GPT a(small_config(dtype));
        MuonOptimizers opt_a = make_muon_optimizers(a);
        for (uint64_t s = 0; s < 3; ++s) train_step(a, opt_a, s);
        save_checkpoint(path, a, {{"note", "three steps"}}, &opt_a.adamw, &opt_a.muon);

        // The file: each parameter, AdamW's two moments or Muon's one buffer, a master copy of
        // each bf16 parameter, and an entry per optimizer.
        std::map<std::string, std::string> meta;
        NamedTensors file = load_safetensors(path, &meta);
        const MuonParamSplit split = param_groups_for_muon(a);
        const size_t n_params = a.named_parameters().size(), n_matrices = split.matrices.size();
        REQUIRE(n_matrices > 0);
        CHECK(file.size() == n_params + 2 * (n_params - n_matrices) + n_matrices + (dtype == DType::BF16 ? n_params : 0));
        CHECK(meta["note"] == "three steps");
        const nlohmann::json muon_entry = nlohmann::json::parse(meta.at("optimizer.muon"));
        CHECK(muon_entry["type"] == "Muon");
        CHECK(muon_entry["step"] == 3);
        CHECK(muon_entry["groups"][0]["size"] == n_matrices);
        CHECK(nlohmann::json::parse(meta.at("optimizer"))["groups"].size() == 3);

        manual_seed(2);  // other initial weights: everything must come from the file
        GPT b(small_config(dtype));
        MuonOptimizers opt_b = make_muon_optimizers(b);
        if (dtype == DType::F32) {
            bool checksummed = false;
            load_checkpoint(path, b, &opt_b.adamw, &checksummed, &opt_b.muon);
            CHECK(checksummed);
        } else {  // the overload for a file already read
            load_checkpoint(path, file, meta, b, &opt_b.adamw, &opt_b.muon);
        }
        CHECK(opt_b.adamw.step_count() == 3);
        CHECK(opt_b.muon.step_count() == 3);
        NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
        REQUIRE(pa.size() == pb.size());
        int64_t in_muon = 0;
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            const bool muon = std::any_of(split.matrices.begin(), split.matrices.end(),
                                          [&](const Tensor& m) { return &m.impl() == &pa[i].second.impl(); });
            Tensor master_a, master_b;
            if (muon) {
                ++in_muon;
                const Muon::ParamState &sa = opt_a.muon.state(pa[i].second), &sb = opt_b.muon.state(pb[i].second);
                CHECK(bytes_of(sa.momentum_buffer) != bytes_of(zeros(sa.momentum_buffer.shape())));  // three steps' worth
                CHECK(bytes_of(sa.momentum_buffer) == bytes_of(sb.momentum_buffer));
                master_a = sa.master;
                master_b = sb.master;
            } else {
                const AdamW::ParamState &sa = opt_a.adamw.state(pa[i].second), &sb = opt_b.adamw.state(pb[i].second);
                CHECK(bytes_of(sa.m) == bytes_of(sb.m));
                CHECK(bytes_of(sa.v) == bytes_of(sb.v));
                master_a = sa.master;
                master_b = sb.master;
            }
            CHECK(master_a.defined() == (dtype == DType::BF16));
            if (master_a.defined()) CHECK(bytes_of(master_a) == bytes_of(master_b));
        }
        CHECK(in_muon == static_cast<int64_t>(n_matrices));
        // The next steps on each: the same parameters, bit for bit.
        for (uint64_t s = 3; s < 5; ++s) {
            train_step(a, opt_a, s);
            train_step(b, opt_b, s);
            pa = a.named_parameters();
            pb = b.named_parameters();
            for (size_t i = 0; i < pa.size(); ++i) {
                CAPTURE(s);
                CAPTURE(pa[i].first);
                CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            }
        }
    }
}

TEST_CASE("checkpoint: Muon's state is refused when missing, malformed, of other hyperparameters or not one owner's, changing nothing") {
    TempDir dir("refuse_muon");
    manual_seed(3);
    GPT a(small_config());
    MuonOptimizers opt_a = make_muon_optimizers(a);
    train_step(a, opt_a, 0);
    const std::string full = dir / "full.safetensors";
    save_checkpoint(full, a, {}, &opt_a.adamw, &opt_a.muon);
    AdamW adamw_all = make_optimizer(a);  // every parameter
    train_step(a, adamw_all, 1);
    const std::string adamw_only = dir / "adamw_only.safetensors";
    save_checkpoint(adamw_only, a, {}, &adamw_all);

    manual_seed(4);
    GPT b(small_config());
    MuonOptimizers opt_b = make_muon_optimizers(b);
    train_step(b, opt_b, 5);
    const Tensor matrix = param_groups_for_muon(b).matrices.at(0);  // a handle to the parameter
    // Every byte of b's parameters and of both optimizers' state, and the step counts.
    auto state = [&] {
        std::string s = std::to_string(opt_b.adamw.step_count()) + " " + std::to_string(opt_b.muon.step_count()) + " ";
        for (const ParamGroup& g : opt_b.adamw.groups())
            for (const Tensor& p : g.params) s += bytes_of(p) + bytes_of(opt_b.adamw.state(p).m) + bytes_of(opt_b.adamw.state(p).v);
        for (const Tensor& p : opt_b.muon.groups()[0].params) s += bytes_of(p) + bytes_of(opt_b.muon.state(p).momentum_buffer);
        return s;
    };
    const std::string before = state(), matrix_before = bytes_of(matrix),
                      buffer_before = bytes_of(opt_b.muon.state(matrix).momentum_buffer);
    // A checkpoint of AdamW alone has no state for a Muon.
    CHECK_THROWS_KIND_WITH(load_checkpoint(adamw_only, b, nullptr, nullptr, &opt_b.muon), FormatError, adamw_only,
                           "holds no optimizer state for Muon", "no \"optimizer.muon\" metadata");
    // Hyperparameters that differ from the file's, each named with both values.
    const std::string n = std::to_string(opt_a.muon.groups()[0].params.size());
    struct Case {
        std::string name;
        MuonOptions options;
        double lr_scale;
        std::string expected, found;
    };
    MuonOptions momentum, nesterov, ns_steps;
    momentum.momentum = 0.9;
    nesterov.nesterov = false;
    ns_steps.ns_steps = 3;
    const std::string file_has = "the file has momentum 0.95, nesterov true, ns_steps 5, groups (" + n +
                                 " params, weight decay 0.0, lr scale 1.0)";
    for (const Case& c : {Case{"momentum", momentum, 1.0, "expected momentum 0.9, nesterov true, ns_steps 5", file_has},
                          Case{"nesterov", nesterov, 1.0, "expected momentum 0.95, nesterov false, ns_steps 5", file_has},
                          Case{"ns_steps", ns_steps, 1.0, "expected momentum 0.95, nesterov true, ns_steps 3", file_has},
                          Case{"lr_scale", MuonOptions{}, 2.0, "weight decay 0.0, lr scale 2.0)", file_has}}) {
        CAPTURE(c.name);
        MuonOptimizers other = make_muon_optimizers(b, c.options, c.lr_scale);
        CHECK_THROWS_KIND_WITH(load_checkpoint(full, b, &other.adamw, nullptr, &other.muon), Error,
                               "the Muon optimizer's hyperparameters differ from the file's", c.expected, c.found);
    }
    // Each parameter in exactly one optimizer, on save and on load.
    AdamW adamw_all_b = make_optimizer(b);
    CHECK_THROWS_KIND_WITH(save_checkpoint(dir / "x.safetensors", b, {}, &adamw_all_b, &opt_b.muon), Error,
                           "save_checkpoint", "in exactly one optimizer", "in both AdamW and Muon");
    CHECK_THROWS_KIND_WITH(save_checkpoint(dir / "x.safetensors", b, {}, &opt_b.adamw), Error, "save_checkpoint",
                           "expected parameter h.0.", "in exactly one optimizer", "none of those given");
    CHECK(!fs::exists(dir / "x.safetensors"));
    CHECK_THROWS_KIND_WITH(load_checkpoint(full, b, &opt_b.adamw), Error, "load_checkpoint", full,
                           "expected parameter h.0.", "in exactly one optimizer", "none of those given");
    {  // a file whose entries match an AdamW of every parameter and a Muon: each matrix in both
        std::map<std::string, std::string> meta, muon_meta;
        NamedTensors t = load_safetensors(adamw_only, &meta);
        NamedTensors muon_tensors = load_safetensors(full, &muon_meta);
        for (const auto& [name, x] : muon_tensors)
            if (name.rfind("optimizer.momentum_buffer.", 0) == 0) t.emplace_back(name, x);
        meta["optimizer.muon"] = muon_meta.at("optimizer.muon");
        save_safetensors(dir / "both.safetensors", t, meta);
        CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "both.safetensors", b, &adamw_all_b, nullptr, &opt_b.muon), Error,
                               "load_checkpoint", "in exactly one optimizer", "in both AdamW and Muon");
        CHECK(adamw_all_b.step_count() == 0);
    }
    // The metadata key of Muon's entry is the optimizers', as AdamW's is.
    for (bool with_muon : {true, false}) {
        CAPTURE(with_muon);
        CHECK_THROWS_KIND_WITH(with_muon ? save_checkpoint(dir / "x.safetensors", a, {{"optimizer.muon", "{}"}},
                                                           &opt_a.adamw, &opt_a.muon)
                                         : save_checkpoint(dir / "x.safetensors", a, {{"optimizer.muon", "{}"}}, &adamw_all),
                               Error, "the metadata key \"optimizer.muon\" is reserved");
    }
    CHECK(!fs::exists(dir / "x.safetensors"));
    // Malformed entries: not JSON, a field of the wrong type, AdamW's entry under Muon's key.
    std::map<std::string, std::string> meta;
    NamedTensors file = load_safetensors(full, &meta);
    for (const std::string& bad :
         {std::string("{not json"),
          std::string(R"({"type": "Muon", "step": 1, "momentum": 0.95, "nesterov": "yes", "ns_steps": 5, "groups": []})"),
          std::string(R"({"type": "Muon", "step": -1, "momentum": 0.95, "nesterov": true, "ns_steps": 5, "groups": []})"),
          meta.at("optimizer")}) {
        CAPTURE(bad);
        std::map<std::string, std::string> bad_meta = meta;
        bad_meta["optimizer.muon"] = bad;
        save_safetensors(dir / "bad.safetensors", file, bad_meta);
        CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "bad.safetensors", b, &opt_b.adamw, nullptr, &opt_b.muon),
                               FormatError, "malformed optimizer metadata", "expected Muon's entry");
    }
    // Nested 100,000 deep: refused as JSON too deep to read, in a message that does not quote it
    // (a crash risk when copied or quoted, and 200 KB of brackets in a message); 60 deep, quoted by
    // its first 80 characters.
    for (int depth : {100000, 60}) {
        CAPTURE(depth);
        std::map<std::string, std::string> bad_meta = meta;
        bad_meta["optimizer.muon"] = R"({"type": "Muon", "groups": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
        save_safetensors(dir / "deep.safetensors", file, bad_meta);
        check_throws_in_child<FormatError>(
            [&] { load_checkpoint(dir / "deep.safetensors", b, &opt_b.adamw, nullptr, &opt_b.muon); },
            {"malformed optimizer metadata \"optimizer.muon\"", "expected Muon's entry",
             depth > 64 ? "nests deeper than 64 levels"
                        : std::string(R"({"groups":)") + std::string(60, '[') + std::string(10, ']') + "..."});
        try {
            load_checkpoint(dir / "deep.safetensors", b, &opt_b.adamw, nullptr, &opt_b.muon);
        } catch (const FormatError& e) {
            CHECK(std::string(e.what()).size() < 400);
        }
    }
    // A file missing one momentum buffer: the tensor is named.
    NamedTensors pruned;
    for (const auto& [name, t] : file)
        if (name != "optimizer.momentum_buffer.h.0.mlp.c_fc.weight") pruned.emplace_back(name, t);
    REQUIRE(pruned.size() + 1 == file.size());
    save_safetensors(dir / "pruned.safetensors", pruned, meta);
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "pruned.safetensors", b, &opt_b.adamw, nullptr, &opt_b.muon),
                           FormatError, "missing optimizer state optimizer.momentum_buffer.h.0.mlp.c_fc.weight");
    CHECK(state() == before);
    CHECK(bytes_of(matrix) == matrix_before);
    CHECK(bytes_of(opt_b.muon.state(matrix).momentum_buffer) == buffer_before);
    CHECK(opt_b.adamw.step_count() == 1);
    CHECK(opt_b.muon.step_count() == 1);
    // And the good file still loads into it.
    load_checkpoint(full, b, &opt_b.adamw, nullptr, &opt_b.muon);
    CHECK(bytes_of(opt_b.muon.state(matrix).momentum_buffer) ==
          bytes_of(opt_a.muon.state(param_groups_for_muon(a).matrices.at(0)).momentum_buffer));
}

TEST_CASE("checkpoint: an AdamW checkpoint written before groups had lr_scale loads with lr_scale 1, and only so") {
    TempDir dir("no_lr_scale");
    manual_seed(5);
    GPT a(small_config());
    AdamW opt_a = make_optimizer(a);
    train_step(a, opt_a, 0);
    train_step(a, opt_a, 1);
    save_checkpoint(dir / "ck.safetensors", a, {}, &opt_a);
    // The file as an older normtape wrote it: its groups without "lr_scale".
    std::map<std::string, std::string> meta;
    NamedTensors file = load_safetensors(dir / "ck.safetensors", &meta);
    nlohmann::json entry = nlohmann::json::parse(meta.at("optimizer"));
    REQUIRE(entry["groups"].size() == 2);
    for (nlohmann::json& g : entry["groups"]) {
        REQUIRE(g.contains("lr_scale"));
        g.erase("lr_scale");
    }
    meta["optimizer"] = entry.dump();
    const std::string old = dir / "old.safetensors";
    save_safetensors(old, file, meta);

    manual_seed(6);
    GPT b(small_config());
    // Another lr_scale than 1 in one group: refused, naming both.
    const AdamW plain = make_optimizer(b);
    std::vector<ParamGroup> groups = plain.groups();
    groups[1].lr_scale = 2.0;
    AdamW scaled(groups, plain.options());
    const std::string before = bytes_of(b.wte->weight);
    CHECK_THROWS_KIND_WITH(load_checkpoint(old, b, &scaled), Error, "hyperparameters differ",
                           "weight decay 0.0, lr scale 2.0)", "the file has betas (0.9, 0.95), eps 1e-08, groups",
                           "weight decay 0.0, lr scale 1.0)");
    CHECK(bytes_of(b.wte->weight) == before);
    CHECK(scaled.step_count() == 0);
    // lr_scale 1 everywhere: it loads, to the state saved.
    AdamW opt_b = make_optimizer(b);
    load_checkpoint(old, b, &opt_b);
    CHECK(opt_b.step_count() == 2);
    CHECK(bytes_of(b.wte->weight) == bytes_of(a.wte->weight));
    CHECK(bytes_of(opt_b.state(b.wte->weight).v) == bytes_of(opt_a.state(a.wte->weight).v));
}

TEST_CASE("checkpoint: loading optimizer state refuses a file without it or of another optimizer, changing nothing") {
    TempDir dir("refuse");
    manual_seed(3);
    GPT a(small_config());
    AdamW opt_a = make_optimizer(a);
    train_step(a, opt_a, 0);
    save_checkpoint(dir / "model_only.safetensors", a);
    save_checkpoint(dir / "full.safetensors", a, {}, &opt_a);

    manual_seed(4);
    GPT b(small_config());
    AdamW opt_b = make_optimizer(b);
    std::string before = bytes_of(b.wte->weight);
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "model_only.safetensors", b, &opt_b), FormatError, dir / "model_only.safetensors", "holds no optimizer state");
    AdamW other = make_optimizer(b, /*beta2=*/0.999);
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "full.safetensors", b, &other), Error, "hyperparameters differ", "expected betas (0.9, 0.999)", "the file has betas (0.9, 0.95)");
    // A file missing one moment: the tensor is named.
    NamedTensors file = load_safetensors(dir / "full.safetensors");
    NamedTensors pruned;
    std::map<std::string, std::string> meta;
    load_safetensors(dir / "full.safetensors", &meta);
    for (auto& [name, t] : file)
        if (name != "optimizer.exp_avg_sq.h.0.mlp.c_fc.weight") pruned.emplace_back(name, t);
    save_safetensors(dir / "pruned.safetensors", pruned, meta);
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "pruned.safetensors", b, &opt_b), FormatError, "missing optimizer state optimizer.exp_avg_sq.h.0.mlp.c_fc.weight");
    // Optimizer metadata of the wrong JSON types (a "type" that is a number): FormatError, not a
    // JSON library exception.
    std::map<std::string, std::string> bad_meta = meta;
    bad_meta["optimizer"] = R"({"type": 7, "step": 1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "groups": []})";
    save_safetensors(dir / "bad_type.safetensors", file, bad_meta);
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "bad_type.safetensors", b, &opt_b), FormatError,
                           "malformed optimizer metadata");
    // A checkpoint of another width: the parameter, its expected and its found shape.
    GPTConfig wide = small_config();
    wide.n_embd = 16;
    save_checkpoint(dir / "wide.safetensors", GPT(wide));
    CHECK_THROWS_KIND_WITH(load_checkpoint(dir / "wide.safetensors", b), ShapeError, "parameter wte.weight expected [256, 8] f32, got [256, 16] f32");
    CHECK(bytes_of(b.wte->weight) == before);
    CHECK(opt_b.step_count() == 0);
    CHECK(bytes_of(opt_b.state(b.wte->weight).m) == bytes_of(zeros({256, 8})));
}

TEST_CASE("checkpoint: loading refuses a NaN or an Inf in a parameter or in the optimizer state, changing nothing") {
    struct Case {
        std::string name;
        DType dtype;
        std::string tensor;
        int64_t index;
        double value;
        std::string says;
    };
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    const std::string says = " holds a non-finite value ";
    for (const Case& c :
         {Case{"a NaN in a parameter", DType::F32, "h.0.ln_1.weight", 3, nan,
               "parameter h.0.ln_1.weight" + says + "(nan) at flat index 3 of [8] f32"},
          Case{"an Inf in a moment", DType::F32, "optimizer.exp_avg_sq.wte.weight", 5, inf,
               "optimizer state optimizer.exp_avg_sq.wte.weight" + says + "(inf) at flat index 5 of [256, 8] f32"},
          Case{"a NaN in a bf16 parameter", DType::BF16, "lm_head.weight", 17, nan,
               "parameter lm_head.weight" + says + "(nan) at flat index 17 of [256, 8] bf16"},
          Case{"a -Inf in a master copy", DType::BF16, "optimizer.master.h.0.attn.c_proj.weight", 0, -inf,
               "optimizer state optimizer.master.h.0.attn.c_proj.weight" + says + "(-inf) at flat index 0 of [8, 8] f32"}}) {
        CAPTURE(c.name);
        TempDir dir("non_finite");
        manual_seed(8);
        GPT a(small_config(c.dtype));
        AdamW opt_a = make_optimizer(a);
        train_step(a, opt_a, 0);
        save_checkpoint(dir / "ck.safetensors", a, {}, &opt_a);
        // The file with one value replaced (and saved again: its checksums hold).
        std::map<std::string, std::string> meta;
        NamedTensors file = load_safetensors(dir / "ck.safetensors", &meta);
        bool found = false;
        for (auto& [name, t] : file) {
            if (name != c.tensor) continue;
            found = true;
            Tensor f64 = t.to(DType::F64);
            f64.data_ptr<double>()[c.index] = c.value;
            t = f64.to(t.dtype());
        }
        REQUIRE(found);
        std::string bad = dir / "diverged.safetensors";
        save_safetensors(bad, file, meta);

        manual_seed(9);
        GPT b(small_config(c.dtype));
        AdamW opt_b = make_optimizer(b);
        train_step(b, opt_b, 1);
        // Every byte of b's parameters and optimizer state.
        auto state = [&] {
            std::string s;
            for (const auto& [name, p] : b.named_parameters()) {
                const AdamW::ParamState& st = opt_b.state(p);
                s += bytes_of(p) + bytes_of(st.m) + bytes_of(st.v) + (st.master.defined() ? bytes_of(st.master) : "");
            }
            return s;
        };
        const std::string before = state();
        std::map<std::string, std::string> bad_meta;
        NamedTensors bad_file = load_safetensors(bad, &bad_meta);
        CHECK_THROWS_KIND_WITH(load_checkpoint(bad, b, &opt_b), FormatError, "load_checkpoint: " + bad + ": " + c.says,
                               "(a checkpoint of a run that diverged?)");
        CHECK_THROWS_KIND_WITH(load_checkpoint(bad, bad_file, bad_meta, b, &opt_b), FormatError, c.says);
        CHECK(state() == before);
        CHECK(opt_b.step_count() == 1);
        if (c.tensor.rfind("optimizer.", 0) == 0) {
            load_checkpoint(bad, b);  // without the optimizer, only the parameters are read: all finite
        } else {
            CHECK_THROWS_KIND_WITH(load_checkpoint(bad, b), FormatError, c.says);
            CHECK(state() == before);
        }
    }
}

TEST_CASE("checkpoint: loading refuses a negative second moment (exp_avg_sq), changing nothing, and loads a negative exp_avg") {
    for (DType dtype : {DType::F32, DType::BF16}) {  // a bf16 parameter's moments are f32
        CAPTURE(dtype_name(dtype));
        TempDir dir("negative_v");
        manual_seed(8);
        GPT a(small_config(dtype));
        AdamW opt_a = make_optimizer(a);
        train_step(a, opt_a, 0);
        save_checkpoint(dir / "ck.safetensors", a, {}, &opt_a);
        // The file with one value of `tensor` set to -0.25 (saved again: its checksums hold).
        auto forged = [&](const std::string& tensor) {
            std::map<std::string, std::string> meta;
            NamedTensors file = load_safetensors(dir / "ck.safetensors", &meta);
            for (auto& [name, t] : file)
                if (name == tensor) t.data_ptr<float>()[5] = -0.25f;
            const std::string path = dir / "forged.safetensors";
            save_safetensors(path, file, meta);
            return path;
        };
        manual_seed(9);
        GPT b(small_config(dtype));
        AdamW opt_b = make_optimizer(b);
        const std::string before = bytes_of(b.wte->weight);
        const std::string bad = forged("optimizer.exp_avg_sq.h.0.mlp.c_fc.weight");
        CHECK_THROWS_KIND_WITH(load_checkpoint(bad, b, &opt_b), FormatError,
                               "load_checkpoint: " + bad +
                                   ": optimizer state optimizer.exp_avg_sq.h.0.mlp.c_fc.weight holds a negative value "
                                   "(-0.25) at flat index 5 of [32, 8] f32: expected AdamW's second moment, a mean of "
                                   "squares, >= 0");
        CHECK(bytes_of(b.wte->weight) == before);
        CHECK(opt_b.step_count() == 0);
        CHECK_NOTHROW(load_checkpoint(forged("optimizer.exp_avg.h.0.mlp.c_fc.weight"), b, &opt_b));
        CHECK(opt_b.step_count() == 1);
    }
}

TEST_CASE("checkpoint: train_gpt stopped and resumed gives the losses of the run that never stopped, bit for bit") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("resume");
    {
        std::string text;
        for (int i = 0; i < 60; ++i) text += "It is a truth universally acknowledged, line " + std::to_string(i) + ".\n";
        write_bytes(dir / "data.txt", text);
    }
    struct Case {
        std::string name, flags;
    };
    const std::string model = " --steps 7 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --log-every 1";
    for (const Case& c : {Case{"text, layer norm, input policy, f32", "--data " + (dir / "data.txt") + " --policy input"},
                          Case{"random tokens, rms norm, output policy, f32",
                               "--data random --vocab 64 --norm rms --policy output --seed 7"},
                          Case{"text, layer norm, output policy, bf16 (master copies)",
                               "--data " + (dir / "data.txt") + " --policy output --dtype bf16"},
                          // The dropout stream is restored, and the schedule's flags come from the checkpoint.
                          Case{"text, layer norm, normalized policy, f32, dropout and nanoGPT's schedule",
                               "--data " + (dir / "data.txt") +
                                   " --policy normalized --dropout 0.2 --warmup 2 --min-lr 1e-4 --beta2 0.99"},
                          // Muon's momentum buffers and AdamW's moments, each optimizer's step count;
                          // --optimizer comes from the checkpoint.
                          Case{"random tokens, rms norm, input policy, f32, Muon",
                               "--data random --vocab 64 --norm rms --policy input --seed 3 --optimizer muon"},
                          Case{"text, layer norm, output policy, bf16 (both optimizers' masters), Muon and a schedule",
                               "--data " + (dir / "data.txt") +
                                   " --policy output --dtype bf16 --optimizer muon --warmup 2 --min-lr 1e-4"}}) {
        CAPTURE(c.name);
        std::string flags = c.flags + model + " --device cpu";
        RunResult straight = run_train_gpt(dir, flags + " --json " + (dir / "straight.json"));
        CAPTURE(straight.err);
        REQUIRE(straight.code == 0);
        std::vector<double> all = losses_of(dir / "straight.json");
        REQUIRE(all.size() == 7);

        // Stop at 3 (saving every 2 steps too), resume to 5, resume again to the end.
        RunResult first = run_train_gpt(dir, flags + " --stop-at 3 --save-every 2 --save " + (dir / "ck.safetensors") +
                                                 " --json " + (dir / "first.json"));
        CAPTURE(first.err);
        REQUIRE(first.code == 0);
        CHECK(first.out.find("ck.safetensors (step 2)") != std::string::npos);
        CHECK(first.out.find("ck.safetensors (step 3)") != std::string::npos);
        RunResult second = run_train_gpt(dir, "--device cpu --resume " + (dir / "ck.safetensors") + " --stop-at 5 --save " +
                                                  (dir / "ck.safetensors") + " --json " + (dir / "second.json"));
        CAPTURE(second.err);
        REQUIRE(second.code == 0);
        CHECK(second.out.find("resumed from") != std::string::npos);
        RunResult third =
            run_train_gpt(dir, "--device cpu --resume " + (dir / "ck.safetensors") + " --json " + (dir / "third.json"));
        CAPTURE(third.err);
        REQUIRE(third.code == 0);

        std::vector<double> resumed;
        int64_t first_step[3];
        for (int k = 0; k < 3; ++k) {
            std::vector<double> part = losses_of(dir / (k == 0 ? "first.json" : k == 1 ? "second.json" : "third.json"),
                                                 &first_step[k]);
            CHECK(first_step[k] == static_cast<int64_t>(resumed.size()));
            resumed.insert(resumed.end(), part.begin(), part.end());
        }
        CHECK(first_step[1] == 3);
        CHECK(first_step[2] == 5);
        REQUIRE(resumed.size() == all.size());
        for (size_t i = 0; i < all.size(); ++i) {
            CAPTURE(i);
            CAPTURE(all[i]);
            CAPTURE(resumed[i]);
            CHECK(std::bit_cast<uint64_t>(all[i]) == std::bit_cast<uint64_t>(resumed[i]));
        }
    }
}

TEST_CASE("checkpoint: train_gpt with --micro-batch stopped and resumed gives the losses of the run that never stopped") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("resume_micro");
    {
        std::string text;
        for (int i = 0; i < 60; ++i) text += "It is a truth universally acknowledged, line " + std::to_string(i) + ".\n";
        write_bytes(dir / "data.txt", text);
    }
    // Dropout: the stream goes on across the micro-batches of a step and across the resume.
    const std::string flags = "--data " + (dir / "data.txt") +
                              " --policy output --dropout 0.1 --steps 5 --batch 4 --seq 8 --layers 1 --heads 2 "
                              "--embd 16 --device cpu --micro-batch 2 --chart " + (dir / "c.svg");
    RunResult straight = run_train_gpt(dir, flags + " --json " + (dir / "straight.json"));
    CAPTURE(straight.err);
    REQUIRE(straight.code == 0);
    const std::vector<double> all = losses_of(dir / "straight.json");
    REQUIRE(all.size() == 5);
    const std::string ck = dir / "ck.safetensors";
    RunResult first = run_train_gpt(dir, flags + " --stop-at 2 --save " + ck + " --json " + (dir / "first.json"));
    CAPTURE(first.err);
    REQUIRE(first.code == 0);
    // The micro-batch is not part of the run's config: the resumed run names it again.
    std::map<std::string, std::string> metadata;
    load_safetensors(ck, &metadata);
    const nlohmann::json config = nlohmann::json::parse(metadata.at("train_gpt.config"));
    CHECK(config.contains("batch"));
    CHECK_FALSE(config.contains("micro-batch"));
    RunResult second = run_train_gpt(dir, "--device cpu --resume " + ck + " --micro-batch 2 --json " +
                                              (dir / "second.json") + " --chart " + (dir / "c.svg"));
    CAPTURE(second.err);
    REQUIRE(second.code == 0);
    std::vector<double> resumed = losses_of(dir / "first.json");
    int64_t first_step = 0;
    const std::vector<double> rest = losses_of(dir / "second.json", &first_step);
    CHECK(first_step == 2);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    REQUIRE(resumed.size() == all.size());
    for (size_t i = 0; i < all.size(); ++i) {
        CAPTURE(i);
        CHECK(std::bit_cast<uint64_t>(all[i]) == std::bit_cast<uint64_t>(resumed[i]));
    }
    // A memory setting: the checkpoint also resumes with the whole batch (other dropout masks).
    RunResult whole = run_train_gpt(dir, "--device cpu --resume " + ck + " --json " + (dir / "whole.json") +
                                             " --chart " + (dir / "c.svg"));
    CAPTURE(whole.err);
    CHECK(whole.code == 0);
    CHECK(losses_of(dir / "whole.json").size() == 3);
}

TEST_CASE("checkpoint: train_gpt refuses to resume another run, naming what differs") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mismatch");
    write_bytes(dir / "a.txt", std::string(400, 'a') + "the data of run a\n");
    write_bytes(dir / "b.txt", std::string(400, 'b') + "the data of run b\n");
    std::string ck = dir / "ck.safetensors";
    RunResult r = run_train_gpt(dir, "--data " + (dir / "a.txt") +
                                         " --steps 4 --stop-at 2 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 "
                                         "--policy output --device cpu --save " + ck);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    manual_seed(0);
    save_checkpoint(dir / "model_only.safetensors", GPT(small_config()));
    write_bytes(dir / "garbage.safetensors", st_file("{\"w\": {\"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [0, 2]}}", "ab"));
    struct Case {
        std::string args;
        std::vector<std::string> says;
    };
    for (const Case& c :
         {Case{"--resume " + ck + " --layers 2", {"--layers 1", "asks for 2"}},
          Case{"--resume " + ck + " --embd 32", {"--embd 16", "asks for 32"}},
          Case{"--resume " + ck + " --lr 0.001", {"--lr 0.003", "asks for 0.001"}},
          Case{"--resume " + ck + " --steps 8", {"--steps 4", "asks for 8"}},
          Case{"--resume " + ck + " --norm rms", {"--norm \"layer\"", "asks for \"rms\""}},
          Case{"--resume " + ck + " --policy input", {"--policy \"output\"", "asks for \"input\""}},
          Case{"--resume " + ck + " --policy both", {"--policy input, output or normalized", "output"}},
          Case{"--resume " + ck + " --policy all", {"--policy input, output or normalized", "not all"}},
          Case{"--resume " + ck + " --data " + (dir / "b.txt"), {"b.txt", "is not the checkpoint's run's"}},
          Case{"--resume " + ck + " --stop-at 2", {"at step 2", "nothing is left"}},
          Case{"--resume " + ck + " --preset gpt2-medium-ish", {"--preset"}},
          Case{"--resume " + (dir / "model_only.safetensors"), {"model_only.safetensors", "not a train_gpt checkpoint"}},
          Case{"--resume " + (dir / "garbage.safetensors"), {"garbage.safetensors", "unsupported dtype \"F16\""}},
          Case{"--resume " + (dir / "missing.safetensors"), {"missing.safetensors", "cannot open"}},
          Case{"--stop-at 2 --save " + ck, {"--policy input, output or normalized"}},
          Case{"--save-every 2 --policy input", {"--save-every needs --save"}},
          Case{"--stop-at 9 --steps 4 --policy input", {"--stop-at 9 is past --steps 4"}}}) {
        CAPTURE(c.args);
        RunResult bad = run_train_gpt(dir, c.args);
        CAPTURE(bad.err);
        CHECK(bad.code == 2);
        CHECK(lines(bad.err) == 1);
        for (const std::string& s : c.says) CHECK(bad.err.find(s) != std::string::npos);
    }
    // The checkpoint still resumes after all that.
    RunResult ok = run_train_gpt(dir, "--resume " + ck);
    CAPTURE(ok.err);
    CHECK(ok.code == 0);
}

TEST_CASE("checkpoint: a failed save leaves the previous file intact and no temporary file behind") {
    TempDir dir("atomic");
    std::string path = dir / "ck.safetensors";
    manual_seed(5);
    GPT model(small_config());
    save_checkpoint(path, model);
    const std::string good = slurp(path);
    GPTConfig wide = small_config();
    wide.n_embd = 64;
    GPT bigger(wide);

    SUBCASE("the disk fills up mid-write (a file-size limit, which binds root too)") {
        struct rlimit old_limit;
        REQUIRE(getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
        struct rlimit small = old_limit;
        small.rlim_cur = 4096;
        REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
        struct Restore {  // the limit and the handler come back even if the check throws
            rlimit limit;
            void (*handler)(int);
            ~Restore() {
                setrlimit(RLIMIT_FSIZE, &limit);
                signal(SIGXFSZ, handler);
            }
        } restore{old_limit, old_handler};
        check_throws<IOError>([&] { save_checkpoint(path, bigger); }, {path});
    }
    SUBCASE("the target is a directory: the rename fails") {
        std::string d = dir / "a_directory";
        fs::create_directories(fs::path(d) / "inside");
        CHECK_THROWS_KIND_WITH(save_checkpoint(d, model), IOError, d, "renaming");
        CHECK(fs::is_directory(fs::path(d) / "inside"));
        fs::remove_all(d);
    }
    SUBCASE("the directory does not exist") {
        std::string missing = dir / "no_such_dir/ck.safetensors";
        CHECK_THROWS_KIND_WITH(save_checkpoint(missing, model), IOError, missing);
        CHECK(!fs::exists(dir / "no_such_dir"));
    }
    SUBCASE("the directory is read-only (as a user other than root)") {
        if (geteuid() == 0) {
            MESSAGE("skipped: root writes into read-only directories");
        } else {
            fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
            CHECK_THROWS_KIND_WITH(save_checkpoint(path, bigger), IOError, path);
            fs::permissions(dir.path, fs::perms::owner_all, fs::perm_options::replace);
        }
    }
    SUBCASE("a tensor cannot be written (undefined): nothing is touched") {
        CHECK_THROWS_KIND_WITH(save_safetensors(path, {{"a", ones({2})}, {"b", Tensor()}}), Error, "undefined");
    }
    CHECK(slurp(path) == good);
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
    GPT reloaded(small_config());
    load_checkpoint(path, reloaded);
    CHECK(bytes_of(reloaded.wte->weight) == bytes_of(model.wte->weight));
    // And a save that works replaces the file.
    save_checkpoint(path, bigger);
    CHECK(slurp(path) != good);
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
}

TEST_CASE("checkpoint: loading leaks nothing, whether it succeeds or fails") {
    TempDir dir("leaks");
    manual_seed(6);
    GPT model(small_config());
    AdamW optimizer = make_optimizer(model);
    train_step(model, optimizer, 0);
    save_checkpoint(dir / "ck.safetensors", model, {}, &optimizer);
    GPTConfig wide = small_config();
    wide.n_embd = 16;
    save_checkpoint(dir / "wide.safetensors", GPT(wide));
    write_bytes(dir / "bad.safetensors", st_file("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", "1234"));

    const int64_t start = memory_stats(Device::CPU).allocated_bytes;
    {
        NamedTensors t = load_safetensors(dir / "ck.safetensors");
        CHECK(memory_stats(Device::CPU).allocated_bytes > start);
    }
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    load_checkpoint(dir / "ck.safetensors", model, &optimizer);  // copies into existing tensors
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    CHECK_THROWS_AS(load_checkpoint(dir / "wide.safetensors", model), ShapeError);  // after every tensor was read
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    CHECK_THROWS_AS(load_safetensors(dir / "bad.safetensors"), FormatError);
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
}

}  // TEST_SUITE
