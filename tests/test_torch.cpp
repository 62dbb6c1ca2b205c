// tests/test_torch.cpp: normtape's GPT against PyTorch, the field's reference (llm.c test_gpt2.c
// compares its model with a PyTorch dump the same way).
//
// Two test cases; in each, a small GPT with perturbed parameters (non-zero biases, norm weights
// away from 1, some negative, all |w| >= 0.5 so that SavePolicy::Output never falls back) writes
// its checkpoint, and tests/torch_reference.py rebuilds the model functionally in PyTorch from it
// and writes loss and gradients back. Loss: relative error; each gradient: normwise relative error
// ||ours - torch|| / ||torch||.
//   - GPT-2's block, norm {layer, rms} x policy {Input, Output} x dtype {f64, f32} (and bf16 on a
//     GPU both see): one forward and backward, both within tolerance(dtype).rtol (tests/test_util.h).
//   - Each preset of gpt_config (gpt2, gpt2 with tied embeddings, nanochat tied, llama with
//     grouped-query attention) x policy {Input, Output, Normalized}, f64 on the cpu: both sides
//     take three AdamW steps on the batch from the same parameters, then a fourth forward and
//     backward; the loss of every forward within 1e-10, the parameters after the steps and the
//     last gradients within 1e-8 (normwise).
//
// Not here: per-op gradchecks (test_layer_norm.cpp, test_rms_norm.cpp, test_elementwise.cpp and
// the other op files). Skipped (SKIP_TEST) where the interpreter (Debian's /usr/bin/python3)
// cannot import torch. Each test case runs its scripts in parallel, one thread each (each spends
// about 1.5 s importing torch).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace normtape;
using testing::in_test_part;
using testing::python;
using testing::shell_quote;
using testing::torch_available;
using testing::torch_cuda_available;
using normtape::testing::tolerance;

namespace {

// Allowed error against PyTorch: tolerance(dtype).rtol in f32 and f64 (1e-5, 1e-10); in bf16 the two
// frameworks round intermediate values at different points, so a few bf16 ulps (3.9e-3 each).
double torch_tolerance(DType dtype) { return dtype == DType::BF16 ? 3e-2 : tolerance(dtype).rtol; }


bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The weight of a norm: ln_1, ln_2, ln_f, emb_norm, q_norm, k_norm (affine norms only).
bool is_norm_weight(const std::string& name) {
    return ends_with(name, ".weight") &&
           (name.find("ln_") != std::string::npos || name.find("_norm.") != std::string::npos);
}

// The weights that make q and k (and v): GPT-2's packed c_attn, or c_q, c_k, c_v.
bool is_qkv_weight(const std::string& name) {
    for (const char* m : {"c_attn.", "c_q.", "c_k.", "c_v."})
        if (name.find(m) != std::string::npos) return true;
    return false;
}

// Moves every parameter away from GPT-2's init, in place (no graph exists yet):
// norm weights to +-[0.5, 1.5) (a quarter negative), every bias to N(0, 0.1^2), other weights
// times (1 + N(0, 0.1^2)), and the q, k, v weights (c_attn, or c_q, c_k, c_v) times 10 more so
// that attention is far from uniform and the q and k gradients are not negligible beside v's.
template <class T>
void perturb(const GPT& model) {
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters()) {
        T* v = p.template data_ptr<T>();
        bool norm_weight = is_norm_weight(name);
        for (int64_t i = 0; i < p.numel(); ++i) {
            if (norm_weight) {
                double magnitude = 0.5 + rand_scalar();
                v[i] = static_cast<T>(rand_scalar() < 0.25 ? -magnitude : magnitude);
            } else if (ends_with(name, ".bias")) {
                v[i] = static_cast<T>(0.1 * randn_scalar());
            } else {
                double factor = (1.0 + 0.1 * randn_scalar()) * (is_qkv_weight(name) ? 10.0 : 1.0);
                v[i] = static_cast<T>(v[i] * factor);
            }
        }
    }
}

// One batch [B, T] of ids for every case, written to `path` as "idx" and "targets".
std::pair<Tensor, Tensor> make_batch(int64_t B, int64_t T, const fs::path& path) {
    manual_seed(7);
    std::vector<int64_t> ids(2 * B * T);
    for (int64_t& id : ids) id = static_cast<int64_t>(rand_scalar() * 256.0);
    Tensor idx = from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + B * T), {B, T});
    Tensor targets = from_vector(std::vector<int64_t>(ids.begin() + B * T, ids.end()), {B, T});
    save_safetensors(path.string(), {{"idx", idx}, {"targets", targets}});
    return {idx, targets};
}

// One run of torch_reference.py: its arguments (besides --out) and the files it leaves.
struct ScriptRun {
    std::string label;  // "layer/output/f32/cpu"
    std::string args;   // shell words, quoted where needed
    fs::path out, log, rc;
};

ScriptRun script_run(const std::string& label, const fs::path& dir, size_t index) {
    ScriptRun run;
    run.label = label;
    std::string stem = "case" + std::to_string(index);
    run.out = dir / (stem + ".torch.safetensors");
    run.log = dir / (stem + ".log");
    run.rc = dir / (stem + ".rc");
    return run;
}

// Runs every script at once, each leaving its exit status and output in its files.
void run_scripts(const std::vector<const ScriptRun*>& runs) {
    std::string script = std::string(NORMTAPE_SOURCE_DIR) + "/tests/torch_reference.py";
    std::string command;
    for (const ScriptRun* r : runs)
        command += "( OMP_NUM_THREADS=1 " + python() + " " + shell_quote(script) + " " + r->args + " --out " +
                   shell_quote(r->out) + " > " + shell_quote(r->log) + " 2>&1; echo $? > " + shell_quote(r->rc) +
                   " ) & ";
    command += "wait";
    CHECK(std::system(command.c_str()) == 0);
}

// What a script wrote, by name; nothing (after a failed CHECK naming the cause) when it failed.
// Call under INFO(run.label).
std::optional<std::map<std::string, Tensor>> read_output(const ScriptRun& run) {
    std::string rc = testing::slurp(run.rc), log = testing::slurp(run.log);
    if (!rc.empty() && rc.back() == '\n') rc.pop_back();
    INFO("torch_reference.py exit status ", rc, ", output:\n", log);
    if (rc != "0") {
        CHECK_MESSAGE(false, "torch_reference.py failed");
        return std::nullopt;
    }
    CHECK_MESSAGE(fs::exists(run.out), "torch_reference.py wrote no ", run.out.string());
    if (!fs::exists(run.out)) return std::nullopt;
    NamedTensors file = load_safetensors(run.out.string());
    return std::map<std::string, Tensor>(file.begin(), file.end());
}

// Relative error of our scalar against theirs[key] (0-dim or [n] at `index`), CHECKed against
// rtol; -1 (after a failed CHECK) when the file lacks it.
double compare_scalar(double ours, const std::map<std::string, Tensor>& theirs, const std::string& key, int64_t index,
                      double rtol) {
    auto it = theirs.find(key);
    CHECK_MESSAGE(it != theirs.end(), "no ", key, " from torch_reference.py");
    if (it == theirs.end()) return -1.0;
    std::vector<double> values = testing::as_f64(it->second);
    CHECK_MESSAGE(index < static_cast<int64_t>(values.size()), key, " holds ", values.size(), " values");
    if (index >= static_cast<int64_t>(values.size())) return -1.0;
    double torch_value = values[static_cast<size_t>(index)];
    double error = std::abs(ours - torch_value) / std::abs(torch_value);
    std::ostringstream info;
    info.precision(17);
    info << key << "[" << index << "]: ours " << ours << ", torch " << torch_value << ", relative error " << error;
    INFO(info.str());
    CHECK(error <= rtol);
    return error;
}

// The worst normwise relative error of ours (by parameter name) against theirs[prefix + name],
// each CHECKed against rtol, shape and dtype included.
struct Worst {
    double error = 0.0;
    std::string name;
};
Worst compare_tensors(const NamedTensors& ours, const std::map<std::string, Tensor>& theirs, const std::string& prefix,
                      DType dtype, double rtol) {
    Worst worst;
    for (const auto& [name, t] : ours) {
        INFO("parameter ", name, " (", prefix, ")");
        auto it = theirs.find(prefix + name);
        CHECK_MESSAGE(it != theirs.end(), "no ", prefix, name, " from torch_reference.py");
        CHECK_MESSAGE(t.defined(), "normtape gave ", name, " no ", prefix);
        if (it == theirs.end() || !t.defined()) continue;
        CHECK_MESSAGE(it->second.shape() == t.shape(), "shapes: ours ", shape_str(t.shape()), ", torch ",
                      shape_str(it->second.shape()));
        if (it->second.shape() != t.shape()) continue;
        CHECK(it->second.dtype() == dtype);
        double error = testing::normwise_error(t, it->second);
        INFO("normwise relative error ", error);
        CHECK(error <= rtol);
        if (!(error <= worst.error)) worst = {error, name};
    }
    return worst;
}

// A double as a script argument, every bit kept.
std::string number(double x) {
    std::ostringstream s;
    s.precision(17);
    s << x;
    return s.str();
}

// One case of the first test case: ours, and the script's run.
struct Case {
    DType dtype;
    fs::path checkpoint;
    ScriptRun run;
    double loss = 0.0;
    NamedTensors grads;  // ours, by parameter name
};

// One case of the second: a preset, its tying and a policy.
struct PresetCase {
    fs::path checkpoint;
    ScriptRun run;
    std::vector<double> losses;  // ours, of each forward (the steps', then the last)
    NamedTensors grads;          // ours after the steps, by parameter name
    NamedTensors params;         // ours after the steps
};

}  // namespace

TEST_SUITE("torch_crosscheck") {

TEST_CASE("torch_crosscheck: GPT loss and parameter gradients match PyTorch") {
    if (!torch_available()) SKIP_TEST(python() << " cannot import torch (Debian: apt-get install python3-torch)");
    const int64_t B = 2, T = 12, n_head = 2;
    testing::TempDir dir("torch");
    fs::path batch = dir.path / "batch.safetensors";
    auto [idx, targets] = make_batch(B, T, batch);

    // Ours: a model per case, its checkpoint, loss and gradients. f64 and f32 on the cpu against
    // Debian's torch; bf16 on the GPU against the interpreter's torch where both see a GPU.
    std::vector<std::pair<DType, Device>> runs = {{DType::F64, Device::CPU}, {DType::F32, Device::CPU}};
    if (torch_cuda_available()) runs.emplace_back(DType::BF16, Device::CUDA);
    else MESSAGE("bf16 on the GPU: skipped (no GPU visible to both normtape and torch)");
    std::vector<Case> cases;
    int64_t item = 0;
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output})
            for (auto [dtype, device] : runs) {
                if (!in_test_part(item++)) continue;
                Case c;
                c.dtype = dtype;
                c.run = script_run(std::string(norm_kind_name(norm)) + "/" + policy_name(policy) + "/" +
                                       dtype_name(dtype) + "/" + device_name(device),
                                   dir.path, cases.size());
                c.checkpoint = dir.path / ("case" + std::to_string(cases.size()) + ".ckpt.safetensors");
                c.run.args = "--device " + device_name(device) + " --checkpoint " + shell_quote(c.checkpoint) +
                             " --batch " + shell_quote(batch) + " --norm " + norm_kind_name(norm) + " --n-head " +
                             std::to_string(n_head) + " --eps 1e-5";

                manual_seed(999 + item);  // the case's own seed, whichever part runs
                GPTConfig config;
                config.vocab_size = 256;
                config.block_size = 16;
                config.n_layer = 2;
                config.n_head = n_head;
                config.n_embd = 16;
                config.norm = norm;
                config.policy = policy;
                config.dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
                GPT model(config);
                if (dtype == DType::F64) perturb<double>(model);
                else perturb<float>(model);
                model.to(device, dtype);
                save_checkpoint(c.checkpoint.string(), model);

                int64_t fallbacks = output_policy_fallbacks();
                Tensor loss = model.loss(idx.to(device), targets.to(device));
                INFO(c.run.label);
                CHECK(output_policy_fallbacks() == fallbacks);  // Output really saved y
                loss.backward();
                c.loss = testing::as_f64(loss)[0];
                for (const auto& [name, p] : model.named_parameters()) c.grads.emplace_back(name, p.grad());
                cases.push_back(c);
            }

    // Theirs: every script at once.
    std::vector<const ScriptRun*> scripts;
    for (const Case& c : cases) scripts.push_back(&c.run);
    run_scripts(scripts);

    std::ostringstream summary;
    summary.precision(2);
    summary << std::scientific << "errors against PyTorch (loss relative, worst gradient normwise):";
    for (const Case& c : cases) {
        INFO(c.run.label);
        std::optional<std::map<std::string, Tensor>> theirs = read_output(c.run);
        if (!theirs) continue;
        double rtol = torch_tolerance(c.dtype);
        double loss_error = compare_scalar(c.loss, *theirs, "loss", 0, rtol);
        CHECK(theirs->size() == c.grads.size() + 1);  // "loss" and one gradient per parameter
        Worst grad = compare_tensors(c.grads, *theirs, "grad.", c.dtype, rtol);
        summary << "\n  " << c.run.label << ": loss " << loss_error << ", gradient " << grad.error << " ("
                << grad.name << ")";
    }
    MESSAGE(summary.str());
}

// The tolerances for f64 after training steps: the loss relative, parameters and
// gradients normwise (AdamW's division by sqrt(v) + eps amplifies the rounding of small
// gradients into the parameters, and so into the next gradients).
constexpr double kPresetLossRtol = 1e-10;
constexpr double kPresetNormwiseRtol = 1e-8;

TEST_CASE("torch_crosscheck: each preset and policy after three AdamW steps matches PyTorch in f64") {
    if (!torch_available()) SKIP_TEST(python() << " cannot import torch (Debian: apt-get install python3-torch)");
    const int64_t B = 2, T = 12, n_head = 4, n_kv_head = 2, steps = 3;
    AdamWOptions adamw;
    adamw.lr = 1e-2;
    adamw.beta1 = 0.9;
    adamw.beta2 = 0.95;
    adamw.eps = 1e-8;
    adamw.weight_decay = 0.1;  // one group: every parameter decays, norm weights and biases included
    testing::TempDir dir("torch_presets");
    fs::path batch = dir.path / "batch.safetensors";
    auto [idx, targets] = make_batch(B, T, batch);

    struct Preset {
        const char* arch;
        bool tie;
    };
    const Preset presets[] = {{"gpt2", false}, {"gpt2", true}, {"nanochat", true}, {"llama", false}};
    std::vector<PresetCase> cases;
    for (const Preset& preset : presets)
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
            GPTConfig config = gpt_config(preset.arch);
            config.vocab_size = 256;
            config.block_size = 16;
            config.n_layer = 2;
            config.n_head = n_head;
            config.n_embd = 32;
            if (std::string(preset.arch) != "gpt2") config.n_kv_head = n_kv_head;  // grouped-query attention
            config.tie_embeddings = preset.tie;
            config.zero_init_proj = false;  // perturb() moves every parameter; zeros would stay near zero
            config.policy = policy;
            config.dtype = DType::F64;

            PresetCase c;
            std::string stem = "case" + std::to_string(cases.size());
            c.checkpoint = dir.path / (stem + ".ckpt.safetensors");
            c.run = script_run(std::string(preset.arch) + (preset.tie ? "-tied/" : "/") + policy_name(policy),
                               dir.path, cases.size());
            c.run.args = "--checkpoint " + shell_quote(c.checkpoint) + " --batch " + shell_quote(batch) + " --arch " +
                         preset.arch + " --n-head " + std::to_string(config.n_head) + " --n-kv-head " +
                         std::to_string(config.kv_heads()) + " --eps " + number(config.norm_eps) + " --rope-theta " +
                         number(config.rope_theta) + " --softcap " + number(config.logit_softcap) +
                         (config.tie_embeddings ? " --tie" : "") + " --mlp-hidden " + std::to_string(config.hidden()) +
                         " --adamw-steps " + std::to_string(steps) + " --lr " + number(adamw.lr) + " --beta1 " +
                         number(adamw.beta1) + " --beta2 " + number(adamw.beta2) + " --adam-eps " +
                         number(adamw.eps) + " --weight-decay " + number(adamw.weight_decay);
            INFO(c.run.label);

            manual_seed(2000 + cases.size());
            GPT model(config);
            perturb<double>(model);
            save_checkpoint(c.checkpoint.string(), model);
            AdamW optimizer(model.parameters(), adamw);
            int64_t fallbacks = output_policy_fallbacks();
            for (int64_t step = 0; step <= steps; ++step) {  // the steps, then the forward and backward compared
                Tensor loss = model.loss(idx, targets);
                loss.backward();
                c.losses.push_back(testing::as_f64(loss)[0]);
                if (step == steps) break;
                optimizer.step();
                optimizer.zero_grad();
            }
            CHECK(output_policy_fallbacks() == fallbacks);  // Output really saved y
            for (const auto& [name, p] : model.named_parameters()) {
                c.grads.emplace_back(name, p.grad());
                c.params.emplace_back(name, p);
            }
            cases.push_back(c);
        }

    std::vector<const ScriptRun*> scripts;
    for (const PresetCase& c : cases) scripts.push_back(&c.run);
    run_scripts(scripts);

    std::ostringstream summary;
    summary.precision(2);
    summary << std::scientific
            << "errors against PyTorch after " << steps << " AdamW steps (loss relative: the last, the worst of "
            << "the steps'; worst parameter and gradient normwise):";
    for (const PresetCase& c : cases) {
        INFO(c.run.label);
        std::optional<std::map<std::string, Tensor>> theirs = read_output(c.run);
        if (!theirs) continue;
        double loss_error = compare_scalar(c.losses.back(), *theirs, "loss", 0, kPresetLossRtol);
        double step_error = 0.0;
        for (int64_t step = 0; step < steps; ++step)
            step_error = std::max(step_error, compare_scalar(c.losses[step], *theirs, "losses", step, kPresetLossRtol));
        CHECK(theirs->size() == 2 * c.grads.size() + 2);  // loss, losses, and each parameter's grad. and param.
        Worst param = compare_tensors(c.params, *theirs, "param.", DType::F64, kPresetNormwiseRtol);
        Worst grad = compare_tensors(c.grads, *theirs, "grad.", DType::F64, kPresetNormwiseRtol);
        summary << "\n  " << c.run.label << ": loss " << loss_error << " (steps " << step_error << "), parameter "
                << param.error << " (" << param.name << "), gradient " << grad.error << " (" << grad.name << ")";
    }
    MESSAGE(summary.str());
}

}  // TEST_SUITE("torch_crosscheck")
