// examples/train_gpt/run_config.cpp: the flags as the library's objects (run_config.h).
#include "run_config.h"

#include <algorithm>

using namespace normtape;

Device device_of(const Args& a) { return a.device == "cuda" ? Device::cuda(a.device_index) : Device::CPU; }
DType dtype_of(const Args& a) { return a.dtype == "bf16" ? DType::BF16 : DType::F32; }

GPTConfig make_config(const Args& a, SavePolicy policy) {
    GPTConfig c = gpt_config(a.arch);
    c.n_kv_head = a.kv_heads;
    c.tie_embeddings = a.tie == "on";
    c.vocab_size = a.vocab;
    c.block_size = a.seq;
    c.n_layer = a.layers;
    c.n_head = a.heads;
    c.n_embd = a.embd;
    c.norm = a.norm == "layer" ? NormKind::Layer : NormKind::RMS;
    c.policy = policy;
    c.recompute_activation = a.recompute_activation == "on";
    c.dropout = a.dropout;
    c.dtype = dtype_of(a);
    c.device = device_of(a);
    c.offload = a.offload == "on";
    c.checkpoint_blocks = a.checkpoint == "blocks";
    c.checkpoint_every = a.checkpoint_every;
    c.fused_head_loss = a.fused_loss == "on";
    return c;
}

bool recompute_saving_measured(const Args& a) { return a.recompute_activation == "on" && a.checkpoint != "blocks"; }

WarmupCosineLR lr_schedule(const Args& a) {
    const int64_t warmup = warmup_steps(a);
    return WarmupCosineLR(a.lr, warmup, std::max(a.steps, warmup + 1), min_lr(a));
}

MemorySettings settings_of(const Args& a, SavePolicy policy) {
    MemorySettings s;
    s.policy = policy;
    s.recompute_activation = a.recompute_activation == "on";
    s.fused_head_loss = a.fused_loss == "on";
    s.checkpoint_every = a.checkpoint == "blocks" ? a.checkpoint_every : 0;
    s.offload = a.offload == "on";
    s.micro_batch = micro_batch(a);
    s.optimizer = a.optimizer == "muon" ? StepOptimizer::Muon : StepOptimizer::AdamW;
    s.world_size = a.world_size;
    s.rank = a.rank;
    s.shard_optimizer_state = a.shard_optimizer == "on";
    return s;
}
void set_settings(Args& a, const MemorySettings& s) {
    a.policy = policy_name(s.policy);
    a.recompute_activation = s.recompute_activation ? "on" : "off";
    a.fused_loss = s.fused_head_loss ? "on" : "off";
    a.checkpoint = s.checkpoint_every > 0 ? "blocks" : "none";
    a.checkpoint_every = std::max<int64_t>(s.checkpoint_every, 1);
    a.offload = s.offload ? "on" : "off";
    a.micro_batch = s.micro_batch;
}
