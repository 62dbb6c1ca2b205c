// nn/gpt.cpp: the GPT modules.
#include "nn/gpt.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/activation_checkpoint.h"
#include "core/save_on_cpu.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace normtape {

void check_config(const GPTConfig& c) {
    NT_CHECK_AS(ShapeError, c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
                "GPTConfig: expected positive sizes, got vocab_size ", c.vocab_size, ", block_size ", c.block_size,
                ", n_layer ", c.n_layer, ", n_head ", c.n_head, ", n_embd ", c.n_embd);
    NT_CHECK_AS(ShapeError, c.n_embd % c.n_head == 0, "GPTConfig: expected n_embd divisible by n_head, got n_embd ",
                c.n_embd, " and n_head ", c.n_head);
    NT_CHECK_AS(DTypeError, is_floating(c.dtype), "GPTConfig: expected a floating dtype, got ", dtype_name(c.dtype));
    NT_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "GPTConfig: expected norm_eps > 0 and finite, got ",
             c.norm_eps);
    NT_CHECK(c.dropout >= 0 && c.dropout < 1, "GPTConfig: expected dropout in [0, 1), got ", c.dropout);
}

namespace {
NormOptions norm_options(const GPTConfig& c) {
    NormOptions o;
    o.eps = c.norm_eps;
    o.policy = c.policy;
    o.dtype = c.dtype;
    o.device = c.device;
    return o;
}
TensorOptions param_options(const GPTConfig& c) { return TensorOptions().dtype(c.dtype).device(c.device); }
double residual_std(const GPTConfig& c) { return 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)); }
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c) : n_head(c.n_head), attn_dropout(c.dropout) {
    c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, true, param_options(c)));
    c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, true, param_options(c), residual_std(c)));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    Tensor y = causal_self_attention(c_attn->forward(x), n_head, is_training() ? attn_dropout : 0.0);
    return resid_dropout->forward(c_proj->forward(y));
}

MLP::MLP(const GPTConfig& c) : recompute_gelu(c.recompute_gelu) {
    c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, true, param_options(c)));
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, true, param_options(c), residual_std(c)));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

// The hidden layer in one op: on CUDA its bias (and GELU, unless made again) ride in the product's epilogue.
Tensor MLP::forward(const Tensor& x) const {
    ModuleScope scope(*this);
    Tensor hidden;
    {
        ModuleScope c_fc_scope(*c_fc);  // c_fc's weights, in one op with the GELU after it
        hidden = linear_gelu(x, c_fc->weight, c_fc->bias, recompute_gelu);
    }
    return dropout->forward(c_proj->forward(hidden));
}

Block::Block(const GPTConfig& c) {
    ln_1 = register_module("ln_1", make_norm(c.norm, c.n_embd, norm_options(c)));
    attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
    ln_2 = register_module("ln_2", make_norm(c.norm, c.n_embd, norm_options(c)));
    mlp = register_module("mlp", std::make_shared<MLP>(c));
}

Tensor Block::forward(Tensor x) const {
    ModuleScope scope(*this);
    // Reassigning x drops the handle to the old residual: Note [Why saving y saves memory].
    x = add(x, attn->forward(ln_1->forward(x)));
    x = add(x, mlp->forward(ln_2->forward(x)));
    return x;
}

GPT::GPT(const GPTConfig& c) : config_(c) {
    check_config(c);
    wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd, param_options(c)));
    wpe = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd, param_options(c)));
    drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
    for (int64_t i = 0; i < c.n_layer; ++i) h.push_back(register_module("h." + std::to_string(i), std::make_shared<Block>(c)));
    ln_f = register_module("ln_f", make_norm(c.norm, c.n_embd, norm_options(c)));
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, false, param_options(c)));
}

Tensor GPT::forward(const Tensor& idx, bool in_loss) const {
    NT_CHECK(idx.defined(), "GPT: expected idx of shape [B, T] i64, got an undefined tensor");
    NT_CHECK_AS(DTypeError, idx.dtype() == DType::I64, "GPT: expected idx of shape [B, T] i64, got ",
                shape_str(idx.shape()), " ", dtype_name(idx.dtype()));
    NT_CHECK_AS(ShapeError, idx.dim() == 2, "GPT: expected idx of shape [B, T] i64, got ", shape_str(idx.shape()), " ",
                dtype_name(idx.dtype()));
    int64_t T = idx.size(1);
    NT_CHECK_AS(ShapeError, T >= 1 && T <= config_.block_size, "GPT: expected a sequence length in [1, block_size = ",
                config_.block_size, "], got ", T);
    std::optional<SaveOnCpu> offload;  // Note [SaveOnCpu]: over the whole forward, so prefetching crosses layers
    if (config_.offload && !in_loss) offload.emplace();
    ModuleScope scope(*this);
    // The positions 0..T-1 are wpe's first T rows: a view, whose backward saves nothing (an
    // embedding lookup would save T ids, the one saved tensor not linear in B * T).
    Tensor x = drop->forward(add(wte->forward(idx), wpe->weight.narrow(0, 0, T)));
    // Moving the residual into each block leaves the block the only handle, so the block's input
    // is freed as soon as the block's first add has consumed it (Note [Why saving y saves memory]).
    for (const auto& block : h) {
        if (config_.checkpoint_blocks)  // Note [Activation checkpointing]: saves x only
            x = checkpoint([b = block.get()](const Tensor& in) { return b->forward(in); }, x);
        else
            x = block->forward(std::move(x));
    }
    x = ln_f->forward(x);
    return lm_head->forward(x);
}

Tensor GPT::forward(const Tensor& idx) const { return forward(idx, false); }

Tensor GPT::loss(const Tensor& idx, const Tensor& targets) const {
    std::optional<SaveOnCpu> offload;  // the logits too, the largest tensor saved outside the blocks
    if (config_.offload) offload.emplace();
    return cross_entropy(forward(idx, true), targets);
}

void GPT::set_policy(SavePolicy policy) {
    config_.policy = policy;
    set_save_policy(*this, policy);
}

void GPT::set_checkpoint_blocks(bool on) { config_.checkpoint_blocks = on; }
void GPT::set_offload(bool on) { config_.offload = on; }

int64_t num_parameters(const GPTConfig& c) {
    const int64_t C = c.n_embd, V = c.vocab_size;
    const int64_t norm = c.norm == NormKind::Layer ? 2 * C : C;  // weight (+ bias)
    const int64_t block = 2 * norm + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C);
    return V * C + c.block_size * C + c.n_layer * block + norm + V * C;
}

int64_t predicted_saving_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    int64_t norms = 2 * c.n_layer + 1;
    int64_t x_bytes = B * T * c.n_embd * static_cast<int64_t>(element_size(c.dtype));
    int64_t mean_bytes = c.norm == NormKind::Layer ? B * T * static_cast<int64_t>(element_size(stat_dtype(c.dtype))) : 0;
    return norms * (x_bytes + mean_bytes);
}

int64_t predicted_checkpoint_saved_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    const int64_t es = static_cast<int64_t>(element_size(c.dtype));
    const int64_t ss = static_cast<int64_t>(element_size(stat_dtype(c.dtype)));
    const int64_t ids = B * T * static_cast<int64_t>(element_size(DType::I64));
    const int64_t x = B * T * c.n_embd * es;
    const int64_t stats = c.norm == NormKind::Layer && c.policy == SavePolicy::Input ? 2 * B * T * ss : B * T * ss;
    // ln_f saves x (Input), y or x_hat, which lm_head saves too (y, or x_hat through y's recipe);
    // under Input lm_head saves y as well.
    const int64_t ln_f = (c.policy == SavePolicy::Input ? 2 : 1) * x + stats;
    const int64_t loss = B * T * c.vocab_size * es + B * T * ss + ids;  // logits, log-sum-exp, targets
    return c.n_layer * x + ids + ln_f + loss;  // block inputs, wte's ids, ln_f and lm_head, the loss
}

int64_t predicted_gelu_recompute_saving_bytes(const GPTConfig& c, int64_t B, int64_t T) {
    return c.n_layer * 4 * B * T * c.n_embd * static_cast<int64_t>(element_size(c.dtype));
}

}  // namespace normtape
