// tests/test_muon_api.cpp: Muon (nn/optim/muon.h) as a caller meets it: every error path of
// nn/optim/muon.h (options, group values, parameters, steps, newton_schulz's inputs),
// param_groups_for_muon on each GPT preset, and a cross-check with PyTorch (tests/muon_reference.py:
// KellerJordan/Muon's algorithm with torch ops, and torch.optim.Muon where the interpreter's torch
// has it). The CUDA case skips where no GPU is visible; the PyTorch case where torch cannot be
// imported. Newton-Schulz and the step against references in f64: tests/test_muon.cpp.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "optim_test_util.h"

namespace fs = std::filesystem;
using namespace normtape;
using namespace normtape::testing;

namespace {

// fn() must throw exactly Kind with every one of `words` in its message, and leave the cpu
// allocator's bytes where they were (tests/test_errors.cpp's rule).
template <class Kind, class F>
void check_error(F&& fn, const std::vector<std::string>& words,
                 std::source_location where = std::source_location::current()) {
    const int64_t before = memory_stats(Device::CPU).allocated_bytes;
    check_throws<Kind>(fn, words, KindMatch::Exactly, where);
    CHECK(memory_stats(Device::CPU).allocated_bytes == before);
}

// ---------------------------------------------------------------- PyTorch

std::string number(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
}

}  // namespace

TEST_SUITE("muon") {

// ---------------------------------------------------------------- errors

TEST_CASE("muon: every option and group value out of range is refused, naming Muon, the value and the range") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    Tensor p = ones({3, 2}).requires_grad_(true);
    for (double lr : {-1.0, inf, nan}) {
        MuonOptions o;
        o.lr = lr;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected lr >= 0 and finite, got lr"});
    }
    for (double momentum : {-0.1, 1.0, nan}) {
        MuonOptions o;
        o.momentum = momentum;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected momentum in [0, 1), got momentum"});
    }
    for (int64_t steps : {int64_t(0), int64_t(101), int64_t(-3)}) {
        MuonOptions o;
        o.ns_steps = steps;
        check_error<Error>([&] { Muon({p}, o); },
                           {"Muon: expected ns_steps in [1, 100], got ns_steps " + std::to_string(steps)});
    }
    for (double wd : {-0.1, inf, nan}) {
        MuonOptions o;
        o.weight_decay = wd;
        check_error<Error>([&] { Muon({p}, o); }, {"Muon: expected weight_decay >= 0 and finite, got weight_decay"});
        check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{p}, 0.0}, {{}, wd}}, MuonOptions()); },
                           {"Muon: expected group 1's weight_decay >= 0 and finite, got weight_decay"});
    }
    for (double scale : {-1.0, inf, nan})
        check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{p}, 0.0, scale}}, MuonOptions()); },
                           {"Muon: expected group 0's lr_scale >= 0 and finite, got lr_scale"});
    // The edges allowed: lr 0, momentum 0, ns_steps 1 and 100, lr_scale 0.
    MuonOptions edge;
    edge.lr = 0.0;
    edge.momentum = 0.0;
    edge.ns_steps = 1;
    CHECK_NOTHROW(Muon(std::vector<ParamGroup>{{{p}, 0.0, 0.0}}, edge));
    edge.ns_steps = 100;
    CHECK_NOTHROW(Muon({p}, edge));
    // set_lr by the constructor's rule; the lr is left as it was.
    Muon opt({p}, MuonOptions());
    for (double lr : {-1.0, inf, nan}) check_error<Error>([&] { opt.set_lr(lr); }, {"Muon::set_lr: expected lr >= 0 and finite, got lr"});
    CHECK(opt.lr() == MuonOptions().lr);
    check_error<Error>([&] { opt.set_step_count(-1); }, {"Muon::set_step_count", "t >= 0", "got -1"});
    CHECK(opt.step_count() == 0);
}

TEST_CASE("muon: parameters that are not matrices, leaves requiring grad, or that sit in two groups are refused") {
    Tensor p = ones({3, 2}).requires_grad_(true);
    check_error<Error>([&] { Muon({ones({3}).requires_grad_(true)}, MuonOptions()); },
                       {"Muon", "at least 2 dimensions", "vectors and scalars belong to AdamW",
                        "parameter 0 of group 0 of shape [3]"});
    check_error<Error>([&] { Muon({p, full({}, 1.0).requires_grad_(true)}, MuonOptions()); },
                       {"Muon", "at least 2 dimensions", "parameter 1 of group 0 of shape []"});
    check_error<Error>([&] { Muon({mul(p, p)}, MuonOptions()); }, {"Muon", "leaf", "got a non-leaf"});
    check_error<Error>([&] { Muon({ones({3, 2})}, MuonOptions()); }, {"Muon", "require grad", "got one that does not"});
    check_error<Error>([&] { Muon({Tensor()}, MuonOptions()); }, {"Muon", "got an undefined tensor"});
    Tensor transposed = ones({2, 3}).transpose(0, 1).requires_grad_(true);
    check_error<Error>([&] { Muon({transposed}, MuonOptions()); }, {"Muon", "contiguous", "got a non-contiguous one"});
    Tensor q = ones({2, 2}).requires_grad_(true);
    check_error<Error>([&] { Muon(std::vector<ParamGroup>{{{q, p}, 0.1}, {{p}, 0.0}}, MuonOptions()); },
                       {"Muon", "parameter 0 of group 1", "parameter 1 of group 0", "more than one parameter group"});
    // Listed twice in one group: kept once, at its first place.
    Muon twice({p, q, p}, MuonOptions());
    REQUIRE(twice.groups()[0].params.size() == 2);
    CHECK(&twice.groups()[0].params[0].impl() == &p.impl());
    // state() of a tensor that is not a parameter (an equal copy is not one either).
    check_error<Error>([&] { twice.state(p.detach().clone()); }, {"Muon::state", "[3, 2]", "not a parameter of this optimizer"});
    check_error<Error>([&] { twice.state(Tensor()); }, {"Muon::state", "undefined"});
}

TEST_CASE("muon: a step with a changed parameter, a gradient of another shape or a bad norm throws and changes nothing") {
    manual_seed(112);
    Linear first(3, 4, false), second(4, 5, false);  // weights [4, 3] and [5, 4]
    MuonOptions o;
    o.weight_decay = 0.1;
    Muon opt(std::vector<ParamGroup>{{{first.weight}, 0.1}, {{second.weight}, 0.0}}, o);
    set_grad(first.weight, randn({4, 3}));
    const std::vector<double> before = host_values(first.weight);
    const uint64_t version = first.weight.storage()->version();
    auto unchanged = [&] {
        CHECK(host_values(first.weight) == before);
        CHECK(first.weight.storage()->version() == version);
        CHECK(same_bits(opt.state(first.weight).momentum_buffer, zeros({4, 3})));
        CHECK(opt.step_count() == 0);
    };
    // A gradient of another shape (set directly: backward cannot make one).
    second.weight.impl().grad = randn({4, 5}).impl_ptr();
    check_error<ShapeError>([&] { opt.step(); },
                            {"Muon: parameter 0 of group 1", "gradient of the parameter's shape [5, 4]", "got [4, 5]"});
    unchanged();
    // A gradient of another dtype: the step read it with the parameter's element type.
    second.weight.impl().grad = randn({5, 4}, opts(DType::F64)).impl_ptr();
    check_error<DTypeError>([&] { opt.step(); },
                            {"Muon: parameter 0 of group 1", "gradient of the parameter's dtype f32, got f64"});
    unchanged();
    // Bad norms: undefined, two elements, integer.
    second.weight.zero_grad();
    check_error<Error>([&] { opt.step_if_finite(Tensor()); }, {"Muon::step_if_finite", "expected a gradient norm", "undefined"});
    check_error<ShapeError>([&] { opt.step_if_finite(zeros({2})); }, {"Muon::step_if_finite", "one-element norm", "[2]"});
    check_error<DTypeError>([&] { opt.step_if_finite(from_vector<int64_t>({1})); },
                            {"Muon::step_if_finite", "floating norm", "got i64"});
    unchanged();
    // A parameter converted after the optimizer was built: its f32 state no longer fits.
    second.to(Device::CPU, DType::F64);
    set_grad(second.weight, randn({5, 4}, opts(DType::F64)));
    check_error<DTypeError>([&] { opt.step(); }, {"Muon", "dtype it had when the optimizer was built", "(state f32)",
                                                  "got f64", "after Module::to"});
    unchanged();
}

TEST_CASE("muon: an empty matrix is left as it is, and the others step") {
    // [0, N] divided by zero in its matrix shape (SIGFPE): run in a child process.
    for (const Shape& shape : {Shape{0, 4}, Shape{4, 0}, Shape{0, 2, 3}}) {
        INFO(shape_str(shape));
        const ChildOutcome o = outcome_in_child([&] {
            Tensor empty_p = zeros(shape).requires_grad_(true), w = ones({3, 2}).requires_grad_(true);
            Muon opt({empty_p, w}, MuonOptions());
            empty_p.impl().grad = zeros(shape).impl_ptr();
            w.impl().grad = ones({3, 2}).impl_ptr();
            opt.step();
            if (empty_p.numel() != 0 || opt.step_count() != 1) throw Error("the empty parameter changed");
            if (w.to_vector<float>() == std::vector<float>(6, 1.0f)) throw Error("the matrix beside it did not step");
        });
        CAPTURE(o.message);
        CHECK(o.how == ChildOutcome::Returned);
    }
}

TEST_CASE("muon: a parameter moved to another device after the optimizer was built is refused") {
    REQUIRE_CUDA_OR_SKIP();
    Linear layer(3, 4, false);
    Muon opt({layer.weight}, MuonOptions());
    layer.to(Device::CUDA, DType::F32);
    set_grad(layer.weight, randn({4, 3}).to(Device::CUDA));
    check_throws<DeviceError>([&] { opt.step(); }, {"Muon", "expected the parameter on cpu", "moved after the optimizer was built"},
                              KindMatch::Exactly);
    CHECK(opt.step_count() == 0);
    // And a norm elsewhere than the parameters.
    Linear gpu_layer(3, 4, false);
    gpu_layer.to(Device::CUDA, DType::F32);
    Muon gpu_opt({gpu_layer.weight}, MuonOptions());
    set_grad(gpu_layer.weight, randn({4, 3}).to(Device::CUDA));
    check_throws<DeviceError>([&] { gpu_opt.step_if_finite(full({}, 1.0)); }, {"Muon::step_if_finite", "expected the norm on"},
                              KindMatch::Exactly);
    CHECK(gpu_opt.step_count() == 0);
}

TEST_CASE("muon: newton_schulz refuses inputs that are not matrices, not floating, or a step count out of range") {
    check_error<Error>([&] { newton_schulz(Tensor()); }, {"newton_schulz", "undefined"});
    check_error<ShapeError>([&] { newton_schulz(ones({3})); }, {"newton_schulz", "[rows, cols] or [n, rows, cols]", "got shape [3]"});
    check_error<ShapeError>([&] { newton_schulz(ones({2, 2, 2, 2})); }, {"newton_schulz", "got shape [2, 2, 2, 2]"});
    check_error<ShapeError>([&] { newton_schulz(ones({0, 3})); }, {"newton_schulz", "non-empty", "got shape [0, 3]"});
    check_error<ShapeError>([&] { newton_schulz(ones({2, 3, 0})); }, {"newton_schulz", "non-empty", "got shape [2, 3, 0]"});
    check_error<DTypeError>([&] { newton_schulz(from_vector<int64_t>({1, 2, 3, 4}, {2, 2})); },
                            {"newton_schulz", "floating tensor", "got i64"});
    for (int64_t steps : {int64_t(0), int64_t(101)})
        check_error<Error>([&] { newton_schulz(ones({2, 3}), steps); },
                           {"newton_schulz", "steps in [1, 100]", "got " + std::to_string(steps)});
}

// ---------------------------------------------------------------- param_groups_for_muon

TEST_CASE("muon: param_groups_for_muon splits each GPT preset's parameters as nanochat does") {
    // Every parameter in exactly one list, each list in named_parameters() order; matrices: the
    // parameters of 2 or more dimensions named "h.*"; embeddings: wte (and wpe with learned
    // positions); head: lm_head.weight unless tied; vectors: the rest, all 1-D. Muon takes the
    // matrices and AdamW the rest, one step each.
    struct Preset {
        const char* arch;
        bool tie;
    };
    for (const Preset& preset : {Preset{"gpt2", false}, Preset{"gpt2", true}, Preset{"nanochat", false},
                                 Preset{"llama", false}}) {
        CAPTURE(preset.arch);
        CAPTURE(preset.tie);
        GPTConfig config = gpt_config(preset.arch);
        config.n_layer = 2;
        config.n_embd = 32;
        config.n_head = 4;
        config.block_size = 16;
        config.tie_embeddings = preset.tie;
        config.zero_init_proj = false;  // nanochat's zero c_proj would leave the blocks' other matrices without gradient
        manual_seed(113);
        GPT model(config);
        const NamedTensors named = model.named_parameters();
        const MuonParamSplit split = param_groups_for_muon(model);
        std::vector<std::string> matrices, embeddings, head, vectors;
        for (const auto& [name, p] : named) {
            const bool block = name.rfind("h.", 0) == 0;
            if (block && p.dim() >= 2) matrices.push_back(name);
            else if (name == "wte.weight" || name == "wpe.weight") embeddings.push_back(name);
            else if (name == "lm_head.weight") head.push_back(name);
            else vectors.push_back(name);
        }
        // The names of a list, by identity with the named parameters; "?" for a stranger.
        auto names_of = [&](const std::vector<Tensor>& list) {
            std::vector<std::string> names;
            for (const Tensor& t : list) {
                std::string found = "?";
                for (const auto& [name, p] : named)
                    if (&p.impl() == &t.impl()) found = name;
                names.push_back(found);
            }
            return names;
        };
        CHECK(names_of(split.matrices) == matrices);
        CHECK(names_of(split.embeddings) == embeddings);
        CHECK(names_of(split.head) == head);
        CHECK(names_of(split.vectors) == vectors);
        CHECK(split.matrices.size() + split.embeddings.size() + split.head.size() + split.vectors.size() == named.size());
        // What each preset has: 2-D blocks, wpe only with learned positions, a separate head only untied.
        CHECK(matrices.size() >= 4 * static_cast<size_t>(config.n_layer));
        CHECK(embeddings.size() == (config.pos_embedding == PosEmbedding::Learned ? 2u : 1u));
        CHECK(head.size() == (preset.tie ? 0u : 1u));
        for (const Tensor& v : split.vectors) CHECK(v.dim() == 1);
        // The two optimizers take their lists.
        Muon muon(split.matrices, MuonOptions());
        std::vector<ParamGroup> adamw_groups = {{split.embeddings, 0.0, 5.0}, {split.vectors, 0.0}};
        if (!split.head.empty()) adamw_groups.push_back({split.head, 0.0, 0.2});
        AdamW adamw(adamw_groups, AdamWOptions());
        TokenBatch batch = token_batch(config, 2, 8);
        model.loss(batch.idx, batch.targets).backward();
        std::vector<Tensor> before;
        for (const auto& [name, p] : named) before.push_back(p.detach().clone());
        muon.step();
        adamw.step();
        for (size_t i = 0; i < named.size(); ++i) {
            CAPTURE(named[i].first);
            CHECK_FALSE(same_bits(named[i].second, before[i]));  // every parameter moved
        }
    }
}

// ---------------------------------------------------------------- PyTorch

TEST_CASE("muon: three steps match KellerJordan/Muon's algorithm in PyTorch, and torch.optim.Muon where torch has it") {
    if (!torch_available()) SKIP_TEST(python() << " cannot import torch (Debian: apt-get install python3-torch)");
    // tests/muon_reference.py runs the reference algorithm with torch ops on the same parameters
    // and gradients: f32 on the cpu (Newton-Schulz in f32, as ours), two option sets; on a GPU both
    // see, f32 and bf16 parameters with Newton-Schulz in bf16. Compared normwise: the parameters
    // (a bf16 parameter's f32 master) after every step, and the updates (parameter minus its
    // start) after the last; the momentum buffers. torch.optim.Muon (torch >= 2.9) always
    // orthogonalizes in bf16 and divides by max(||g||, eps) instead of ||g|| + eps: its updates
    // are compared within kNewtonSchulzBF16 against our f32 cpu steps, kTwoNewtonSchulzBF16
    // against our bf16 CUDA steps.
    struct Case {
        Case(std::string l, DType d, Device dev, MuonOptions o, std::string ns)
            : label(std::move(l)), dtype(d), device(dev), options(o), ns_dtype(std::move(ns)) {}
        std::string label;
        DType dtype;
        Device device;
        MuonOptions options;
        std::string ns_dtype;  // muon_reference.py's --ns-dtype
        std::vector<std::pair<std::string, Tensor>> params;  // ours, by name
        std::vector<Tensor> initial;
        std::vector<std::vector<Tensor>> after;  // [step][parameter]: the parameter (bf16: its master)
        std::vector<Tensor> buffers;
        fs::path in, out, log, rc;
    };
    MuonOptions first;
    first.lr = 0.02;
    first.momentum = 0.95;
    first.weight_decay = 0.1;
    MuonOptions second;
    second.lr = 0.05;
    second.momentum = 0.9;
    second.nesterov = false;
    second.ns_steps = 3;
    std::vector<Case> cases;
    cases.emplace_back("f32/cpu", DType::F32, Device::CPU, first, "f32");
    cases.emplace_back("f32/cpu/no-nesterov", DType::F32, Device::CPU, second, "f32");
    if (torch_cuda_available()) {
        cases.emplace_back("f32/cuda", DType::F32, Device::CUDA, first, "bf16");
        cases.emplace_back("bf16/cuda", DType::BF16, Device::CUDA, first, "bf16");
    } else {
        MESSAGE("the CUDA cases: skipped (no GPU visible to both normtape and torch)");
    }
    const int steps = 3;
    TempDir dir("muon_torch");
    std::string command;
    for (size_t c = 0; c < cases.size(); ++c) {
        Case& k = cases[c];
        manual_seed(120 + c);
        const std::string stem = "case" + std::to_string(c);
        k.in = dir.path / (stem + ".in.safetensors");
        k.out = dir.path / (stem + ".out.safetensors");
        k.log = dir.path / (stem + ".log");
        k.rc = dir.path / (stem + ".rc");
        NamedTensors file;
        std::vector<Tensor> params;
        const std::vector<std::pair<std::string, Shape>> shapes = {{"wide", {8, 20}}, {"tall", {24, 6}}, {"square", {12, 12}}};
        for (const auto& [name, shape] : shapes) {
            Tensor p = randn(shape).to(k.dtype).to(k.device).requires_grad_(true);
            k.params.emplace_back(name, p);
            params.push_back(p);
            k.initial.push_back(p.detach().to(DType::F32).to(Device::CPU));
            file.emplace_back("param." + name, p.detach().to(Device::CPU));
        }
        Muon opt(params, k.options);
        for (int t = 1; t <= steps; ++t) {
            k.after.emplace_back();
            for (const auto& [name, p] : k.params) {
                Tensor g = randn(p.shape()).to(k.dtype);
                file.emplace_back("grad" + std::to_string(t) + "." + name, g);
                set_grad(p, g.to(k.device));
            }
            opt.step();
            for (const auto& [name, p] : k.params)
                k.after.back().push_back((k.dtype == DType::BF16 ? opt.state(p).master : p).detach().to(Device::CPU).clone());
        }
        for (const auto& [name, p] : k.params) k.buffers.push_back(opt.state(p).momentum_buffer.to(Device::CPU));
        save_safetensors(k.in.string(), file);
        const MuonOptions& o = k.options;
        command += "( OMP_NUM_THREADS=1 " + python() + " " +
                   shell_quote(fs::path(NORMTAPE_SOURCE_DIR) / "tests" / "muon_reference.py") + " --in " +
                   shell_quote(k.in) + " --out " + shell_quote(k.out) + " --steps " + std::to_string(steps) +
                   " --lr " + number(o.lr) + " --momentum " + number(o.momentum) + (o.nesterov ? "" : " --no-nesterov") +
                   " --weight-decay " + number(o.weight_decay) + " --ns-steps " + std::to_string(o.ns_steps) +
                   " --ns-dtype " + k.ns_dtype + " --device " + device_name(k.device) + " > " + shell_quote(k.log) +
                   " 2>&1; echo $? > " + shell_quote(k.rc) + " ) & ";
    }
    command += "wait";
    REQUIRE(std::system(command.c_str()) == 0);

    std::ostringstream summary;
    summary.precision(2);
    summary << std::scientific << "Muon against PyTorch, normwise (the parameters, worst step; the updates; torch.optim.Muon's updates):";
    for (const Case& k : cases) {
        INFO(k.label);
        std::string rc = slurp(k.rc.string());
        INFO("muon_reference.py exit status " << rc << ", output:\n" << slurp(k.log.string()));
        REQUIRE(rc == "0\n");
        NamedTensors loaded = load_safetensors(k.out.string());
        std::map<std::string, Tensor> theirs(loaded.begin(), loaded.end());
        // f32 on the cpu: the same iteration in the same dtype (measured worst 9.9e-8 on the
        // parameters; 7.9e-6 on the updates, which also carry the f32 rounding of parameters about
        // 50 times larger than an update, so their bound is 3e-5). bf16 Newton-Schulz on both
        // sides rounds at other points (measured worst on an H200: 6.9e-4 on the parameters,
        // 3.5e-2 on the updates); torch.optim.Muon 1.1e-2 against f32 on the cpu, 2.6e-2 on CUDA.
        const bool bf16 = k.ns_dtype == "bf16";
        const double param_tol = bf16 ? 2e-3 : 1e-5, update_tol = bf16 ? kTwoNewtonSchulzBF16 : 3e-5;
        const double optim_tol = bf16 ? kTwoNewtonSchulzBF16 : kNewtonSchulzBF16;
        double worst_param = 0.0, worst_update = 0.0, worst_optim = -1.0;
        auto find = [&](const std::string& key) -> std::optional<Tensor> {
            auto it = theirs.find(key);
            CHECK_MESSAGE(it != theirs.end(), "no ", key, " from muon_reference.py");
            if (it == theirs.end()) return std::nullopt;
            return it->second;
        };
        for (size_t i = 0; i < k.params.size(); ++i) {
            const std::string& name = k.params[i].first;
            CAPTURE(name);
            for (int t = 1; t <= steps; ++t) {
                std::optional<Tensor> p = find("step" + std::to_string(t) + "." + name);
                if (!p) continue;
                const double e = normwise_error(k.after[t - 1][i], *p);
                worst_param = std::max(worst_param, e);
                CHECK_NORMWISE(k.after[t - 1][i], *p, param_tol);
            }
            if (std::optional<Tensor> p = find("step" + std::to_string(steps) + "." + name)) {
                Tensor ours = difference(k.after.back()[i], k.initial[i]), ref = difference(*p, k.initial[i]);
                worst_update = std::max(worst_update, normwise_error(ours, ref));
                CHECK_NORMWISE(ours, ref, update_tol);
            }
            if (std::optional<Tensor> b = find("buf." + name)) CHECK_NORMWISE(k.buffers[i], *b, 1e-6);
            auto optim = theirs.find("optim.step" + std::to_string(steps) + "." + name);
            if (optim != theirs.end()) {
                Tensor ours = difference(k.after.back()[i], k.initial[i]), ref = difference(optim->second, k.initial[i]);
                worst_optim = std::max(worst_optim, normwise_error(ours, ref));
                CHECK_NORMWISE(ours, ref, optim_tol);
            }
        }
        summary << "\n  " << k.label << ": " << worst_param << ", " << worst_update << ", ";
        if (worst_optim < 0) summary << "not run (torch has no torch.optim.Muon)";
        else summary << worst_optim;
    }
    MESSAGE(summary.str());
}

}  // TEST_SUITE("muon")
