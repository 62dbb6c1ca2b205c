// tests/test_checkpoint_load.cpp: what loading a checkpoint (nn/formats/checkpoint.h) refuses,
// changing nothing: a file without optimizer state or of another optimizer; Muon's state missing,
// malformed, of other hyperparameters or shape, or a parameter in neither optimizer or in both; a
// NaN or an Inf in a parameter or in the optimizer state; a negative second moment. And what it
// loads: an AdamW file written before groups had lr_scale, a negative exp_avg. Saving, round trips
// and resuming train_gpt: tests/test_checkpoint.cpp.
#include <filesystem>
#include <limits>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;

TEST_SUITE("checkpoint") {

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

}  // TEST_SUITE
