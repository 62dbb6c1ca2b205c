// nn/gpt.h: a GPT-2 style pre-LN transformer (Radford et al. 2019), byte-level by default.
//
// Dimensions: B batch, T sequence length (<= block_size), C embedding width (n_embd),
// NH heads (n_head), hs = C / NH, L layers (n_layer), V vocabulary size.
//
//   x = drop(wte(idx) + wpe(0..T-1))                [B, T, C]
//   for each block: x = x + attn(ln_1(x))            pre-LN; the residual variable is reassigned
//                   x = x + mlp(ln_2(x))             so nothing but the norms can keep x alive
//   logits = lm_head(ln_f(x))                        [B, T, V]; lm_head is not tied to wte
// Dropout with probability config.dropout, where nanoGPT puts it: on the embeddings' sum (drop),
// on the attention probabilities, and after each residual projection (attn.c_proj, mlp.c_proj),
// in training mode only (Module::train / eval). Its masks are drawn again in backward, so it
// saves nothing (Note [Counter-based masks], core/philox.h).
//
// With SavePolicy::Output every norm saves its output, which the Linear after it saves anyway,
// so the (2L + 1) norm inputs are freed: see predicted_saving_bytes().
#pragma once

#include <memory>
#include <vector>

#include "nn/module.h"
#include "nn/norm.h"

namespace normtape {

struct GPTConfig {
    int64_t vocab_size = 256;  // bytes
    int64_t block_size = 64;   // longest sequence
    int64_t n_layer = 2;
    int64_t n_head = 4;
    int64_t n_embd = 128;
    NormKind norm = NormKind::Layer;
    SavePolicy policy = SavePolicy::Input;
    DType dtype = DType::F32;          // of parameters and activations (bf16: AdamW keeps f32 masters)
    Device device = Device::CPU;
    double norm_eps = 1e-5;
    // The MLP's gelu(h) [B, T, 4C], saved by its second Linear, is made again in backward from the
    // h that linear_gelu saves anyway (ops/matmul.h): 4 * B * T * C elements a layer fewer saved
    // (predicted_gelu_recompute_saving_bytes), for one GELU pass over them in backward.
    bool recompute_gelu = true;
    double dropout = 0.0;  // probability, in [0, 1)
    // Each block run through checkpoint() (core/activation_checkpoint.h): only the blocks' inputs
    // are saved, and each block's forward runs again in backward (predicted_checkpoint_saved_bytes).
    bool checkpoint_blocks = false;
    // forward() and loss() under SaveOnCpu (core/save_on_cpu.h): what they save goes to pinned host
    // memory, and comes back to the GPU in backward. Nothing changes for cpu tensors.
    bool offload = false;
};

// Throws, naming GPTConfig: ShapeError when a size is not positive or n_embd % n_head != 0,
// DTypeError for a non-floating dtype, Error for norm_eps <= 0 or not finite, or dropout outside [0, 1).
void check_config(const GPTConfig& config);

// c_attn: Linear(C, 3C) -> causal_self_attention (dropout attn_dropout on its probabilities) ->
// c_proj: Linear(C, C) -> resid_dropout.
class CausalSelfAttention : public Module {
public:
    explicit CausalSelfAttention(const GPTConfig& config);
    Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]

    std::shared_ptr<Linear> c_attn, c_proj;
    std::shared_ptr<Dropout> resid_dropout;
    int64_t n_head;
    double attn_dropout;  // applied in training mode only
};

// c_fc: Linear(C, 4C) -> gelu (tanh) -> c_proj: Linear(4C, C) -> dropout; the first two as one
// linear_gelu, whose output is made again in backward when recompute_gelu is set.
class MLP : public Module {
public:
    explicit MLP(const GPTConfig& config);
    Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]

    std::shared_ptr<Linear> c_fc, c_proj;
    std::shared_ptr<Dropout> dropout;
    bool recompute_gelu;
};

// Pre-LN block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class Block : public Module {
public:
    explicit Block(const GPTConfig& config);
    Tensor forward(Tensor x) const;  // [B, T, C] -> [B, T, C]

    std::shared_ptr<NormModule> ln_1, ln_2;
    std::shared_ptr<CausalSelfAttention> attn;
    std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
public:
    // Draws the initial weights from the generator that manual_seed seeds (the cpu's, or the
    // GPU's cuRAND generator when config.device is CUDA): N(0, 0.02) for embeddings and Linear
    // weights, N(0, 0.02 / sqrt(2L)) for the residual projections (attn.c_proj, mlp.c_proj), zeros
    // for biases, ones for norm weights (GPT-2). Throws as check_config, and DeviceError or
    // OutOfMemoryError when the parameters cannot be made on config.device.
    explicit GPT(const GPTConfig& config);

    // idx: [B, T] i64 token ids in [0, V), T <= block_size. Returns logits [B, T, V].
    // Throws, naming GPT (or the op that found it): ShapeError on idx not 2-D or T outside
    // [1, block_size]; DTypeError on idx not i64; DeviceError on idx on another device than the
    // model; Error on an undefined idx or an id out of range; AnomalyError under anomaly detection.
    Tensor forward(const Tensor& idx) const;
    // Mean cross-entropy of forward(idx) against targets [B, T] i64 (a 0-dim tensor, nats);
    // backward() from it accumulates (+=) into every parameter's grad. Throws as forward() and
    // cross_entropy() (targets of another shape or out of range).
    Tensor loss(const Tensor& idx, const Tensor& targets) const;

    // Sets the save policy of every norm (no parameter changes; set_save_policy, nn/norm.h).
    void set_policy(SavePolicy policy);
    // Set GPTConfig::checkpoint_blocks and offload from the next forward on.
    void set_checkpoint_blocks(bool on);
    void set_offload(bool on);

    const GPTConfig& config() const { return config_; }

    std::shared_ptr<Embedding> wte, wpe;
    std::shared_ptr<Dropout> drop;
    std::vector<std::shared_ptr<Block>> h;
    std::shared_ptr<NormModule> ln_f;
    std::shared_ptr<Linear> lm_head;

private:
    Tensor forward(const Tensor& idx, bool in_loss) const;  // in_loss: loss() opened the offload

    GPTConfig config_;
};

// The number of parameter elements GPT(config) has, without building it.
int64_t num_parameters(const GPTConfig& config);

// Bytes that SavePolicy::Output saves over SavePolicy::Input in saved_bytes() right after a
// forward of a [B, T] batch: the (2L + 1) norm inputs of B*T*C elements, plus, for LayerNorm,
// their (2L + 1) means of B*T elements (docs/DESIGN.md). Elements are of config.dtype; statistics
// of stat_dtype(config.dtype) (f32 for f32 and bf16, f64 for f64). Assumes no Output forward fell back to saving its input
// (every |norm weight| >= kOutputPolicyMinWeight; see output_policy_fallbacks()).
int64_t predicted_saving_bytes(const GPTConfig& config, int64_t B, int64_t T);

// saved_bytes() right after GPT::loss on a [B, T] batch with checkpoint_blocks set (and
// offload off), in bytes: the L blocks' inputs (B*T*C elements each), and what the ops
// outside the blocks save: wte's ids and the targets (B*T i64 each); ln_f's x, y or x_hat (with
// the y that lm_head saves under Input) and its statistics (B*T each: rstd, and mean under Input
// for LayerNorm); the logits (B*T*V) and their log-sum-exp (B*T) (docs/DESIGN.md).
// Elements of config.dtype, statistics of stat_dtype(config.dtype). Assumes no Output forward fell
// back to saving its input (output_policy_fallbacks()).
int64_t predicted_checkpoint_saved_bytes(const GPTConfig& config, int64_t B, int64_t T);

// Bytes that GPTConfig::recompute_gelu saves in saved_bytes() right after a forward of a [B, T]
// batch, whatever the norm policy: each layer's gelu(h), L * 4 * B*T*C elements of config.dtype
// (docs/DESIGN.md, Note [Rematerialization]). The same bytes leave the allocator's peak.
int64_t predicted_gelu_recompute_saving_bytes(const GPTConfig& config, int64_t B, int64_t T);

}  // namespace normtape
