// nn/model/gpt.cpp: the GPT modules and the memory they save. Not here: GPTConfig, its presets and checks
// (nn/model/gpt_config.cpp).
#include "nn/model/gpt.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/activation_checkpoint.h"
#include "core/save_on_cpu.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/linear_cross_entropy.h"
#include "ops/matmul.h"
#include "ops/rotary.h"

namespace normtape {

namespace {
NormOptions norm_options(const GPTConfig& c) {
    NormOptions o;
    o.eps = c.norm_eps;
    o.policy = c.policy;
    o.dtype = c.dtype;
    o.device = c.device;
    o.elementwise_affine = c.norm_affine;
    return o;
}
TensorOptions param_options(const GPTConfig& c) { return TensorOptions().dtype(c.dtype).device(c.device); }
double residual_std(const GPTConfig& c) {
    return c.zero_init_proj ? 0.0 : 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
}
std::shared_ptr<Linear> linear_module(const GPTConfig& c, int64_t in, int64_t out, double init_std = 0.02) {
    return std::make_shared<Linear>(in, out, c.bias, param_options(c), init_std);
}

// Rows [position, position + n) of a cache [B, block_size, ...] get `rows` [B, n, ...]; returns
// its rows [0, position + n). copy_ writes contiguous destinations only, so each batch element's
// rows are written as one contiguous view.
Tensor append_rows(Tensor& cache, const Tensor& rows, int64_t position) {
    const int64_t B = cache.size(0), n = rows.size(1), width = cache.numel() / (B * cache.size(1));
    for (int64_t b = 0; b < B; ++b) {
        Tensor dst = cache.narrow(0, b, 1).reshape({cache.size(1), width}).narrow(0, position, n);
        dst.copy_(rows.narrow(0, b, 1).reshape({n, width}));
    }
    return cache.narrow(1, 0, position + n);
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c)
    : n_head(c.n_head), n_kv_head(c.kv_heads()), rotary(c.pos_embedding == PosEmbedding::Rotary),
      rope_theta(c.rope_theta), attn_dropout(c.dropout) {
    const int64_t C = c.n_embd, hs = C / c.n_head;
    if (c.separate_qkv()) {
        c_q = register_module("c_q", linear_module(c, C, n_head * hs));
        c_k = register_module("c_k", linear_module(c, C, n_kv_head * hs));
        c_v = register_module("c_v", linear_module(c, C, n_kv_head * hs));
        if (c.qk_norm) {
            q_norm = register_module("q_norm", make_norm(NormKind::RMS, hs, norm_options(c)));
            k_norm = register_module("k_norm", make_norm(NormKind::RMS, hs, norm_options(c)));
        }
    } else {
        c_attn = register_module("c_attn", linear_module(c, C, 3 * C));
    }
    c_proj = register_module("c_proj", linear_module(c, C, C, residual_std(c)));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x, int64_t position, KVLayer* cache) const {
    ModuleScope scope(*this);
    const int64_t B = x.size(0), n = x.size(1), C = x.size(2), hs = C / n_head;
    const double p = is_training() ? attn_dropout : 0.0;
    Tensor y;
    if (c_attn) {
        Tensor qkv = c_attn->forward(x);  // [B, n, 3C]
        y = cache ? causal_self_attention_rows(append_rows(cache->qkv, qkv, position), n_head, position)
                  : causal_self_attention(qkv, n_head, p);
    } else {
        Tensor q = c_q->forward(x).view({B, n, n_head, hs});
        Tensor k = c_k->forward(x).view({B, n, n_kv_head, hs});
        Tensor v = c_v->forward(x).view({B, n, n_kv_head, hs});
        if (rotary) {  // a rotation: saves nothing
            q = rotary_embedding(q, position, rope_theta);
            k = rotary_embedding(k, position, rope_theta);
        }
        if (q_norm) {  // after the rotation, as nanochat
            q = q_norm->forward(q);
            k = k_norm->forward(k);
        }
        y = cache ? causal_attention_rows(q, append_rows(cache->k, k, position), append_rows(cache->v, v, position))
                  : causal_attention(q, k, v, p);
        y = y.view({B, n, C});
    }
    return resid_dropout->forward(c_proj->forward(y));
}

MLP::MLP(const GPTConfig& c) : kind(c.mlp), recompute_activation(c.recompute_activation) {
    const int64_t H = c.hidden();
    c_fc = register_module("c_fc", linear_module(c, c.n_embd, kind == MLPKind::SwiGLU ? 2 * H : H));
    c_proj = register_module("c_proj", linear_module(c, H, c.n_embd, residual_std(c)));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

// GELU: the hidden layer in one op: on CUDA its bias (and GELU, unless made again) ride in the
// product's epilogue.
Tensor MLP::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    Tensor hidden;
    if (kind == MLPKind::GELU) {
        ModuleScope c_fc_scope(*c_fc);  // c_fc's weights, in one op with the GELU after it
        hidden = linear_gelu(x, c_fc->weight, c_fc->bias, recompute_activation);
    } else if (kind == MLPKind::ReLU2) {
        hidden = relu_squared(c_fc->forward(x), recompute_activation);
    } else {
        hidden = swiglu(c_fc->forward(x), recompute_activation);
    }
    return dropout->forward(c_proj->forward(hidden));
}

Block::Block(const GPTConfig& c) {
    ln_1 = register_module("ln_1", make_norm(c.norm, c.n_embd, norm_options(c)));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    ln_2 = register_module("ln_2", make_norm(c.norm, c.n_embd, norm_options(c)));
    mlp = register_module("mlp", std::make_shared<MLP>(c));
}

Tensor Block::forward(Tensor x, int64_t position, KVLayer* cache) const {
    ResidualStream out = forward(ResidualStream{std::move(x), Tensor()}, position, cache);
    ModuleScope scope(*this);
    return add(out.stream, out.branch);
}

ResidualStream Block::forward(ResidualStream x, int64_t position, KVLayer* cache) const {
    ModuleScope scope(*this);
    // Each residual add is the kernel of the norm after it (Note [The fused norm]): ln_1 makes
    // s = stream + branch and ln_1(s), ln_2 s + attn(...) and ln_2 of it. A handle is dropped as soon
    // as it is used, so that nothing but the nodes keeps the residual alive (Note [Why saving y
    // saves memory]).
    FusedNormOutputs n1 = x.branch.defined() ? ln_1->forward(x.branch, x.stream)
                                             : FusedNormOutputs{ln_1->forward(x.stream), x.stream, Tensor()};
    x = ResidualStream{};
    Tensor a = attn->forward(n1.y, position, cache);
    n1.y = Tensor();
    FusedNormOutputs n2 = ln_2->forward(a, n1.residual_out);
    a = Tensor();
    n1.residual_out = Tensor();
    Tensor m = mlp->forward(n2.y);
    return {std::move(n2.residual_out), std::move(m)};
}

GPT::GPT(const GPTConfig& c) : config_(c) {
    check_config(c);
    wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, param_options(c)));
    if (c.pos_embedding == PosEmbedding::Learned)
        wpe = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, param_options(c)));
    drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
    if (c.embedding_norm) emb_norm = register_module("emb_norm", make_norm(c.norm, c.n_embd, norm_options(c)));
    for (int64_t i = 0; i < c.n_layer; ++i) h.push_back(register_module("h." + std::to_string(i), std::make_shared<Block>(c)));
    ln_f = register_module("ln_f", make_norm(c.norm, c.n_embd, norm_options(c)));
    lm_head = register_module("lm_head", c.tie_embeddings ? std::make_shared<Linear>(wte->weight)
                                                          : std::make_shared<Linear>(c.n_embd, c.vocab_size, false,
                                                                                     param_options(c)));
}

Tensor GPT::embed(const Tensor& idx, int64_t position) const {
    const int64_t n = idx.size(1);
    // The positions are wpe's rows: a view, whose backward saves nothing (an embedding lookup
    // would save n ids, the one saved tensor not linear in B * T).
    Tensor x = wte->forward(idx);
    if (wpe) x = add(x, wpe->weight.narrow(0, position, n));
    x = drop->forward(x);
    return emb_norm ? emb_norm->forward(x) : x;
}

Tensor GPT::head(const Tensor& x) const { return lm_head->forward(ln_f->forward(x)); }

Tensor GPT::final_norm(ResidualStream x) const {
    Tensor y = x.branch.defined() ? ln_f->forward(x.branch, x.stream).y : ln_f->forward(x.stream);
    x = ResidualStream{};  // a parameter lives to the end of the caller's expression: drop its handles now
    return y;
}

ResidualStream GPT::blocks(const Tensor& idx) const {
    NT_CHECK(idx.defined(), "GPT: expected idx of shape [B, T] i64, got an undefined tensor");
    NT_CHECK_AS(DTypeError, idx.dtype() == DType::I64, "GPT: expected idx of shape [B, T] i64, got ",
                shape_str(idx.shape()), " ", dtype_name(idx.dtype()));
    NT_CHECK_AS(ShapeError, idx.dim() == 2, "GPT: expected idx of shape [B, T] i64, got ", shape_str(idx.shape()), " ",
                dtype_name(idx.dtype()));
    int64_t T = idx.size(1);
    NT_CHECK_AS(ShapeError, T >= 1 && T <= config_.block_size, "GPT: expected a sequence length in [1, block_size = ",
                config_.block_size, "], got ", T);
    ModuleScope scope(*this);
    ResidualStream x{embed(idx), Tensor()};
    // Moving the residual into each block leaves the block the only handle, so the block's input
    // is freed as soon as the block's first norm has consumed it (Note [Why saving y saves memory]).
    for (size_t i = 0; i < h.size(); ++i) {
        const Block* b = h[i].get();
        // Note [Activation checkpointing]: a checkpointed block saves x only (the stream and branch
        // added first); every checkpoint_every-th is.
        if (config_.checkpoint_blocks && static_cast<int64_t>(i) % config_.checkpoint_every == 0) {
            ModuleScope block_scope(*b);
            Tensor in = x.branch.defined() ? add(x.stream, x.branch) : x.stream;
            x = ResidualStream{};
            x.stream = checkpoint([b](const Tensor& t) { return b->forward(t); }, in);
        } else {
            x = b->forward(std::move(x));
        }
    }
    return x;
}

Tensor GPT::forward(const Tensor& idx) const {
    std::optional<SaveOnCpu> offload;  // Note [SaveOnCpu]: over the whole forward, so prefetching crosses layers
    if (config_.offload) offload.emplace();
    return lm_head->forward(final_norm(blocks(idx)));
}

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) const {
    std::optional<SaveOnCpu> offload;  // the loss too: the logits are the largest tensor saved outside the blocks
    if (config_.offload) offload.emplace();
    // The last block's output is a temporary of the first statement below: it is freed before the
    // loss runs (under Output and Normalized nothing saves it).
    if (!config_.fused_head_loss) {
        Tensor logits = lm_head->forward(final_norm(blocks(idx)));
        return cross_entropy(logits, targets, config_.logit_softcap);
    }
    Tensor x = final_norm(blocks(idx));  // lm_head's input, which the loss saves
    ModuleScope scope(*lm_head);  // lm_head's product runs inside the loss, chunk by chunk
    LinearCrossEntropyOptions options;
    options.softcap = config_.logit_softcap;
    options.ignore_index = -1;  // no target is negative: every position counts
    return linear_cross_entropy(x, lm_head->weight, targets, options);
}

void GPT::set_policy(SavePolicy policy) {
    config_.policy = policy;
    set_save_policy(*this, policy);
}

void GPT::set_checkpoint_blocks(bool on) { config_.checkpoint_blocks = on; }
void GPT::set_offload(bool on) { config_.offload = on; }

namespace {
// The bytes a norm of width N over E rows saves (predicted_saved_bytes): under Input its x and the
// y that the op after it saves, under Output and Normalized one of them; rstd, and mean for a
// LayerNorm under Input.
int64_t norm_saved_bytes(const GPTConfig& c, NormKind kind, int64_t E, int64_t N) {
    const int64_t es = static_cast<int64_t>(element_size(c.dtype)), ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const bool input = c.policy == SavePolicy::Input;
    const int64_t stats = (input && kind == NormKind::Layer ? 2 : 1) * E * ss;
    return (input ? 2 : 1) * E * N * es + stats;
}

// The bytes the loss saves over E positions besides its input: the logits (E V; none with the
// fused head loss), their log-sum-exp (E) and the targets (E ids).
int64_t loss_saved_bytes(const GPTConfig& c, int64_t E) {
    const int64_t es = static_cast<int64_t>(element_size(c.dtype)), ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const int64_t logits = c.fused_head_loss ? 0 : E * c.vocab_size * es;
    return logits + E * ss + E * static_cast<int64_t>(element_size(DType::I64));
}
}  // namespace

int64_t detail::layer_saved_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    const int64_t es = static_cast<int64_t>(element_size(c.dtype)), ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const int64_t E = B * T, C = c.n_embd, NH = c.n_head, NKV = c.kv_heads(), hs = C / NH, H = c.hidden();
    int64_t attention = 0;  // q, k, v as attention saves them
    if (!c.separate_qkv()) {
        attention = 3 * E * C * es;
    } else if (c.qk_norm) {
        attention = norm_saved_bytes(c, NormKind::RMS, E * NH, hs) + norm_saved_bytes(c, NormKind::RMS, E * NKV, hs) +
                    E * NKV * hs * es;
    } else {
        attention = E * (NH + 2 * NKV) * hs * es;
    }
    attention += E * C * es + B * NH * T * ss;  // out (c_proj saves it too), lse
    const int64_t mlp = (c.mlp == MLPKind::SwiGLU ? 2 : 1) * E * H * es + (c.recompute_activation ? 0 : E * H * es);
    return 2 * norm_saved_bytes(c, c.norm, E, C) + attention + mlp;
}

int64_t predicted_saved_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_saved_bytes", c, B, T);
    const int64_t es = static_cast<int64_t>(element_size(c.dtype)), ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const int64_t E = B * T, C = c.n_embd;
    const int64_t ids = E * static_cast<int64_t>(element_size(DType::I64));
    // emb_norm: E C and its statistics under every policy (its input under Input, else its output).
    const int64_t emb_norm =
        c.embedding_norm ? E * C * es + (c.policy == SavePolicy::Input && c.norm == NormKind::Layer ? 2 : 1) * E * ss : 0;
    const int64_t loss = loss_saved_bytes(c, E);
    return ids + emb_norm + c.n_layer * detail::layer_saved_bytes(c, B, T) + norm_saved_bytes(c, c.norm, E, C) + loss;
}

int64_t predicted_saving_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_saving_bytes", c, B, T);
    GPTConfig input = c, output = c;
    input.policy = SavePolicy::Input;
    output.policy = SavePolicy::Output;
    return predicted_saved_bytes(input, B, T) - predicted_saved_bytes(output, B, T);
}

int64_t predicted_checkpoint_saved_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_checkpoint_saved_bytes", c, B, T);
    const int64_t es = static_cast<int64_t>(element_size(c.dtype));
    const int64_t ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const int64_t ids = B * T * static_cast<int64_t>(element_size(DType::I64));
    const int64_t x = B * T * c.n_embd * es;
    const bool input = c.policy == SavePolicy::Input;
    const int64_t stats = c.norm == NormKind::Layer && input ? 2 * B * T * ss : B * T * ss;
    // ln_f saves x (Input), y or x_hat, which lm_head saves too (y, or x_hat through y's recipe);
    // under Input lm_head saves y as well.
    const int64_t ln_f = (input ? 2 : 1) * x + stats;
    // emb_norm's output is the first block's input: under Input its input is saved besides.
    const int64_t emb_norm = c.embedding_norm ? (input ? x : 0) + stats : 0;
    const int64_t loss = loss_saved_bytes(c, B * T);
    return c.n_layer * x + ids + emb_norm + ln_f + loss;  // block inputs, wte's ids, the norms, the loss
}

int64_t predicted_recompute_saving_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    detail::check_step_shape("predicted_recompute_saving_bytes", c, B, T);
    return c.n_layer * B * T * c.hidden() * static_cast<int64_t>(element_size(c.dtype));
}

}  // namespace normtape
