// examples/train_gpt/model_flops.cpp: model FLOPs and MFU (Note [Model FLOPs], examples/train_gpt/model_flops.h).
#include "model_flops.h"

#include <cstdio>
#include <string>

using namespace normtape;

double model_flops_per_token(const GPT& model, int64_t seq) {
    const GPTConfig& c = model.config();
    double n = 0;
    for (const auto& [name, p] : model.named_parameters())
        if (name != "wpe.weight" && (name != "wte.weight" || c.tie_embeddings)) n += static_cast<double>(p.numel());
    return 6 * n + 12.0 * static_cast<double>(c.n_layer * c.n_embd * seq);
}

double dense_bf16_peak_flops(Device dev) {
    const std::string name = cuda_device_name(dev);
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (has("H100") && has("PCIe")) return 756e12;
    if ((has("H100") || has("H200")) && has("NVL")) return 835e12;
    if (has("H100") || has("H200")) return 989.4e12;  // SXM
    if (has("A100")) return 312e12;
    return 0;
}

void report_model_flops(const GPT& model, int64_t seq, int64_t tokens_per_step, Device dev, bool bf16, int processes,
                        RunResult& r) {
    r.model_flops_per_step = model_flops_per_token(model, seq) * static_cast<double>(tokens_per_step);
    const double per_s = r.model_flops_per_step / (r.step_ms_median / 1000.0);
    const double peak = dev.is_cuda() && bf16 ? processes * dense_bf16_peak_flops(dev) : 0;
    char utilization[160] = "";
    if (peak > 0) {
        r.mfu = per_s / peak;
        std::snprintf(utilization, sizeof utilization, ", MFU %.1f%% of %d x %s's dense bf16 peak (%.0f TFLOP/s)",
                      100 * r.mfu, processes, cuda_device_name(dev).c_str(), peak / 1e12);
    }
    std::printf("[%-6s] model FLOPs per step %.4g (6 N + 12 L C T per token): %.3g TFLOP/s at the median step%s\n",
                policy_name(r.policy), r.model_flops_per_step, per_s / 1e12, utilization);
}
