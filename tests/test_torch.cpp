// tests/test_torch.cpp: normtape's GPT against PyTorch, the field's reference (llm.c test_gpt2.c
// compares its model with a PyTorch dump the same way).
//
// For norm {layer, rms} x policy {Input, Output} x dtype {f64, f32}: a small GPT with perturbed
// parameters (non-zero biases, norm weights away from 1, some negative, all |w| >= 0.5 so that
// SavePolicy::Output never falls back) computes loss and gradients on one batch; its checkpoint
// and the batch go to tests/torch_reference.py, which rebuilds the model functionally in
// PyTorch and writes loss and gradients back. Loss: relative error; each gradient: normwise
// relative error ||ours - torch|| / ||torch||; both within tolerance(dtype).rtol (tests/test_util.h).
//
// Not here: per-op gradchecks (test_layer_norm.cpp, test_rms_norm.cpp, test_elementwise.cpp and
// the other op files). Skipped (SKIP_TEST) where the interpreter (Debian's /usr/bin/python3)
// cannot import torch. The eight scripts run in parallel, one thread each (each spends about
// 1.5 s importing torch).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace normtape;
using normtape::testing::tolerance;

namespace {

// Debian's python3-torch by default; NORMTAPE_PYTHON names another interpreter (one
// whose torch has CUDA, for the bf16 GPU cases).
std::string python() {
    const char* p = std::getenv("NORMTAPE_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

bool python_succeeds(const std::string& code) {
    return std::system((python() + " -c '" + code + "' >/dev/null 2>&1").c_str()) == 0;
}

bool torch_available() {
    static const bool available = python_succeeds("import torch");
    return available;
}

// Both sides can run on a GPU: normtape sees one and so does the interpreter's torch.
bool torch_cuda_available() {
    static const bool available = cuda_is_available() && python_succeeds("import torch; assert torch.cuda.is_available()");
    return available;
}

// Allowed error against PyTorch: tolerance(dtype).rtol in f32 and f64 (1e-5, 1e-10); in bf16 the two
// frameworks round intermediate values at different points, so a few bf16 ulps (3.9e-3 each).
double torch_tolerance(DType dtype) { return dtype == DType::BF16 ? 3e-2 : tolerance(dtype).rtol; }

// A path as one word of /bin/sh (the temp and source paths hold no single quote).
std::string shell_quote(const fs::path& p) {
    std::string quoted = "'";  // built piecewise: GCC 12 warns falsely (-Wrestrict) on "'" + s + "'"
    quoted += p.string();
    quoted += "'";
    return quoted;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Moves every parameter away from GPT-2's init, in place (no graph exists yet):
// norm weights to +-[0.5, 1.5) (a quarter negative), every bias to N(0, 0.1^2), other weights
// times (1 + N(0, 0.1^2)), and c_attn weights times 10 more so that attention is far from uniform
// and the q and k rows of dc_attn.weight are not negligible beside the v rows.
template <class T>
void perturb(const GPT& model) {
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters()) {
        T* v = p.template data_ptr<T>();
        bool norm_weight = name.find("ln_") != std::string::npos && ends_with(name, ".weight");
        for (int64_t i = 0; i < p.numel(); ++i) {
            if (norm_weight) {
                double magnitude = 0.5 + rand_scalar();
                v[i] = static_cast<T>(rand_scalar() < 0.25 ? -magnitude : magnitude);
            } else if (ends_with(name, ".bias")) {
                v[i] = static_cast<T>(0.1 * randn_scalar());
            } else {
                double factor = (1.0 + 0.1 * randn_scalar()) * (name.find("c_attn") != std::string::npos ? 10.0 : 1.0);
                v[i] = static_cast<T>(v[i] * factor);
            }
        }
    }
}

struct Case {
    NormKind norm;
    SavePolicy policy;
    DType dtype;
    Device device;
    std::string label;      // "layer/output/f32"
    fs::path checkpoint, out, log, rc;
    double loss = 0.0;
    NamedTensors grads;     // ours, by parameter name
};

}  // namespace

TEST_SUITE("torch_crosscheck") {

TEST_CASE("torch_crosscheck: GPT loss and parameter gradients match PyTorch") {
    if (!torch_available()) SKIP_TEST(python() << " cannot import torch (Debian: apt-get install python3-torch)");
    const int64_t B = 2, T = 12, n_head = 2;
    testing::TempDir dir("torch");

    // One batch for every case.
    manual_seed(7);
    std::vector<int64_t> ids(2 * B * T);
    for (int64_t& id : ids) id = static_cast<int64_t>(rand_scalar() * 256.0);
    Tensor idx = from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + B * T), {B, T});
    Tensor targets = from_vector(std::vector<int64_t>(ids.begin() + B * T, ids.end()), {B, T});
    fs::path batch = dir.path / "batch.safetensors";
    save_safetensors(batch.string(), {{"idx", idx}, {"targets", targets}});

    // Ours: a model per case, its checkpoint, loss and gradients. f64 and f32 on the cpu against
    // Debian's torch; bf16 on the GPU against the interpreter's torch where both see a GPU.
    std::vector<std::pair<DType, Device>> runs = {{DType::F64, Device::CPU}, {DType::F32, Device::CPU}};
    if (torch_cuda_available()) runs.emplace_back(DType::BF16, Device::CUDA);
    else MESSAGE("bf16 on the GPU: skipped (no GPU visible to both normtape and torch)");
    std::vector<Case> cases;
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output})
            for (auto [dtype, device] : runs) {
                Case c;
                c.norm = norm;
                c.policy = policy;
                c.dtype = dtype;
                c.device = device;
                c.label = std::string(norm_kind_name(norm)) + "/" + policy_name(policy) + "/" +
                          dtype_name(dtype) + "/" + device_name(device);
                std::string stem = "case" + std::to_string(cases.size());
                c.checkpoint = dir.path / (stem + ".ckpt.safetensors");
                c.out = dir.path / (stem + ".torch.safetensors");
                c.log = dir.path / (stem + ".log");
                c.rc = dir.path / (stem + ".rc");

                manual_seed(1000 + cases.size());
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
                INFO(c.label);
                CHECK(output_policy_fallbacks() == fallbacks);  // Output really saved y
                loss.backward();
                c.loss = testing::as_f64(loss)[0];
                for (const auto& [name, p] : model.named_parameters()) c.grads.emplace_back(name, p.grad());
                cases.push_back(c);
            }

    // Theirs: every script at once, each leaving its exit status and output in files.
    std::string script = std::string(NORMTAPE_SOURCE_DIR) + "/tests/torch_reference.py";
    std::string command;
    for (const Case& c : cases) {
        command += "( OMP_NUM_THREADS=1 " + python() + " " + shell_quote(script) + " --device " + device_name(c.device) +
                   " --checkpoint " + shell_quote(c.checkpoint) + " --batch " + shell_quote(batch) +
                   " --out " + shell_quote(c.out) + " --norm " + norm_kind_name(c.norm) +
                   " --n-head " + std::to_string(n_head) + " --eps 1e-5" +
                   " > " + shell_quote(c.log) + " 2>&1; echo $? > " + shell_quote(c.rc) + " ) & ";
    }
    command += "wait";
    CHECK(std::system(command.c_str()) == 0);

    std::ostringstream summary;
    summary.precision(2);
    summary << std::scientific << "errors against PyTorch (loss relative, worst gradient normwise):";
    for (const Case& c : cases) {
        INFO(c.label);
        std::string rc = testing::slurp(c.rc), log = testing::slurp(c.log);
        if (!rc.empty() && rc.back() == '\n') rc.pop_back();
        INFO("torch_reference.py exit status ", rc, ", output:\n", log);
        if (rc != "0") {
            CHECK_MESSAGE(false, "torch_reference.py failed");
            continue;
        }
        CHECK_MESSAGE(fs::exists(c.out), "torch_reference.py wrote no ", c.out.string());
        if (!fs::exists(c.out)) continue;
        NamedTensors file = load_safetensors(c.out.string());
        std::map<std::string, Tensor> theirs(file.begin(), file.end());
        double rtol = torch_tolerance(c.dtype);

        CHECK_MESSAGE(theirs.count("loss") == 1, "no loss in ", c.out.string());
        if (theirs.count("loss") != 1) continue;
        double torch_loss = testing::as_f64(theirs["loss"])[0];
        double loss_error = std::abs(c.loss - torch_loss) / std::abs(torch_loss);
        std::ostringstream loss_info;
        loss_info.precision(17);
        loss_info << "loss: ours " << c.loss << ", torch " << torch_loss << ", relative error " << loss_error;
        INFO(loss_info.str());
        CHECK(loss_error <= rtol);

        double worst = 0.0;
        std::string worst_name;
        CHECK(theirs.size() == c.grads.size() + 1);  // "loss" and one gradient per parameter
        for (const auto& [name, grad] : c.grads) {
            INFO("parameter ", name);
            auto it = theirs.find("grad." + name);
            CHECK_MESSAGE(it != theirs.end(), "no grad.", name, " in ", c.out.string());
            CHECK_MESSAGE(grad.defined(), "normtape gave ", name, " no gradient");
            if (it == theirs.end() || !grad.defined()) continue;
            CHECK_MESSAGE(it->second.shape() == grad.shape(), "shapes: ours ", shape_str(grad.shape()), ", torch ",
                          shape_str(it->second.shape()));
            if (it->second.shape() != grad.shape()) continue;
            CHECK(it->second.dtype() == c.dtype);
            double error = testing::normwise_error(grad, it->second);
            INFO("normwise relative error ", error);
            CHECK(error <= rtol);
            if (!(error <= worst)) {
                worst = error;
                worst_name = name;
            }
        }
        summary << "\n  " << c.label << ": loss " << loss_error << ", gradient " << worst << " (" << worst_name << ")";
    }
    MESSAGE(summary.str());
}

}  // TEST_SUITE("torch_crosscheck")
