// examples/memory_report/memory_report.cpp: where the bytes that a forward saves for backward go, and the ways to
// change them, on a small model written with the public API only (copy it as a start).
//
// The model: a two-block pre-LN transformer over token ids (B batch, T sequence, C width, NH heads,
// V vocabulary). Every module's forward opens a ModuleScope, so the report names the module of
// each saved tensor ("h.1.mlp.fc"). For each setting below, one forward and backward on the same
// batch: the saved-tensor report after the forward (saved_tensors_report(), core/saved_report.h)
// and the gradients, checked against the plain run's: bit for bit, except under SavePolicy::Output
// (it recovers the norms' x_hat by dividing by their weights) and SavePolicy::Normalized (its y is
// computed from the rounded x_hat), which agree to rounding: checked to 1e-5 of each parameter's
// largest gradient. Then the peak of a whole training step (a fresh model, AdamW, forward, loss,
// backward, optimizer step) under each policy and with checkpointed blocks, predicted before it
// runs by a dry run of the same code (dry_run, core/dry_run.h) and then measured: equal to the
// byte, with no memory code in the model. Runs on the GPU when one is visible.
// Exit status: 0 when every check holds, 1 otherwise.
#include <normtape.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace normtape;

constexpr int64_t B = 4, T = 32, C = 64, NH = 4, V = 96;

class Attention : public Module {  // x -> c_proj(causal_self_attention(c_attn(x)))
public:
    explicit Attention(TensorOptions o)
        : c_attn(register_module("c_attn", std::make_shared<Linear>(C, 3 * C, true, o))),
          c_proj(register_module("c_proj", std::make_shared<Linear>(C, C, true, o))) {}
    Tensor forward(const Tensor& x) const {
        ModuleScope scope(*this);
        return c_proj->forward(causal_self_attention(c_attn->forward(x), NH));
    }
    std::shared_ptr<Linear> c_attn, c_proj;
};

class FeedForward : public Module {  // x -> proj(gelu(fc(x)))
public:
    explicit FeedForward(TensorOptions o)
        : fc(register_module("fc", std::make_shared<Linear>(C, 4 * C, true, o))),
          proj(register_module("proj", std::make_shared<Linear>(4 * C, C, true, o))) {}
    Tensor forward(const Tensor& x) const {
        ModuleScope scope(*this);
        return proj->forward(gelu(fc->forward(x)));
    }
    std::shared_ptr<Linear> fc, proj;
};

class TransformerBlock : public Module {  // pre-LN: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))
public:
    explicit TransformerBlock(TensorOptions o)
        : ln_1(register_module("ln_1", std::make_shared<LayerNorm>(C, NormOptions{.device = o.device_}))),
          attn(register_module("attn", std::make_shared<Attention>(o))),
          ln_2(register_module("ln_2", std::make_shared<RMSNorm>(C, NormOptions{.device = o.device_}))),
          mlp(register_module("mlp", std::make_shared<FeedForward>(o))) {}
    // x by value, reassigned: nothing but ln_1 keeps the block's input (what SavePolicy::Output frees).
    Tensor forward(Tensor x) const {
        ModuleScope scope(*this);
        x = add(x, attn->forward(ln_1->forward(x)));
        return add(x, mlp->forward(ln_2->forward(x)));
    }
    std::shared_ptr<LayerNorm> ln_1;
    std::shared_ptr<Attention> attn;
    std::shared_ptr<RMSNorm> ln_2;
    std::shared_ptr<FeedForward> mlp;
};

class TinyTransformer : public Module {
public:
    explicit TinyTransformer(TensorOptions o)
        : wte(register_module("wte", std::make_shared<Embedding>(V, C, o))),
          ln_f(register_module("ln_f", std::make_shared<LayerNorm>(C, NormOptions{.device = o.device_}))),
          lm_head(register_module("lm_head", std::make_shared<Linear>(C, V, false, o))) {
        for (int i = 0; i < 2; ++i) h.push_back(register_module("h." + std::to_string(i), std::make_shared<TransformerBlock>(o)));
    }
    // ids, targets: [B, T] i64 -> the mean cross-entropy. With checkpoint_blocks each block saves
    // only its input and runs again in backward (core/activation_checkpoint.h).
    Tensor loss(const Tensor& ids, const Tensor& targets) const {
        ModuleScope scope(*this);
        Tensor x = wte->forward(ids);
        for (const auto& block : h)
            x = checkpoint_blocks ? checkpoint([b = block.get()](const Tensor& in) { return b->forward(in); }, x)
                                  : block->forward(std::move(x));
        return cross_entropy(lm_head->forward(ln_f->forward(x)), targets);
    }
    std::shared_ptr<Embedding> wte;
    std::vector<std::shared_ptr<TransformerBlock>> h;
    std::shared_ptr<LayerNorm> ln_f;
    std::shared_ptr<Linear> lm_head;
    bool checkpoint_blocks = false;
};

struct Outcome {
    SavedTensorsReport report;  // right after the forward
    std::vector<std::vector<float>> grads;
};

// One forward (`forward` returns the loss) and backward from zeroed gradients.
Outcome run(TinyTransformer& model, const std::function<Tensor()>& forward) {
    model.zero_grad();
    Tensor loss = forward();
    Outcome out{saved_tensors_report(), {}};  // before backward, which releases what was saved
    loss.backward();
    for (const Tensor& p : model.parameters()) out.grads.push_back(p.grad().to(Device::CPU).to_vector<float>());
    return out;
}

// The largest difference between the gradients, relative to the largest gradient of each tensor.
double grad_difference(const Outcome& a, const Outcome& b) {
    double worst = 0;
    for (size_t i = 0; i < a.grads.size(); ++i) {
        double scale = 0, diff = 0;
        for (size_t j = 0; j < a.grads[i].size(); ++j) {
            scale = std::max(scale, std::abs(static_cast<double>(a.grads[i][j])));
            diff = std::max(diff, std::abs(static_cast<double>(a.grads[i][j]) - b.grads[i][j]));
        }
        worst = std::max(worst, scale > 0 ? diff / scale : diff);
    }
    return worst;
}

bool bit_equal(const Outcome& a, const Outcome& b) {
    for (size_t i = 0; i < a.grads.size(); ++i)
        if (std::memcmp(a.grads[i].data(), b.grads[i].data(), a.grads[i].size() * sizeof(float)) != 0) return false;
    return true;
}

// One training step of a fresh model under `policy`, blocks checkpointed or not, with AdamW.
void train_step(TensorOptions o, SavePolicy policy, bool checkpointed) {
    TinyTransformer model(o);
    set_save_policy(model, policy);
    model.checkpoint_blocks = checkpointed;
    AdamW optimizer({{model.parameters(), 0.01}}, AdamWOptions{});
    const Tensor ids = zeros({B, T}, o.dtype(DType::I64)), targets = zeros({B, T}, o.dtype(DType::I64));
    model.loss(ids, targets).backward();
    optimizer.step();
    optimizer.zero_grad();
}

// The step's peak predicted by a dry run, then measured, for each setting; true when all are equal.
bool step_peaks(TensorOptions o) {
    const Device dev = o.device_;
    std::printf("\nThe peak of a training step (a fresh model, AdamW), predicted by dry_run before it runs, then run:\n");
    std::printf("%-34s %16s %16s\n", "setting", "predicted peak", "measured peak");
    bool ok = true;
    for (bool checkpointed : {false, true})
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
            auto step = [&] { train_step(o, policy, checkpointed); };
            const int64_t predicted = dry_run(dev, step).stats.peak_allocated_bytes;
            const int64_t before = memory_stats(dev).allocated_bytes;
            reset_peak_memory_stats(dev);
            step();
            const int64_t measured = memory_stats(dev).peak_allocated_bytes - before;
            ok = ok && predicted == measured;
            const std::string name = std::string(checkpointed ? "checkpoint, " : "") + "SavePolicy::" +
                                     (policy == SavePolicy::Input    ? "Input"
                                      : policy == SavePolicy::Output ? "Output"
                                                                     : "Normalized");
            std::printf("%-34s %16lld %16lld%s\n", name.c_str(), static_cast<long long>(predicted),
                        static_cast<long long>(measured), predicted == measured ? "" : "  DIFFERENT");
        }
    return ok;
}

int report() {
    const Device dev = cuda_is_available() ? Device::CUDA : Device::CPU;
    const TensorOptions o = TensorOptions().device(dev);
    manual_seed(0);
    TinyTransformer model(o);
    {  // norm weights and biases away from 1 and 0, as after training, so that Output's division matters
        NoGradGuard no_grad;
        for (auto& [name, p] : model.named_parameters())
            if (name.find("ln_") != std::string::npos) p.add_(randn(p.shape(), o), 0.1);
    }
    std::vector<int64_t> id(B * T), next(B * T);
    for (int64_t i = 0; i < B * T; ++i) id[i] = (i * 37 + 11) % V, next[i] = (i * 37 + 48) % V;
    const Tensor ids = from_vector(id, {B, T}).to(dev), targets = from_vector(next, {B, T}).to(dev);
    auto forward = [&] { return model.loss(ids, targets); };

    std::printf("memory_report: 2 pre-LN blocks, B=%lld T=%lld C=%lld NH=%lld V=%lld, f32 on %s\n\n",
                static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(C),
                static_cast<long long>(NH), static_cast<long long>(V), device_name(dev).c_str());
    const Outcome plain = run(model, forward);
    std::printf("The plain run (SavePolicy::Input), its 5 largest saved tensors:\n%s\n", plain.report.table(5).c_str());

    int64_t hooked_bytes = 0;
    struct Setting {
        std::string name;
        std::function<Tensor()> forward;
        double tolerance;  // of the gradients against the plain run's; 0: bit for bit
    };
    const std::vector<Setting> settings = {
        {"SavePolicy::Input", forward, 0},
        {"SavePolicy::Output", [&] { set_save_policy(model, SavePolicy::Output); return forward(); }, 1e-5},
        {"SavePolicy::Normalized", [&] { set_save_policy(model, SavePolicy::Normalized); return forward(); }, 1e-5},
        {"SavedTensorHooks (clone)", [&] {  // the pair lives for the forward; backward unpacks later
             SavedTensorHooks hooks([&](const Tensor& t) { hooked_bytes += t.nbytes(); return t.clone(); },
                                    [](const Tensor& t) { return t; });
             return forward();
         }, 0},
        {"SaveOnCpu", [&] { SaveOnCpu offload; return forward(); }, 0},
        {"checkpoint each block", [&] { model.checkpoint_blocks = true; return forward(); }, 0},
    };
    std::printf("%-26s %14s %14s  %s\n", "setting", "saved bytes", ("on " + device_name(dev)).c_str(), "gradients");
    bool ok = true;
    SavedTensorsReport checkpointed;
    for (const Setting& s : settings) {
        const Outcome out = run(model, s.forward);
        set_save_policy(model, SavePolicy::Input);
        model.checkpoint_blocks = false;
        const double diff = grad_difference(plain, out);
        const bool good = s.tolerance == 0 ? bit_equal(plain, out) : diff <= s.tolerance;
        ok = ok && good;
        char verdict[64];
        std::snprintf(verdict, sizeof verdict, "within %.0e (largest relative difference %.1e)", s.tolerance, diff);
        std::printf("%-26s %14lld %14lld  %s\n", s.name.c_str(), static_cast<long long>(out.report.total_bytes),
                    static_cast<long long>(out.report.bytes_on(dev)),
                    !good ? "DIFFERENT" : s.tolerance == 0 ? "equal bit for bit" : verdict);
        if (s.name.rfind("checkpoint", 0) == 0) checkpointed = out.report;
    }
    std::printf("\nWith checkpoint each block keeps only its input (every slot of the block holds it, via checkpoint):\n%s",
                checkpointed.table(3).c_str());
    std::printf("\nThe hooks' pack saw %lld bytes: each node's saved tensor is cloned on its own, so storages that\n"
                "two nodes share (attention's output and c_proj's input) are kept twice.\n",
                static_cast<long long>(hooked_bytes));
    if (!dev.is_cuda())
        std::printf("On the cpu SaveOnCpu keeps cpu tensors as they are (nothing moves); on a GPU the saved bytes "
                    "leave it.\n");
    if (!ok) std::fprintf(stderr, "memory_report: a setting's gradients differ from the plain run's\n");
    const bool peaks = step_peaks(o);
    if (!peaks) std::fprintf(stderr, "memory_report: a step's predicted peak differs from its measured peak\n");
    return ok && peaks ? 0 : 1;
}

int main() {
    try {
        return report();
    } catch (const std::exception& e) {  // normtape::Error names the op, what it expected and what it found
        std::fprintf(stderr, "memory_report: error: %s\n", e.what());
        return 1;
    }
}
