// nn/model/gpt.h: a pre-norm decoder-only transformer: GPT-2's block (Radford et al. 2019), and the
// block people train today (nanochat, Llama) chosen by GPTConfig and its presets (gpt_config).
//
// Dimensions: B batch, T sequence length (<= block_size), C embedding width (n_embd),
// NH heads (n_head), NKV key/value heads (n_kv_head, dividing NH), hs = C / NH, L layers
// (n_layer), V vocabulary size, H the MLP's hidden width (mlp_hidden).
//
//   x = drop(wte(idx) [+ wpe(0..T-1)])               [B, T, C]; wpe with learned positions only
//   [x = emb_norm(x)]                                 embedding_norm (nanochat)
//   for each block: x = x + attn(ln_1(x))            pre-norm; the residual variable is reassigned
//                   x = x + mlp(ln_2(x))             so nothing but the norms can keep x alive; each
//                                                    add is the next norm's (the fused norm)
//   logits = lm_head(ln_f(x))                        [B, T, V]; lm_head's weight is wte's when tied
// The attention: GPT-2's packed c_attn (Linear(C, 3C)) when positions are learned, there is no
// QK-norm and NKV == NH; otherwise c_q, c_k, c_v (Linear(C, NH hs), Linear(C, NKV hs) twice), the
// rotary embedding on q and k, then QK-norm (an RMSNorm over each head's hs values, after the
// rotation, as nanochat), then grouped-query attention; c_proj after either. The MLP: c_fc,
// then GELU (tanh), ReLU^2 or SwiGLU (c_fc then makes [gate | up], 2H wide), then c_proj.
// Dropout with probability config.dropout where nanoGPT puts it: on the embeddings' sum (drop),
// on the attention probabilities, and after each residual projection, in training mode only
// (Module::train / eval). Its masks are drawn again in backward: it saves nothing.
//
// With SavePolicy::Output every norm saves its output, which the op after it saves anyway, so the
// norm inputs are freed (the residual at each ln_1, ln_2 and ln_f, the embedding at emb_norm, the
// rotated q and k at QK-norm): predicted_saved_bytes() counts each tensor saved, to the byte.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/model/module.h"
#include "nn/model/norm.h"

namespace normtape {

enum class PosEmbedding { Learned, Rotary };
enum class MLPKind { GELU, ReLU2, SwiGLU };
// "learned", "rotary"; "gelu", "relu2", "swiglu".
const char* pos_embedding_name(PosEmbedding p);
const char* mlp_kind_name(MLPKind m);

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
    // The MLP's activation output [B, T, H], saved by its second Linear, is made again in backward
    // from the first Linear's output that the activation saves anyway (ops/matmul.h linear_gelu,
    // ops/activation.h): L * B*T*H elements a model fewer saved, for one activation pass in backward.
    bool recompute_activation = true;
    double dropout = 0.0;  // probability, in [0, 1)
    // Each block run through checkpoint() (core/activation_checkpoint.h): only the blocks' inputs
    // are saved, and each block's forward runs again in backward (predicted_checkpoint_saved_bytes).
    bool checkpoint_blocks = false;
    // With checkpoint_blocks, block i (from 0) is checkpointed where i % checkpoint_every == 0: 1
    // every block; k blocks 0, k, 2k, ... (ceil(L / k) of them). The others save as without
    // checkpointing: memory traded for time block by block (nn/memory/memory_plan.h). At least 1.
    int64_t checkpoint_every = 1;
    // forward() and loss() under SaveOnCpu (core/save_on_cpu.h): what they save goes to pinned host
    // memory, and comes back to the GPU in backward. Nothing changes for cpu tensors.
    bool offload = false;
    // loss() runs lm_head and the cross-entropy as one linear_cross_entropy (ops/linear_cross_entropy.h):
    // the [B, T, V] logits are never stored, only their log-sum-exp per position, and backward makes
    // them again chunk by chunk (one more product of lm_head's size). forward() is unchanged.
    bool fused_head_loss = false;

    // The architecture (gpt_config names the usual sets). GPT-2: every default below.
    PosEmbedding pos_embedding = PosEmbedding::Learned;  // wpe, or rotary on q and k (Su et al. 2021)
    double rope_theta = 10000.0;                         // the rotary embedding's base
    bool qk_norm = false;          // RMSNorm over each head's q and k after the rotation (nanochat)
    bool norm_affine = true;       // norm weights (and LayerNorm biases); off: weightless norms
    MLPKind mlp = MLPKind::GELU;
    int64_t mlp_hidden = 0;        // H; 0: 4C (GELU, ReLU^2) or 8C/3 rounded up to a multiple of 64 (SwiGLU)
    bool bias = true;              // biases in every Linear but lm_head (GELU needs them: linear_gelu)
    int64_t n_kv_head = 0;         // NKV, dividing n_head; 0: n_head
    bool tie_embeddings = false;   // lm_head.weight is wte.weight (one tensor, stored once)
    double logit_softcap = 0.0;    // > 0: loss() uses softcap * tanh(logits / softcap) (nanochat: 15)
    bool embedding_norm = false;   // a norm right after the embedding (nanochat)
    bool zero_init_proj = false;   // attn.c_proj and mlp.c_proj start at zero (nanochat)

    int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    int64_t hidden() const;  // H, mlp_hidden resolved
    // True where the attention uses c_q, c_k, c_v (see above) instead of GPT-2's packed c_attn.
    bool separate_qkv() const {
        return pos_embedding == PosEmbedding::Rotary || qk_norm || kv_heads() != n_head;
    }
};

// The named architectures, as train_gpt --arch takes them, with GPTConfig's default sizes:
//   "gpt2"      GPT-2: learned positions, LayerNorm with weights and biases, GELU, biases, tied
//               nothing (every default above).
//   "nanochat"  karpathy/nanochat's GPT: rotary (theta 10000), QK-norm, weightless RMSNorm after
//               the embedding and at every block input, ReLU^2, no biases, untied lm_head, logit
//               softcap 15, zero-initialized c_proj.
//   "llama"     Hugging Face's LlamaForCausalLM: rotary (theta 10000), RMSNorm with weights,
//               SwiGLU, no biases, untied lm_head (n_kv_head: set it for grouped-query attention).
// Throws Error naming gpt_config and the three names for any other name.
GPTConfig gpt_config(const std::string& arch);
// The preset whose architecture config has ("gpt2", "nanochat", "llama"), or "custom": the fields
// that change what the model computes (positions, QK-norm, norm kind and weights, MLP, biases,
// softcap, embedding norm), not the sizes, n_kv_head, mlp_hidden, tie_embeddings or the init.
std::string arch_name(const GPTConfig& config);

// Throws, naming GPTConfig: ShapeError when a size is not positive, n_embd % n_head != 0,
// n_kv_head does not divide n_head, mlp_hidden < 0, rotary positions meet an odd head size,
// checkpoint_every < 1, or the model would have more than 2^54 parameters (so that no count of its
// bytes, gradients and optimizer state can overflow int64);
// DTypeError for a non-floating dtype; Error for norm_eps <= 0 or not finite, dropout outside
// [0, 1), rope_theta <= 0, logit_softcap < 0 (or either not finite), or GELU without bias.
void check_config(const GPTConfig& config);

// One layer's key/value cache for generation (nn/model/generate.h, Note [The key/value cache]): GPT-2's
// packed qkv rows [B, block_size, 3C], or the k and v that attention reads (rotated, and
// normalized under QK-norm) [B, block_size, NKV, hs] each; the other fields undefined.
struct KVLayer {
    Tensor qkv, k, v;
};

// c_attn (or c_q, c_k, c_v, the rotary embedding and QK-norm: see above) -> attention (dropout
// attn_dropout on its probabilities) -> c_proj: Linear(C, C) -> resid_dropout.
class CausalSelfAttention : public Module {
public:
    explicit CausalSelfAttention(const GPTConfig& config);
    // x: [B, n, C] of the positions position .. position + n - 1 -> [B, n, C]. Without a cache
    // position must be 0 (a training forward, over the whole sequence); with one (under NoGradGuard)
    // the new positions' rows are written into it and attend to its rows 0 .. position + n - 1.
    Tensor forward(const Tensor& x, int64_t position = 0, KVLayer* cache = nullptr) const;

    std::shared_ptr<Linear> c_attn, c_q, c_k, c_v, c_proj;  // c_attn, or c_q, c_k and c_v
    std::shared_ptr<NormModule> q_norm, k_norm;             // under QK-norm
    std::shared_ptr<Dropout> resid_dropout;
    int64_t n_head, n_kv_head;
    bool rotary;
    double rope_theta;
    double attn_dropout;  // applied in training mode only
};

// c_fc: Linear(C, H) (SwiGLU: Linear(C, 2H), [gate | up]) -> GELU (tanh), ReLU^2 or SwiGLU ->
// c_proj: Linear(H, C) -> dropout. GELU runs with c_fc as one linear_gelu (ops/matmul.h), the
// others as ops of their own (ops/activation.h); the activation's output is made again in
// backward when recompute_activation is set.
class MLP : public Module {
public:
    explicit MLP(const GPTConfig& config);
    Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]

    std::shared_ptr<Linear> c_fc, c_proj;
    std::shared_ptr<Dropout> dropout;
    MLPKind kind;
    bool recompute_activation;
};

// The residual stream between blocks, x = stream + branch: branch is the last block's MLP output,
// left for the next norm to add in its own kernel (undefined: x is stream itself).
struct ResidualStream {
    Tensor stream, branch;  // [B, n, C] each
};

// Pre-norm block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), each add made by the norm after it
// (NormModule::forward(x, residual), Note [The fused norm]).
class Block : public Module {
public:
    explicit Block(const GPTConfig& config);
    // [B, n, C] -> [B, n, C]; position and cache as CausalSelfAttention::forward.
    Tensor forward(Tensor x, int64_t position = 0, KVLayer* cache = nullptr) const;
    // The same on the stream between blocks: ln_1 adds x.branch to x.stream, ln_2 the attention's
    // output; returns the sum after the attention as stream and the MLP's output as branch.
    ResidualStream forward(ResidualStream x, int64_t position = 0, KVLayer* cache = nullptr) const;

    std::shared_ptr<NormModule> ln_1, ln_2;
    std::shared_ptr<CausalSelfAttention> attn;
    std::shared_ptr<MLP> mlp;
};

class GPT : public Module {
public:
    // Draws the initial weights from the generator that manual_seed seeds (the cpu's, or the
    // GPU's cuRAND generator when config.device is CUDA): N(0, 0.02) for embeddings and Linear
    // weights, N(0, 0.02 / sqrt(2L)) for the residual projections (attn.c_proj, mlp.c_proj; zeros
    // with zero_init_proj), zeros for biases, ones for norm weights (GPT-2). With tie_embeddings
    // lm_head's weight is wte's table. Throws as check_config, and DeviceError or OutOfMemoryError
    // when the parameters cannot be made on config.device.
    explicit GPT(const GPTConfig& config);

    // idx: [B, T] i64 token ids in [0, V), T <= block_size. Returns logits [B, T, V], before any
    // logit softcap (loss() applies it; so does generate()'s sampling).
    // Throws, naming GPT (or the op that found it): ShapeError on idx not 2-D or T outside
    // [1, block_size]; DTypeError on idx not i64; DeviceError on idx on another device than the
    // model; Error on an undefined idx or an id out of range; AnomalyError under anomaly detection.
    Tensor forward(const Tensor& idx) const;
    // Mean cross-entropy of the (softcapped, with logit_softcap) logits of idx against targets
    // [B, T] i64 (a 0-dim tensor, nats); backward() from it accumulates (+=) into every
    // parameter's grad. With fused_head_loss lm_head and the loss run as one
    // linear_cross_entropy, which never stores the logits (the same value and gradients, to
    // rounding). Throws as forward() and cross_entropy() or linear_cross_entropy() (targets of
    // another shape or out of range).
    Tensor loss(const Tensor& idx, const Tensor& targets) const;

    // The steps of forward(), for the cached forward of generation (nn/model/generate.h), which runs
    // the blocks itself: the embedding of idx [B, n] at positions position .. position + n - 1
    // (wte, wpe's rows, dropout, emb_norm) -> [B, n, C]; ln_f and lm_head -> [B, n, V].
    Tensor embed(const Tensor& idx, int64_t position = 0) const;
    Tensor head(const Tensor& x) const;

    // Sets the save policy of every norm (no parameter changes; set_save_policy, nn/model/norm.h).
    void set_policy(SavePolicy policy);
    // Set GPTConfig::checkpoint_blocks and offload from the next forward on.
    void set_checkpoint_blocks(bool on);
    void set_offload(bool on);

    const GPTConfig& config() const { return config_; }

    std::shared_ptr<Embedding> wte, wpe;  // wpe with learned positions only
    std::shared_ptr<Dropout> drop;
    std::shared_ptr<NormModule> emb_norm;  // with embedding_norm only
    std::vector<std::shared_ptr<Block>> h;
    std::shared_ptr<NormModule> ln_f;
    std::shared_ptr<Linear> lm_head;

private:
    // The checks of idx, embed and the blocks: [B, T] -> the stream before ln_f.
    ResidualStream blocks(const Tensor& idx) const;
    // ln_f of the stream, adding its branch in ln_f's kernel.
    Tensor final_norm(ResidualStream x) const;

    GPTConfig config_;
};

// The number of parameter elements GPT(config) has, without building it. Throws as check_config.
int64_t num_parameters(const GPTConfig& config);

namespace detail {
// The checks every prediction of a training step of `config` on a [B, T] batch makes (the
// formulas below, predict_peak and the planner, nn/memory/memory_plan.h and nn/memory/memory_budget.h), naming
// `op`: check_config's, then ShapeError for B < 1, T outside [1, block_size], or a step whose
// activations (B * T positions, each of about 8 bytes times n_layer * (8 n_embd + 4 mlp hidden +
// 2 n_head) + 4 vocab_size elements) would pass 2^58 bytes, naming B, T and the product, so that
// no byte count of the step overflows int64.
void check_step_shape(const char* op, const GPTConfig& config, int64_t B, int64_t T);
// What one block adds to predicted_saved_bytes (the formula is linear in n_layer), for a config
// and sizes check_step_shape has passed; checks nothing.
int64_t layer_saved_bytes(const GPTConfig& config, int64_t B, int64_t T);
}  // namespace detail

// saved_bytes() right after GPT::loss on a [B, T] batch (checkpoint_blocks and offload off), in
// bytes: every tensor the graph saves, each storage once (docs/DESIGN.md, "What each policy saves
// in a decoder"). With E = B*T positions, elements of config.dtype, statistics (rstd, mean, lse)
// of stat_dtype(config.dtype), ids of i64:
//   a norm of width N over E rows: under Input its x and the y that the op after it saves
//     (2 E N) and rstd (+ mean for LayerNorm); under Output and Normalized y (or x_hat) and rstd;
//   per layer: ln_1, the attention's inputs (packed qkv: 3 E C; else q and k, E NH hs and
//     E NKV hs, each through its QK-norm as a norm of width hs over E NH (E NKV) rows, and v,
//     E NKV hs), its output (E C, which c_proj saves too) and lse (B NH T); ln_2; the MLP's c_fc
//     output (E H, SwiGLU 2 E H) and, without recompute_activation, the activation (E H);
//   outside the blocks: wte's ids (E), emb_norm (E C and its statistics under every policy: under
//     Input its input, otherwise its output, which ln_1 of the first block saves under Input),
//     ln_f (as a norm of width C), the logits (E V; none with fused_head_loss), their lse (E) and
//     the targets (E).
// Assumes no Output forward fell back to saving its input (every |norm weight| >=
// kOutputPolicyMinWeight; see output_policy_fallbacks()). Throws as detail::check_step_shape,
// naming predicted_saved_bytes (and so do the three formulas below, each naming itself).
int64_t predicted_saved_bytes(const GPTConfig& config, int64_t B, int64_t T);

// Bytes that SavePolicy::Output saves over SavePolicy::Input in saved_bytes() right after a
// forward of a [B, T] batch: predicted_saved_bytes under Input less under Output. The norm inputs
// freed: the (2L + 1) residuals of B*T*C elements (ln_1, ln_2, ln_f), the rotated q and k under
// QK-norm (L * B*T*(NH + NKV)*hs), plus, for LayerNorm, the norms' means (B*T each).
int64_t predicted_saving_bytes(const GPTConfig& config, int64_t B, int64_t T);

// saved_bytes() right after GPT::loss on a [B, T] batch with checkpoint_blocks set, every block
// checkpointed (checkpoint_every 1; any k: predicted_checkpoint_every_saved_bytes, nn/memory/memory_plan.h),
// and offload off, in bytes: the L blocks' inputs (B*T*C elements each), and what the ops
// outside the blocks save: wte's ids and the targets (B*T i64 each); emb_norm's input under Input
// (its output is the first block's input) and its statistics; ln_f's x, y or x_hat (with
// the y that lm_head saves under Input) and its statistics (B*T each: rstd, and mean under Input
// for LayerNorm); the logits (B*T*V; none with fused_head_loss) and their log-sum-exp (B*T)
// (docs/DESIGN.md).
// Elements of config.dtype, statistics of stat_dtype(config.dtype). Assumes no Output forward fell
// back to saving its input (output_policy_fallbacks()).
int64_t predicted_checkpoint_saved_bytes(const GPTConfig& config, int64_t B, int64_t T);

// Bytes that GPTConfig::recompute_activation saves in saved_bytes() right after a forward of a
// [B, T] batch, whatever the norm policy: each layer's activation output (GELU, ReLU^2 or
// SwiGLU), L * B*T*H elements of config.dtype (docs/DESIGN.md, Note [Rematerialization]). The
// same bytes leave the allocator's peak.
int64_t predicted_recompute_saving_bytes(const GPTConfig& config, int64_t B, int64_t T);

}  // namespace normtape
